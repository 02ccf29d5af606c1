"""Which pods a pool has: the :class:`PodSource` interface, and a static one for tests and the demo.

A pod source answers "which pods does pool P in namespace N have right now, what role does
each play, is it in the Service, is it ready, and where is its stats endpoint". The Kubernetes-backed source lives in
:mod:`tidegate.scaler.kube` (it needs the Kubernetes client); this module stays pure.

Errors: a source that cannot answer at all raises :class:`PodSourceError` (the scaler answers
UNAVAILABLE, so KEDA's fallback counts it) -- it never answers "no pods".
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from tidegate.api.constants import ROLE_ACTIVE, ROLE_WARM
from tidegate.scaler.errors import PodSourceError


@dataclass(frozen=True)
class PodInfo:
    """One pod of a pool.

    ``url``: base URL of the sidecar (``http://127.0.0.1:9001``) when known outright (static
    sources); otherwise ``ip`` (pod IP, "" while it has none) and the trigger's ``sidecarPort``
    make it (:meth:`base_url`). ``role``: the ``tidegate.dev/role`` label (``active``, ``warm``,
    ``draining``). ``ready``: the pod's Ready condition. ``serving``: the ``tidegate.dev/serving``
    label is ``"true"`` (the operator sets it on warm pods when ``spec.warmPool.serve``; an active pod
    is in the Service whatever its label says, :attr:`in_service`).
    """

    name: str
    url: str = ""
    role: str = ROLE_ACTIVE
    ready: bool = True
    ip: str = ""
    serving: bool = False

    def base_url(self, port: int) -> str:
        """Where this pod's sidecar answers, or "" when it has no address yet."""
        if self.url:
            return self.url
        if not self.ip:
            return ""
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{port}"

    @property
    def active(self) -> bool:
        return self.role == ROLE_ACTIVE

    @property
    def warm(self) -> bool:
        return self.role == ROLE_WARM

    @property
    def in_service(self) -> bool:
        """The Service sends it requests (once Ready): an active pod, or a warm one labelled serving.
        A draining pod never is, whatever its label: it left the Service to finish what it holds."""
        return self.active or (self.warm and self.serving)

    @property
    def load_counts(self) -> bool:
        """Its stats are read and its load counts (:func:`tidegate.scaler.rates.observe`): every active
        pod, ready or starting, and a pod in the Service once Ready."""
        return self.active or (self.in_service and self.ready)


class PodSource(Protocol):
    """Lists a pool's pods. Implementations: :class:`StaticPodSource`, ``kube.KubernetesPodSource``."""

    async def pods(self, namespace: str, pool: str) -> list[PodInfo]:
        """The pool's pods now; raises :class:`PodSourceError` when it cannot tell."""
        ...

    def forget(self, namespace: str, pool: str) -> None:
        """Stop following the pool (its watch, its cache); a later :meth:`pods` starts again."""
        ...

    async def close(self) -> None:
        """Release watches and connections."""
        ...


class StaticPodSource:
    """A fixed (but settable) list of pods per ``(namespace, pool)``, for tests and the local demo.

    ``StaticPodSource({("default", "small"): [PodInfo("small-0", "http://127.0.0.1:9001")]})``;
    an unknown pool has no pods. Set ``failing = True`` to simulate an unreachable API server.
    """

    def __init__(self, pools: Mapping[tuple[str, str], Iterable[PodInfo]] | None = None) -> None:
        self._pools = {key: list(pods) for key, pods in (pools or {}).items()}
        self.failing = False

    def set(self, namespace: str, pool: str, pods: Iterable[PodInfo]) -> None:
        self._pools[(namespace, pool)] = list(pods)

    async def pods(self, namespace: str, pool: str) -> list[PodInfo]:
        if self.failing:
            raise PodSourceError(f"pod source for {namespace}/{pool} is failing (test switch)")
        return list(self._pools.get((namespace, pool), []))

    def forget(self, namespace: str, pool: str) -> None:
        return None  # the configured pods are the source's own truth, not a cache

    async def close(self) -> None:
        return None
