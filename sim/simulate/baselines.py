"""The baseline policies tidegate is compared with: how pools are commonly run today.

Each baseline routes requests straight to the model servers (no sidecar admission) and sizes the
pool through the same HPA model (:mod:`~.hpa`, the HPA's default ``behavior``) at KEDA's polling cadence. Tunables come from the
scenario's ``baselines`` mapping (defaults below). A baseline has no warm pool: a new replica
needs a node and a model load, as with a plain Deployment. Its headroom is
``headroom_replicas`` (default 0): that many replicas kept serving on top of the HPA's answer
(over-provisioning, as a fixed second Deployment behind the same Service would give). The HPA
sees only its own share (``spec.replicas`` minus the headroom); the metrics cover every serving
pod. It is the baselines' counterpart of tidegate's warm pool in ``tidegate simulate --frontier``.

- :class:`QueueDepth` -- KEDA ``prometheus`` trigger on ``sum(vllm:num_requests_waiting)``,
  ``metricType: AverageValue``, ``threshold`` = ``queue_waiting_target`` (default 5 waiting per
  replica). Routing: the Service (kube-proxy, round robin). Source: KEDA Prometheus scaler docs
  (keda.sh/docs/latest/scalers/prometheus/), the metric from vLLM's ``/metrics``.
- :class:`HttpConcurrency` -- KEDA HTTP add-on: the interceptor counts requests in flight (sent,
  not yet answered) and the HPA targets ``http_concurrency_target`` per replica (default 100, the
  add-on's documented example), ``desired = ceil(concurrency / target)``. The interceptor
  proxies (it holds requests only while there are zero replicas). Source:
  keda.sh/http-add-on/latest/concepts/scaling/ ("The Scaling Formula").
- :class:`GieShedding` -- Gateway API Inference Extension endpoint picker: a pod *has capacity*
  when its waiting queue <= ``gie_queue_threshold`` (5) and KV-cache usage <= ``gie_kv_threshold``
  (0.8) (``pkg/epp/saturationdetector/config.go`` defaults); when no pod has capacity the pool is
  saturated and *sheddable* requests (every class but the first, highest one) are refused with
  429; critical ones are always routed. The pod is picked by the queue and KV-cache scorers with
  equal weights (score ``(1 - waiting / max waiting) + (1 - kv usage)``, highest wins, among
  pods with capacity when any). Scaling: as :class:`QueueDepth`.
- :class:`GpuUtilization` -- HPA on ``DCGM_FI_DEV_GPU_UTIL`` (through prometheus-adapter),
  ``Utilization`` target ``gpu_util_target`` (0.8): ``desired = ceil(N x mean util / target)``.
  Utilisation is the share of 1 s samples in the last 30 s (dcgm-exporter's default collection
  interval) in which the replica had a sequence running: NVML's "a kernel was executing" measure,
  which reads ~100% at any batch size. Source: NVIDIA dcgm-exporter docs; the HPA docs.
"""

import abc
import math
from typing import Any

import numpy as np

from tidegate.sim.simulate import workload
from tidegate.sim.simulate.cluster import Pod
from tidegate.sim.simulate.hpa import DEFAULT_BEHAVIOR, MetricType


class Policy(abc.ABC):
    """Direct routing, no admission; subclasses give the scaling metric (and may route smarter)."""

    name = "base"
    warm_pool = 0
    serve_warm = False
    """Warm replicas in the Service too (tidegate: ``spec.warmPool.serve``)."""
    headroom = 0
    """Replicas kept serving on top of the HPA's answer (:class:`Baseline`: ``headroom_replicas``)."""
    ticks = False

    def setup(self, sim: Any) -> None:
        self._rr = 0
        self.params = sim.scenario.baselines

    def attach(self, sim: Any, pod: Pod) -> None:  # noqa: B027 (an optional hook)
        """``pod`` is ready (model loaded)."""

    def route(self, sim: Any, req: Any) -> Pod | str:
        """The Service: round robin over serving pods; a string is a refusal reason."""
        pods = sim.pool.serving()
        if not pods:
            return "no_endpoints"
        self._rr += 1
        return pods[self._rr % len(pods)]

    def on_arrival(self, sim: Any, req: Any) -> None:
        pod = self.route(sim, req)
        if isinstance(pod, str):
            sim.refuse(req, pod)
        else:
            sim.start(req, pod)

    def on_first_token(self, sim: Any, req: Any, pod: Pod) -> None:  # noqa: B027 (an optional hook)
        """``req`` produced its first token on ``pod`` (``req.first_token_s`` is set)."""

    def on_finish(self, sim: Any, req: Any, pod: Pod) -> None:  # noqa: B027 (an optional hook)
        """``req`` finished on ``pod``."""

    def on_abort(self, sim: Any, req: Any, pod: Pod) -> None:  # noqa: B027 (an optional hook)
        """The client of ``req`` left while it ran on ``pod`` (already aborted there)."""

    def on_cancel(self, sim: Any, req: Any) -> None:  # noqa: B027 (an optional hook)
        """The client of ``req`` left before it reached a model server."""

    def on_pod_lost(self, sim: Any, pod: Pod) -> list[Any]:
        """Requests held in front of a lost ``pod`` (not on its model server)."""
        return []

    def in_flight(self, pod: Pod) -> int:
        return len(pod.running)

    def hpa_current(self, sim: Any) -> int:
        """The HPA's current replicas: the scale subresource's ``spec.replicas`` (``horizontal.go``
        reads ``scale.Spec.Replicas``), not the pods that are ready; the headroom is not the HPA's."""
        return sim.desired - self.headroom

    @abc.abstractmethod
    def metric(self, sim: Any) -> tuple[float, float, MetricType]:
        """``(metric value, target, metric type)`` the HPA computes the desired count from."""

    def hpa_behavior(self, scenario: Any) -> dict[str, Any]:
        """The HPA ``behavior`` of this policy's scale target: the HPA's defaults."""
        return DEFAULT_BEHAVIOR

    def sized_replicas(self, sim: Any) -> int | None:
        """``spec.replicas`` the policy sets itself this poll, bypassing the HPA; ``None`` (every
        real policy): the HPA decides from :meth:`metric`."""
        return None

    def tick(self, sim: Any) -> None:  # noqa: B027 (an optional hook)
        """Periodic upkeep every 0.1 s (only when ``ticks``)."""

    def _waiting(self, sim: Any) -> int:
        total = 0
        for pod in sim.pool.serving():
            sim.sync(pod)
            total += pod.replica.reported_waiting  # the gauge KEDA's Prometheus trigger reads
        return total


class Baseline(Policy):
    """A baseline: reads ``headroom_replicas`` from the scenario's ``baselines`` mapping."""

    def setup(self, sim: Any) -> None:
        super().setup(sim)
        self.headroom = int(self.params.get("headroom_replicas", 0))


class QueueDepth(Baseline):
    name = "queue"

    def metric(self, sim: Any) -> tuple[float, float, MetricType]:
        return float(self._waiting(sim)), float(self.params.get("queue_waiting_target", 5)), MetricType.AVERAGE_VALUE


class HttpConcurrency(Baseline):
    name = "http"

    def metric(self, sim: Any) -> tuple[float, float, MetricType]:
        in_flight = sum(len(p.running) for p in sim.pool.live_pods())
        return float(in_flight), float(self.params.get("http_concurrency_target", 100)), MetricType.AVERAGE_VALUE


class GieShedding(QueueDepth):
    name = "gie"

    def route(self, sim: Any, req: Any) -> Pod | str:
        pods = sim.pool.serving()
        if not pods:
            return "no_endpoints"
        q_max = self.params.get("gie_queue_threshold", 5)
        kv_max = self.params.get("gie_kv_threshold", 0.8)
        for pod in pods:
            sim.sync(pod)
        free = [p for p in pods if p.replica.num_waiting <= q_max and p.replica.kv_usage <= kv_max]
        if not free and req.priority != sim.scenario.classes[0]:
            return "gie_saturated"
        candidates = free or pods
        most = max(p.replica.num_waiting for p in candidates) or 1
        self._rr += 1
        start = self._rr % len(candidates)  # rotate ties
        order = candidates[start:] + candidates[:start]
        return max(order, key=lambda p: (1 - p.replica.num_waiting / most) + (1 - p.replica.kv_usage))


class GpuUtilization(Baseline):
    name = "gpu"

    def metric(self, sim: Any) -> tuple[float, float, MetricType]:
        pods = sim.pool.serving()
        utils = [sum(p.busy_samples[-30:]) / len(p.busy_samples[-30:]) for p in pods if p.busy_samples]
        mean = sum(utils) / len(utils) if utils else 0.0
        return mean, float(self.params.get("gpu_util_target", 0.8)), MetricType.UTILIZATION


class Oracle(GieShedding):
    """Not a product: the **lower bound** a frontier is read against. It knows the scenario's
    expected load ahead of time and sizes ``spec.replicas`` itself, with no HPA in between.

    At every poll ``spec.replicas = max(1, ceil(R / oracle_replica_rate)) + headroom_replicas``,
    where ``R`` is the highest expected arrival rate (requests/s, every stream,
    :func:`~.workload.rate_multiplier`) over ``[now, now + lead]``, and ``lead``
    (``oracle_lead_s``) by default the cold start at two standard deviations (node provisioning
    plus model load): a replica it asks for is serving before the load it was asked for arrives,
    and is removed the poll that load has passed. A negative ``oracle_lead_s`` makes it a perfect
    *reactive* scaler instead: it sizes for the expected load ``-lead`` seconds ago (no foresight,
    no noise, no lag beyond that). ``oracle_replica_rate`` defaults to 4 requests/s a replica;
    ``tidegate simulate --frontier`` sweeps it, so the cheapest point reaching a level is what
    perfect knowledge of the load (not of its noise, nor of faults) and GIE's routing and
    shedding need. It ignores ``minReplicas``.
    """

    name = "oracle"

    def setup(self, sim: Any) -> None:
        super().setup(sim)
        sc = sim.scenario
        cold = sum(max(d.min, d.mean + 2 * d.sd) for d in (sc.cluster.node_provisioning_s, sc.cluster.model_load_s))
        lead = float(self.params.get("oracle_lead_s", cold))
        self._offsets = np.arange(0.0, lead + 5.0, 5.0) if lead >= 0 else np.array([lead])
        self._rate = float(self.params.get("oracle_replica_rate", 4.0))

    def sized_replicas(self, sim: Any) -> int | None:
        t = sim.now + self._offsets
        demand = sum(s.rate_per_s * workload.rate_multiplier(sim.scenario, s, t) for s in sim.scenario.streams)
        needed = max(1, math.ceil(float(np.max(demand)) / self._rate))
        return min(sim.scenario.scaling.max_replicas, needed + self.headroom)

    def metric(self, sim: Any) -> tuple[float, float, MetricType]:
        return 0.0, 1.0, MetricType.AVERAGE_VALUE  # unused: sized_replicas answers every poll
