"""The Prometheus signal source and ``spec.warmPool.serve``: a Ready warm pod in the Service is queried
and its load counts (the active replicas are sized for it); a warm pod out of the Service is not."""

from typing import Any

from tidegate.scaler.pods import PodInfo, StaticPodSource
from tidegate.scaler.prometheus import PrometheusSignals

from .test_forget import target

NOW = 1_800_000_000.0


class Recorder:
    """Answers for pods ``a`` (active), ``w`` (warm, serving) and ``idle`` (warm): each 600 tokens in
    flight of 1000, scraped just now; keeps the queries it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def custom_query(self, promql: str) -> list[dict[str, Any]]:
        self.asked.append(promql)
        if "timestamp(" in promql:
            value = NOW
        elif "token_budget" in promql:
            value = 1000.0
        elif "in_flight_tokens" in promql:
            value = 600.0
        else:
            return []
        return [{"metric": {"pod": pod}, "value": [NOW, str(value)]} for pod in ("a", "w", "idle") if pod in promql]


async def test_a_serving_warm_pods_load_counts_and_an_idle_warm_pod_is_not_read() -> None:
    source = StaticPodSource()
    pods = [PodInfo("a"), PodInfo("w", role="warm", serving=True), PodInfo("idle", role="warm")]
    source.set("ns", "p", pods)
    prom = Recorder()
    signals = PrometheusSignals(source, connect=lambda url: prom, wall=lambda: NOW)
    o = await signals.observe(target("p", source="prometheus", prometheusUrl="http://prom:9090"))
    assert all('pod=~"a|w"' in q for q in prom.asked)
    assert (o.active, o.warm, o.warm_serving, o.fresh, o.in_flight_tokens) == (1, 2, 1, 2, 1200)
    assert o.utilization == 1200 / 1000  # both pods' load over the one active replica's budget


async def test_a_serving_warm_pod_without_fresh_series_is_stale() -> None:
    source = StaticPodSource()
    source.set("ns", "p", [PodInfo("a"), PodInfo("gone", role="warm", serving=True)])
    signals = PrometheusSignals(source, connect=lambda url: Recorder(), wall=lambda: NOW)
    o = await signals.observe(target("p", source="prometheus", prometheusUrl="http://prom:9090"))
    assert o.stale == ("gone",)


class JoinedLate(Recorder):
    """Pods ``a`` and ``b`` spanned the whole 60 s window (5 and 4 samples at a 15 s scrape: the phase
    decides), ``new`` joined 15 s ago (1 sample); each admitted 1 request/s over the window as
    ``rate()`` counts it (``new``: its requests over the whole window)."""

    SAMPLES = {"a": 5.0, "b": 4.0, "new": 1.0}

    def custom_query(self, promql: str) -> list[dict[str, Any]]:
        self.asked.append(promql)
        if "count_over_time(" in promql:
            return [{"metric": {"pod": p}, "value": [NOW, str(v)]} for p, v in self.SAMPLES.items()]
        if 'decision=~"admit|admit_demoted"' in promql:
            return [{"metric": {"pod": p}, "value": [NOW, "1.0"]} for p in ("a", "b")] + [
                {"metric": {"pod": "new"}, "value": [NOW, "0.25"]}
            ]
        if "timestamp(" in promql:
            return [{"metric": {"pod": p}, "value": [NOW, str(NOW)]} for p in self.SAMPLES]
        if "token_budget" in promql:
            return [{"metric": {"pod": p}, "value": [NOW, "1000"]} for p in self.SAMPLES]
        return []


async def test_a_pod_that_joined_within_the_window_counts_as_its_share_of_a_replica() -> None:
    # input: two replicas admitting 1/s each for the whole window, a third that joined a quarter of it ago
    source = StaticPodSource()
    source.set("ns", "p", [PodInfo("a"), PodInfo("b"), PodInfo("new")])
    signals = PrometheusSignals(source, connect=lambda url: JoinedLate(), wall=lambda: NOW)
    o = await signals.observe(target("p", source="prometheus", prometheusUrl="http://prom:9090"))
    # expected: what one replica admits is 2.25/s over 2.25 replicas, not over 3 (a replica diluted by the
    # newcomer would make the law's throughput need, demand / (A / n), a third too high)
    assert (o.reporting, o.admitted_per_s) == (3, 2.25)
    assert o.reporting_share == 2 + 1 / 4
    assert o.admitted_per_s / o.rate_replicas == 1.0
