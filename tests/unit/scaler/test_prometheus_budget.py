"""The Prometheus signal source and a replica still reading its capacity from the model server:
its ``tidegate_admission_token_budget`` is NaN, an unknown budget, never 0 capacity nor a NaN sum."""

from typing import Any

from tidegate.scaler.pods import PodInfo, StaticPodSource
from tidegate.scaler.prometheus import PrometheusSignals

from .test_forget import target

NOW = 1_800_000_000.0


class PoolPrometheus:
    """Answers the source's queries for pods ``a`` (sized: 1000 tokens, 800 in flight) and ``b``
    (pending: NaN budget, nothing in flight), both scraped just now."""

    def custom_query(self, promql: str) -> list[dict[str, Any]]:
        if "timestamp(" in promql:
            values = {"a": NOW, "b": NOW}
        elif "token_budget" in promql:
            values = {"a": 1000.0, "b": "NaN"}
        elif "in_flight_tokens" in promql:
            values = {"a": 800.0, "b": 0.0}
        else:
            return []
        return [{"metric": {"pod": pod}, "value": [NOW, str(v)]} for pod, v in values.items()]


async def test_a_pending_replicas_nan_budget_is_unknown_not_zero() -> None:
    source = StaticPodSource()
    source.set("ns", "p", [PodInfo("a", "http://a"), PodInfo("b", "http://b", ready=False)])
    signals = PrometheusSignals(source, connect=lambda url: PoolPrometheus(), wall=lambda: NOW)
    o = await signals.observe(target("p", source="prometheus", prometheusUrl="http://prom:9090"))
    assert (o.active, o.fresh, o.token_budget) == (2, 1, 1000)
    assert o.utilization == 800 / (2 * 1000)  # b counted as holding what a holds, not 0 nor NaN
