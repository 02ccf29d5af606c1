"""Stands in for KEDA + the HPA for one ScaledObject, where a test needs time compressed.

The real KEDA and HPA controller run on the local cluster and scale the e2e pools of the burst
and noisy-tenant scenarios (:mod:`tests.e2e.harness.hpa_watch`). This stand-in remains for the
scale-down scenario only: there the HPA's scale-down stabilisation (60 s, as the operator
writes it, then one pod a minute) is compressed to seconds, which the real HPA cannot be told; the real KEDA is
paused for that pool (``autoscaling.keda.sh/paused``), so it deletes its HPA and leaves ``/scale``
to this stand-in.

What it does is what KEDA does with an ``external`` trigger (KEDA 2.17, ``pkg/scalers/external_scaler.go``):

1. read the ScaledObject the operator wrote (``keda.sh/v1alpha1``): ``scaleTargetRef``, the
   trigger's ``metadata`` (sent as ``scalerMetadata`` on every call, ``scalerAddress`` included),
   ``pollingInterval``, ``minReplicaCount`` / ``maxReplicaCount`` and
   ``advanced.horizontalPodAutoscalerConfig.behavior``;
2. ``GetMetricSpec`` once (the metric name and its ``AverageValue`` target), as when the HPA is built;
3. every polling interval: ``GetMetrics`` then ``IsActive``; the metric goes through the HPA's
   algorithm (:class:`tidegate.sim.simulate.hpa.Hpa`: desired = ceil(metric / target), no change
   within the 10% tolerance, the behaviour's stabilisation windows and rate policies, min/max;
   ``currentReplicas`` is the scale's ``spec.replicas``), and a changed count is written to the
   target's ``/scale`` subresource, as the HPA controller does.

``scale_down_window_s`` replaces the behaviour's ``scaleDown.stabilizationWindowSeconds`` (the
operator writes 60 s; tests compress it as they compress the polling interval).
``scaler_address``: call this scaler whatever the ScaledObject says, recording any other address
in :attr:`KedaStandIn.foreign_addresses`. On a cluster shared with other test runs, an operator
they started for all namespaces may also reconcile these pools and write its own (fake) scaler's
address; the launcher's scaler is the one under test. ``poll_interval_s`` may be set below the ScaledObject's (tests compress time). ``IsActive`` only
decides 0 <-> 1 in KEDA; the e2e pools keep ``minReplicas`` >= 1, so it is called and recorded but
not acted on. A failed call keeps the current count (KEDA counts it toward ``fallback``).
"""

import copy
import dataclasses
import logging
import threading
import time

import grpc
import kubernetes

from tidegate.api import GROUP, PLURAL, VERSION
from tidegate.scaler.proto import externalscaler_pb2 as pb
from tidegate.scaler.proto import externalscaler_pb2_grpc as pb_grpc
from tidegate.sim.simulate.hpa import Hpa, MetricType

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ScaleWrite:
    """One write of the target's ``/scale`` (``t_s``: monotonic seconds)."""

    t_s: float
    before: int
    after: int


@dataclasses.dataclass(frozen=True)
class Poll:
    """One polling interval: the metric KEDA read and IsActive's answer."""

    t_s: float
    metric: float
    active: bool
    current: int
    desired: int


class KedaStandIn:
    """KEDA + HPA for the ScaledObject ``name`` in ``namespace``; :meth:`start` runs it in a thread."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        namespace: str,
        name: str,
        poll_interval_s: float | None = None,
        call_timeout_s: float = 5.0,
        scaler_address: str | None = None,
        scale_down_window_s: float | None = None,
    ) -> None:
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.name = name
        self.poll_interval_override_s = poll_interval_s
        self.call_timeout_s = call_timeout_s
        self.scaler_address = scaler_address
        self.scale_down_window_s = scale_down_window_s
        self.foreign_addresses: set[str] = set()  # scalerAddress values other than scaler_address
        self.writes: list[ScaleWrite] = []
        self.polls: list[Poll] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"keda-{name}", daemon=True)
        self._channel: grpc.Channel | None = None

    # ---- the ScaledObject ------------------------------------------------------------------------

    def scaled_object(self) -> dict:
        return self.custom.get_namespaced_custom_object(
            "keda.sh", "v1alpha1", self.namespace, "scaledobjects", self.name
        )

    def spec_replicas(self) -> int:
        scale = self.custom.get_namespaced_custom_object_scale(GROUP, VERSION, self.namespace, PLURAL, self._target)
        return int(scale["spec"].get("replicas") or 0)

    def _write_scale(self, replicas: int) -> None:
        self.custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, self.namespace, PLURAL, self._target, {"spec": {"replicas": replicas}}
        )

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Read the ScaledObject and call GetMetricSpec (errors raise here), then poll in a thread."""
        so = self.scaled_object()["spec"]
        ref = so["scaleTargetRef"]
        if ref.get("kind") != "InferencePool":
            raise ValueError(f"ScaledObject {self.name} targets {ref}, not an InferencePool")
        self._target = ref["name"]
        trigger = next(t for t in so["triggers"] if t["type"] == "external")
        if trigger.get("metricType", "AverageValue") != "AverageValue":
            raise ValueError(f"metricType {trigger['metricType']!r}: this stand-in plays AverageValue only")
        metadata = {k: str(v) for k, v in trigger["metadata"].items()}
        self.interval_s = self.poll_interval_override_s or float(so.get("pollingInterval", 30))
        behavior = copy.deepcopy(so.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior") or {})
        if self.scale_down_window_s is not None:
            behavior.setdefault("scaleDown", {})["stabilizationWindowSeconds"] = self.scale_down_window_s
        self.hpa = Hpa(min_replicas=int(so.get("minReplicaCount", 0)), max_replicas=int(so.get("maxReplicaCount", 100)),
                       behavior=behavior)  # fmt: skip
        self.ref = pb.ScaledObjectRef(name=self.name, namespace=self.namespace, scalerMetadata=metadata)
        if self.scaler_address and metadata["scalerAddress"] != self.scaler_address:
            self.foreign_addresses.add(metadata["scalerAddress"])
        self._channel = grpc.insecure_channel(self.scaler_address or metadata["scalerAddress"])
        self.stub = pb_grpc.ExternalScalerStub(self._channel)
        spec = self.stub.GetMetricSpec(self.ref, timeout=self.call_timeout_s).metricSpecs[0]
        self.metric_name = spec.metricName
        self.target = spec.targetSizeFloat or float(spec.targetSize)
        self.hpa.seed(time.monotonic(), self.spec_replicas())
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.call_timeout_s * 2 + 5)
        if self._channel is not None:
            self._channel.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
                log.warning("keda stand-in %s: %s", self.name, exc)

    # ---- one polling interval --------------------------------------------------------------------

    def poll(self) -> None:
        """GetMetrics, IsActive, the HPA sync; writes ``/scale`` when the count moves."""
        request = pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName=self.metric_name)
        try:
            answer = self.stub.GetMetrics(request, timeout=self.call_timeout_s)
            active = self.stub.IsActive(self.ref, timeout=self.call_timeout_s).result
        except grpc.RpcError as exc:
            self.failures.append(f"{exc.code()}: {exc.details()}")
            return
        value = answer.metricValues[0]
        metric = value.metricValueFloat if value.metricValueFloat > 0 else float(value.metricValue)
        now = time.monotonic()
        current = self.spec_replicas()
        desired = self.hpa.sync(now, metric, self.target, MetricType.AVERAGE_VALUE, current)
        self.polls.append(Poll(now, metric, active, current, desired))
        if desired != current:
            sent = time.monotonic()
            self._write_scale(desired)
            self.writes.append(ScaleWrite(sent, current, desired))
            log.info("keda stand-in %s: /scale %d -> %d (metric %.2f)", self.name, current, desired, metric)
