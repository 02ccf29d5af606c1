"""kopf handlers: thin glue from watch events to :func:`tidegate.operator.reconcile.reconcile`.

Triggers: the pool's create/update/resume, a periodic resync timer, and events of the pool's
pods and children (so a hand edit or a deleted child is repaired at once, not at the next
resync), its ScaledObject included (KEDA's status: KedaReady) and its NodePool (Karpenter's
status: NodePoolReady). One lock per pool serialises reconciles of the same pool across those triggers.

Run: ``tidegate operator`` or ``kopf run -m tidegate.operator.handlers --all-namespaces``.
Peering: run one replica (Deployment strategy ``Recreate``) with ``--standalone``; kopf
peering freezes replicas of equal priority, and one reconciler per pool is what we want.
"""

import datetime
import fnmatch
import logging
import threading
from collections import defaultdict
from typing import Any

import kopf
import kubernetes
import prometheus_client
import pydantic

from tidegate.api import GROUP, PLURAL, VERSION, constants
from tidegate.operator import logs, names
from tidegate.operator.kube import Kube, api_message
from tidegate.operator.metrics import PoolConditions
from tidegate.operator.probe import ScalerProbe, tls_credentials
from tidegate.operator.reconcile import reconcile
from tidegate.operator.settings import OperatorSettings

log = logging.getLogger("tidegate.operator")


class _State:
    settings: OperatorSettings
    kube: Kube
    probe: ScalerProbe
    locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
    namespaces: tuple[str, ...] = ()  # --namespace patterns (kopf globs); empty: every namespace
    dirty: set[tuple[str, str]] = set()


STATE = _State()
METRICS = PoolConditions()


@kopf.on.startup()
def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    STATE.settings = OperatorSettings.from_env()
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    STATE.kube = Kube(kubernetes.client.ApiClient(), STATE.settings.field_manager)
    config = STATE.settings
    credentials = (
        tls_credentials(config.scaler_ca_file, config.scaler_client_cert_file, config.scaler_client_key_file)
        if config.scaler_tls
        else None
    )
    STATE.probe = ScalerProbe(ttl_s=config.scaler_probe_ttl_seconds, credentials=credentials)
    # Progress and diff-base in annotations only: status belongs to tidegate's own fields.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = names.FINALIZER
    # A dead watch must be noticed: the server closes after 5 min, the client gives up after 6,
    # and a stream silent for 10 min is restarted.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 360
    settings.watching.inactivity_timeout = 600
    settings.posting.level = logging.WARNING
    # A pool deleted while its resync timer runs (a reconcile takes seconds on a busy API server)
    # waits for the timer to exit; kopf checks again only every 60 s by default, so the pool and
    # its finalizer stayed a minute longer than the cleanup took.
    settings.background.cancellation_polling = 5
    if config.metrics_port:
        prometheus_client.start_http_server(config.metrics_port, registry=METRICS.registry)
    log.info("tidegate operator starting: %s", STATE.settings)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _kick(namespace: str, name: str) -> None:
    """Reconcile a pool now, coalescing triggers: while a reconcile of the pool runs, further
    triggers only mark it dirty and the running one goes round once more. A burst of pod
    events therefore costs one or two reconciles, and a /scale write never queues behind them.

    Raises ``kopf.PermanentError`` for a spec the models refuse and ``kopf.TemporaryError`` on
    API errors (kopf retries pool handlers; the resync timer covers event handlers).
    """
    key = (namespace, name)
    STATE.dirty.add(key)
    while key in STATE.dirty:
        lock = STATE.locks[key]
        if not lock.acquire(blocking=False):
            return  # the holder sees the dirty mark and reconciles again
        try:
            while key in STATE.dirty:
                STATE.dirty.discard(key)
                obj = STATE.kube.get_pool(namespace, name)
                if obj is None or obj["metadata"].get("deletionTimestamp"):
                    METRICS.forget(namespace, name)
                    return
                _reconcile_once(obj)
        finally:
            lock.release()


def _reconcile_once(obj: dict[str, Any]) -> None:
    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
    pool_log = logs.for_pool(log, *key)
    # Errors name the pool: kopf logs them against the object whose handler ran, a pod or a child
    # for the event handlers.
    where = f"InferencePool {key[0]}/{key[1]}"
    try:
        result = reconcile(STATE.kube, STATE.settings, obj, STATE.probe)
    except pydantic.ValidationError as exc:
        # The API server accepted it (pass-through fields it cannot check); say why in the status.
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())[:1000]
        invalid = {"type": "Degraded", "status": "True", "reason": "InvalidSpec", "message": message,
                   "lastTransitionTime": _now(), "observedGeneration": obj["metadata"].get("generation", 0)}  # fmt: skip
        STATE.kube.patch_pool_status(key[0], key[1], {"conditions": [invalid]})
        METRICS.observe(*key, [invalid])
        raise kopf.PermanentError(f"{where}: spec refused: {message}") from exc
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            METRICS.forget(*key)
            return  # the pool went away mid-reconcile
        raise kopf.TemporaryError(
            f"{where}: Kubernetes API {exc.status} {exc.reason}: {api_message(exc)}", delay=5
        ) from exc
    METRICS.observe(*key, result.status["conditions"])
    for message in result.events:
        pool_log.info("%s", message)
    if result.requeue_after_s is not None:
        timer = threading.Timer(result.requeue_after_s, _kick, args=key)
        timer.daemon = True
        timer.start()


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@kopf.on.resume(GROUP, VERSION, PLURAL)
def pool_changed(name: str, namespace: str, **_: Any) -> None:
    _kick(namespace, name)


# Decorators are evaluated at import, so the resync period is read from the environment here.
_RESYNC_S = OperatorSettings.from_env().resync_seconds


@kopf.timer(GROUP, VERSION, PLURAL, interval=_RESYNC_S, initial_delay=min(5.0, _RESYNC_S), sharp=False)
def resync(name: str, namespace: str, **_: Any) -> None:
    _kick(namespace, name)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def pool_deleted(body: kopf.Body, **_: Any) -> None:
    """Delete the cluster-scoped NodePool; namespaced children go with their ownerReferences."""
    pool_name = body["metadata"]["name"]
    ns = body["metadata"]["namespace"]
    METRICS.forget(ns, pool_name)
    kube = STATE.kube
    if kube.has_api("karpenter.sh/v1", "NodePool"):
        # by name, not through the model: a pool stored before a validation this version has must
        # still lose its NodePool and its finalizer
        np_name = names.node_pool_name_of(ns, pool_name)
        # After any reconcile in flight (it read the pool before its deletion and would apply the
        # NodePool again, left with no pool to delete it: seen when a namespace was deleted); the
        # next one reads the deletionTimestamp and stops. Never another pool's NodePool of that name.
        with STATE.locks[(ns, pool_name)]:
            owned = names.owned_by(ns, pool_name, kube.get("karpenter.sh/v1", "NodePool", np_name))
            if owned and kube.delete("karpenter.sh/v1", "NodePool", np_name):
                logs.for_pool(log, ns, pool_name).info("deleted NodePool %s", np_name)


@kopf.on.event("", "v1", "pods", labels={constants.LABEL_POOL: kopf.PRESENT})
def pod_event(meta: kopf.Meta, namespace: str, **_: Any) -> None:
    _kick(namespace, meta["labels"][constants.LABEL_POOL])


@kopf.on.event("keda.sh", "v1alpha1", "scaledobjects", labels={"app.kubernetes.io/managed-by": "tidegate"})
@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": "tidegate"})
@kopf.on.event("", "v1", "services", labels={"app.kubernetes.io/managed-by": "tidegate"})
@kopf.on.event("", "v1", "configmaps", labels={"app.kubernetes.io/managed-by": "tidegate"})
def child_event(meta: kopf.Meta, namespace: str, **_: Any) -> None:
    _kick(namespace, meta["labels"][constants.LABEL_POOL])


@kopf.on.event(
    "karpenter.sh",
    "v1",
    "nodepools",
    labels={"app.kubernetes.io/managed-by": "tidegate", names.LABEL_NAMESPACE: kopf.PRESENT},
)
def node_pool_event(meta: kopf.Meta, **_: Any) -> None:
    """Karpenter wrote the pool's NodePool (its status: Ready, NodeClassReady, nodes): NodePoolReady
    follows at once, not at the next resync. Cluster-scoped: its labels name the pool's namespace,
    and kopf watches cluster-scoped resources in every namespace whatever ``--namespace`` says, so
    a pool outside the operator's namespaces is left to the operator that serves it."""
    labels = meta["labels"]
    if watched(labels[names.LABEL_NAMESPACE], STATE.namespaces):
        _kick(labels[names.LABEL_NAMESPACE], labels[constants.LABEL_POOL])


def watched(namespace: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``namespace`` is one the operator serves: every one when ``patterns`` is empty, else
    one matching a ``--namespace`` glob (kopf's own patterns; its ``!`` exclusions are not read)."""
    return not patterns or any(fnmatch.fnmatchcase(namespace, p) for p in patterns if not p.startswith("!"))
