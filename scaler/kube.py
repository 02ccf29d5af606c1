"""Pod source backed by the Kubernetes API: pods labelled ``tidegate.dev/pool=<pool>``, kept by a watch.

The first call for a pool lists its pods and starts a watch (one daemon thread per pool, the
synchronous ``kubernetes`` client); later calls read the cache, so a scrape never waits on the
API server. :meth:`KubernetesPodSource.forget` stops a pool's watch (the scaler calls it for pools
KEDA no longer asks about), so threads and caches follow the pools in use. The watch re-lists every ``watch_timeout_s`` (and after any error, with back-off),
which also repairs a missed event or an expired resourceVersion (410 Gone).

A pod counts when it is not terminating and not finished. Its role comes from the
``tidegate.dev/role`` label, whether the Service sends it requests from ``tidegate.dev/serving``
(``"true"``; a warm pod of a pool with ``spec.warmPool.serve``), readiness from its ``Ready`` condition, the address from ``status.podIP``.

Errors: :class:`~tidegate.scaler.errors.PodSourceError` when the pool's pods were never listed,
or when the cache is older than ``max_cache_age_s`` and the API still fails (the gRPC edge answers
UNAVAILABLE; KEDA's fallback takes over). RBAC needed: ``get``/``list``/``watch`` on ``pods``.
"""

import asyncio
import logging
import threading
import time
from typing import Any

from kubernetes import client, config, watch

from tidegate.api.constants import LABEL_POOL, LABEL_ROLE, LABEL_SERVING, ROLE_ACTIVE
from tidegate.scaler.errors import PodSourceError
from tidegate.scaler.pods import PodInfo

log = logging.getLogger("tidegate.scaler.kube")


def pod_info(pod: Any) -> PodInfo | None:
    """The :class:`PodInfo` of a ``V1Pod``, or None for a pod that no longer counts (terminating, finished)."""
    meta, status = pod.metadata, pod.status
    if meta.deletion_timestamp is not None or (status and status.phase in ("Succeeded", "Failed")):
        return None
    conditions = (status.conditions if status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    labels = meta.labels or {}
    return PodInfo(
        name=meta.name,
        role=labels.get(LABEL_ROLE, ROLE_ACTIVE),
        ready=ready,
        ip=(status.pod_ip if status else None) or "",
        serving=labels.get(LABEL_SERVING) == "true",
    )


class _PoolWatch:
    def __init__(self, api: client.CoreV1Api, namespace: str, pool: str, watch_timeout_s: int) -> None:
        self.api, self.namespace, self.selector = api, namespace, f"{LABEL_POOL}={pool}"
        self.watch_timeout_s = watch_timeout_s
        self.synced = threading.Event()
        self.error: Exception | None = None
        self.last_ok_s = float("-inf")
        self._pods: dict[str, PodInfo] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"tidegate-pods-{namespace}-{pool}", daemon=True)
        self._thread.start()

    def pods(self) -> list[PodInfo]:
        with self._lock:
            return sorted(self._pods.values(), key=lambda p: p.name)

    def _apply(self, kind: str, obj: Any) -> None:
        info = pod_info(obj)
        with self._lock:
            if kind == "DELETED" or info is None:
                self._pods.pop(obj.metadata.name, None)
            else:
                self._pods[info.name] = info
        self.last_ok_s = time.monotonic()

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                listed = self.api.list_namespaced_pod(self.namespace, label_selector=self.selector, _request_timeout=30)
                fresh = {i.name: i for i in map(pod_info, listed.items) if i is not None}
                with self._lock:
                    self._pods = fresh
                self.error, self.last_ok_s, backoff = None, time.monotonic(), 1.0
                self.synced.set()
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    self.api.list_namespaced_pod,
                    self.namespace,
                    label_selector=self.selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=self.watch_timeout_s,
                    _request_timeout=self.watch_timeout_s + 10,
                ):
                    if self._stop.is_set():
                        break
                    if event["type"] == "ERROR":
                        break  # e.g. 410 Gone: list again
                    self._apply(event["type"], event["object"])
            except Exception as exc:  # the API server is down, forbidden, ...: keep the cache, retry
                self.error = exc
                self.synced.set()
                log.warning(
                    "listing pods %s in %s failed: %s (retry in %.0f s)", self.selector, self.namespace, exc, backoff
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()


class KubernetesPodSource:
    """A :class:`~tidegate.scaler.pods.PodSource` over the Kubernetes API (in-cluster config, else kubeconfig)."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        api: client.CoreV1Api | None = None,
        watch_timeout_s: int = 60,
        first_list_timeout_s: float = 10.0,
        max_cache_age_s: float = 120.0,
    ) -> None:
        if api is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config(config_file=kubeconfig)
            api = client.CoreV1Api()
        self.api = api
        self.watch_timeout_s = watch_timeout_s
        self.first_list_timeout_s = first_list_timeout_s
        self.max_cache_age_s = max_cache_age_s
        self._watches: dict[tuple[str, str], _PoolWatch] = {}

    async def pods(self, namespace: str, pool: str) -> list[PodInfo]:
        w = self._watches.get((namespace, pool))
        if w is None:
            w = self._watches[(namespace, pool)] = _PoolWatch(self.api, namespace, pool, self.watch_timeout_s)
        if not w.synced.is_set():
            await asyncio.to_thread(w.synced.wait, self.first_list_timeout_s)
        age = time.monotonic() - w.last_ok_s
        if w.error is not None and age > self.max_cache_age_s:
            raise PodSourceError(f"cannot list pods of {namespace}/{pool}: {w.error}")
        if not w.synced.is_set():
            raise PodSourceError(f"listing pods of {namespace}/{pool} took over {self.first_list_timeout_s:.0f} s")
        return w.pods()

    def forget(self, namespace: str, pool: str) -> None:
        """Stop the pool's watch thread and drop its cache (a later :meth:`pods` lists again)."""
        w = self._watches.pop((namespace, pool), None)
        if w is not None:
            w.stop()

    @property
    def watches(self) -> int:
        """Pools watched now."""
        return len(self._watches)

    async def close(self) -> None:
        for w in self._watches.values():
            w.stop()
        self._watches.clear()
