"""Watches what the real KEDA and the real HPA controller do to one pool (they run on the cluster).

The e2e pools that scale through the real systems leave their ScaledObject unpaused: KEDA v2.21.0
(e2e/cluster/cluster.sh) builds the HPA ``keda-hpa-<pool>`` from it, kube-controller-manager's HPA
controller reads ``external.metrics.k8s.io`` from KEDA's metrics API server every sync period
(``--horizontal-pod-autoscaler-sync-period``, 5 s in cluster.sh), KEDA asks the launcher's
``tidegate scaler`` over gRPC, and the HPA writes the pool's ``/scale`` with its real tolerance
(10%), stabilisation windows and rate policies. Nothing here acts: :class:`HpaWatch` only records

- each change of the pool's ``spec.replicas`` (:class:`ScaleWrite`, seen within ``poll_s``);
- each new decision of the scaler (``GET /decisions/<ns>/<pool>`` on its side port), which is
  made when KEDA calls ``GetMetrics``: so they also show that KEDA kept asking;
- the HPA's ``desiredReplicas`` at each poll.
"""

import dataclasses
import datetime
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import kubernetes

from tests.cluster.conftest import wait_for
from tidegate.api import GROUP, PLURAL, VERSION


@dataclasses.dataclass(frozen=True)
class ScaleWrite:
    """A change of ``spec.replicas`` (``t_s`` monotonic, ``wall_s`` epoch seconds, when seen)."""

    t_s: float
    wall_s: float
    before: int
    after: int


@dataclasses.dataclass(frozen=True)
class Decision:
    """A decision of the scaler as its side port reported it (``t_s``: monotonic, when first seen;
    ``made_wall_s``: epoch seconds when the scaler made it, whole seconds as the side port gives it)."""

    t_s: float
    desired: int
    metric: float
    text: str
    made_wall_s: float


class HpaWatch:
    """Records the real HPA's work on pool ``name``; :meth:`start` waits until the HPA reads the scaler."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        namespace: str,
        name: str,
        decisions_url: str,
        poll_s: float = 0.25,
    ) -> None:
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.autoscaling = kubernetes.client.AutoscalingV2Api(api_client)
        self.namespace, self.name = namespace, name
        self.decisions_url = f"{decisions_url.rstrip('/')}/decisions/{namespace}/{name}"
        self.poll_s = poll_s
        self.writes: list[ScaleWrite] = []
        self.decisions: list[Decision] = []
        self.hpa_desired: list[tuple[float, int | None]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hpa-watch-{name}", daemon=True)

    @property
    def hpa_name(self) -> str:
        return f"keda-hpa-{self.name}"

    def replicas(self) -> int:
        return int(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)["spec"]["replicas"])  # fmt: skip

    def hpa(self) -> Any:
        return self.autoscaling.read_namespaced_horizontal_pod_autoscaler(self.hpa_name, self.namespace)

    def _hpa_reads_the_metric(self) -> bool:
        try:
            hpa = self.hpa()
        except kubernetes.client.ApiException:
            return False
        conditions = {c.type: c.status for c in hpa.status.conditions or []}
        return conditions.get("ScalingActive") == "True" and bool(hpa.status.current_metrics)

    def start(self, timeout_s: float = 120) -> "HpaWatch":
        """Wait until KEDA has built the HPA and the HPA has read the external metric once, then record."""
        wait_for(
            self._hpa_reads_the_metric,
            timeout_s=timeout_s,
            interval_s=0.5,
            what=f"{self.hpa_name} built by KEDA and reading the scaler's metric (ScalingActive)",
        )
        self._last = self.replicas()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _decision(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.decisions_url, timeout=1) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return None

    def _run(self) -> None:
        last_decision: tuple[Any, ...] | None = None
        next_slow = 0.0
        while not self._stop.wait(self.poll_s):
            try:
                now = time.monotonic()
                replicas = self.replicas()
                if replicas != self._last:
                    self.writes.append(ScaleWrite(now, time.time(), self._last, replicas))
                    self._last = replicas
                if now >= next_slow:  # the side port and the HPA once a second
                    next_slow = now + 1.0
                    d = self._decision()
                    key = d and (d.get("time"), d.get("desired"), d.get("metricValue"), d.get("text"))
                    if d and key != last_decision:
                        last_decision = key
                        self.decisions.append(
                            Decision(
                                now,
                                int(d["desired"]),
                                float(d.get("metricValue") or 0),
                                d["text"],
                                datetime.datetime.fromisoformat(d["time"]).timestamp(),
                            )
                        )
                    self.hpa_desired.append((now, self.hpa().status.desired_replicas))
            except Exception as exc:  # recorded; a test that needs the data fails on its absence
                self.errors.append(f"{type(exc).__name__}: {exc}")
