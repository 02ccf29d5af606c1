"""The operator's thin I/O shell over the Kubernetes API (kubernetes client, synchronous).

Children are written with server-side apply under one field manager and ``force`` on
conflicts: tidegate owns the fields it sets, so a hand edit of one of them is put back at the
next reconcile, while fields tidegate never sets (another controller's annotations, say) are
left alone. Errors surface as ``kubernetes.client.ApiException``; the handlers translate them.
A write the API server refuses (400, 403, 422: a name or value it will never take, a webhook or
RBAC saying no; a 500 of server-side apply that cannot fit the object to its schema) is :class:`Refused`, a subclass carrying the object and the server's own message.
"""

import collections
import datetime
import functools
import json
import logging
from typing import Any

import kubernetes
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

from tidegate.api import constants

log = logging.getLogger(__name__)


def api_message(exc: kubernetes.client.ApiException) -> str:
    """The API server's own words in ``exc`` (the ``message`` of its Status body), else status and reason."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return message or f"{exc.status} {exc.reason}"


class Refused(kubernetes.client.ApiException):
    """The API server refused to write ``kind``/``name``: the same write will not succeed later."""

    REFUSING = (400, 403, 422)  # bad request, forbidden (RBAC, webhooks), invalid
    # A 500 that is no server fault: server-side apply could not fit the object to its schema (e.g. a
    # repeated item of a list-type set in Karpenter's NodePool, k8s.io/apimachinery managedfields);
    # the same object will never apply.
    UNFIT = "failed to create typed patch object"

    @classmethod
    def refuses(cls, exc: kubernetes.client.ApiException) -> bool:
        """Whether ``exc`` says the same write will never succeed."""
        return exc.status in cls.REFUSING or (exc.status == 500 and cls.UNFIT in api_message(exc))

    def __init__(self, kind: str, name: str, exc: kubernetes.client.ApiException) -> None:
        super().__init__(status=exc.status, reason=exc.reason)
        self.body, self.headers = exc.body, exc.headers
        self.kind, self.name, self.message = kind, name, api_message(exc)

    def __str__(self) -> str:
        return f"the API server refused {self.kind} {self.name} ({self.status} {self.reason}): {self.message}"


class Kube:
    """Kubernetes calls the reconciler needs, over one ``ApiClient``."""

    def __init__(self, api_client: kubernetes.client.ApiClient, field_manager: str) -> None:
        self.api_client = api_client
        self.field_manager = field_manager
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.autoscaling = kubernetes.client.AutoscalingV2Api(api_client)
        self.dynamic = DynamicClient(api_client)
        # (namespace, pool, uid, type, reason, message) -> (Event name, count), most recent last
        self._events: collections.OrderedDict[tuple[str, ...], tuple[str, int]] = collections.OrderedDict()
        self._events_unlisted: set[str] = set()  # NodePools whose Events the operator may not list (logged once)

    @functools.lru_cache(maxsize=32)  # noqa: B019 - one Kube per process; API resources do not change kind
    def _resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def has_api(self, api_version: str, kind: str) -> bool:
        """Whether the server serves ``kind`` in ``api_version`` (e.g. KEDA or Karpenter CRDs installed)."""
        try:
            self.dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            self.dynamic.invalidate_cache()
            return False
        return True

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply ``manifest`` as this operator's field manager; returns the live object.

        Raises :class:`Refused` when the API server refuses the object, ``ApiException`` otherwise.
        """
        resource = self._resource(manifest["apiVersion"], manifest["kind"])
        meta = manifest["metadata"]
        try:
            result = resource.server_side_apply(
                body=manifest,
                name=meta["name"],
                namespace=meta.get("namespace"),
                field_manager=self.field_manager,
                force_conflicts=True,
            )
        except kubernetes.client.ApiException as exc:
            if Refused.refuses(exc):
                raise Refused(manifest["kind"], meta["name"], exc) from exc
            raise
        return result.to_dict()

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        """Delete an object; returns False when it was already gone."""
        try:
            self._resource(api_version, kind).delete(name=name, namespace=namespace)
        except NotFoundError:
            return False
        return True

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None

    def pool_pods(self, namespace: str, pool: str) -> list[kubernetes.client.V1Pod]:
        """Pods labelled ``tidegate.dev/pool=<pool>`` in ``namespace``."""
        return self.core.list_namespaced_pod(namespace, label_selector=f"{constants.LABEL_POOL}={pool}").items

    def patch_pod(
        self, namespace: str, name: str, labels: dict[str, str | None], annotations: dict[str, str | None]
    ) -> None:
        """Merge-patch a pod's labels and annotations (None deletes a key)."""
        self.core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": labels, "annotations": annotations}})

    def patch_pool_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name, {"status": status}
        )

    def get_pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pod_events(self, namespace: str, reason: str, source: str) -> list[kubernetes.client.CoreV1Event]:
        """Events on pods in ``namespace`` with ``reason`` posted by component ``source`` (e.g. Karpenter's
        ``FailedScheduling``)."""
        selector = f"involvedObject.kind=Pod,reason={reason},source={source}"
        return self.core.list_namespaced_event(namespace, field_selector=selector).items

    def node_pool_events(self, name: str, reason: str) -> list[kubernetes.client.CoreV1Event]:
        """Events with ``reason`` on the cluster-scoped NodePool ``name``: client-go files the Events of
        a cluster-scoped object in namespace ``default`` (``tools/record/event.go``, ``makeEvent``).

        Not allowed to list them (RBAC narrower than the chart's ClusterRole): logged as a warning (once per
        NodePool) and read as none, so the pool still says what the pods' Events say."""
        selector = f"involvedObject.kind=NodePool,involvedObject.name={name},reason={reason}"
        try:
            return self.core.list_namespaced_event("default", field_selector=selector).items
        except kubernetes.client.ApiException as exc:
            if exc.status != 403:
                raise
            if name in self._events_unlisted:
                return []
            self._events_unlisted.add(name)
            log.warning(
                "cannot list Events in namespace default (%s): Karpenter's word on NodePool %s unread", exc.reason, name
            )
            return []

    EVENTS_REMEMBERED = 4096
    """Repeats of this many distinct Events are folded into one (client-go's event cache holds as many)."""

    def event(self, pool: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        """Post an Event on the pool (``kubectl describe`` shows it).

        A repeat of an Event this process posted (same pool, type, reason and message) raises that
        Event's ``count`` and ``lastTimestamp`` instead of adding another ("x12 over 1m" in
        ``kubectl describe``), as client-go's EventCorrelator does
        (k8s.io/client-go/tools/record/events_cache.go); once the API server has expired it (an hour by
        default) the next repeat posts a new one. An Event lost is logged, never a failed reconcile; one
        refused because the pool's namespace is being deleted is not worth a warning.
        """
        meta = pool["metadata"]
        namespace, kind = meta["namespace"], "Warning" if warning else "Normal"
        message = message[:1024]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        key = (namespace, meta["name"], str(meta.get("uid")), kind, reason, message)
        try:
            if (seen := self._events.get(key)) is not None:
                name, count = seen
                try:
                    self.core.patch_namespaced_event(name, namespace, {"count": count + 1, "lastTimestamp": now})
                except kubernetes.client.ApiException as exc:
                    if exc.status != 404:
                        raise
                else:
                    self._remember(key, name, count + 1)
                    return
            body = {
                "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
                "involvedObject": {
                    "apiVersion": constants.API_VERSION,
                    "kind": constants.KIND,
                    "name": meta["name"],
                    "namespace": namespace,
                    "uid": meta.get("uid"),
                },
                "reason": reason,
                "message": message,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
                "type": kind,
                "source": {"component": "tidegate-operator"},
            }
            created = self.core.create_namespaced_event(namespace, body)
            self._remember(key, created.metadata.name, 1)
        except kubernetes.client.ApiException as exc:
            terminating = exc.status == 403 and "being terminated" in api_message(exc)
            (log.debug if terminating else log.warning)(
                "could not post event %s on %s/%s: %s", reason, namespace, meta["name"], api_message(exc)
            )

    def _remember(self, key: tuple[str, ...], name: str, count: int) -> None:
        self._events[key] = (name, count)
        self._events.move_to_end(key)
        while len(self._events) > self.EVENTS_REMEMBERED:
            self._events.popitem(last=False)
