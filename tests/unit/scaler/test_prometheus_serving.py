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
    """Pods ``a`` and ``b`` started long ago, ``new`` 15 s ago (a quarter of the 60 s window); each admitted
    1 request/s since it started, as ``rate()`` counts it over the window (``new``: 15 requests / 60 s)."""

    STARTED = {"a": NOW - 3600, "b": NOW - 7200, "new": NOW - 15}

    def custom_query(self, promql: str) -> list[dict[str, Any]]:
        self.asked.append(promql)
        if "started_at_seconds" in promql:
            return [{"metric": {"pod": p}, "value": [NOW, str(v)]} for p, v in self.STARTED.items()]
        if 'decision=~"admit|admit_demoted"' in promql:
            return [
                {"metric": {"pod": p}, "value": [NOW, str(min(1.0, (NOW - t) / 60))]} for p, t in self.STARTED.items()
            ]
        if "timestamp(" in promql:
            return [{"metric": {"pod": p}, "value": [NOW, str(NOW)]} for p in self.STARTED]
        if "token_budget" in promql:
            return [{"metric": {"pod": p}, "value": [NOW, "1000"]} for p in self.STARTED]
        return []


class AllYoung(JoinedLate):
    """A pool whose three pods all started 15 s ago (a new pool, a full rollout): each its quarter."""

    STARTED = {"a": NOW - 15, "b": NOW - 15, "new": NOW - 15}


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


async def test_a_pool_whose_pods_all_joined_within_the_window_reads_what_one_replica_admits() -> None:
    """Found against a real Prometheus: shares relative to the pod with the most samples counted a
    pool that was all young as whole replicas while ``rate()`` divided its counts by the whole window,
    reading 40 admits/s per replica where each admitted 100 (then remembered as the knee capacity)."""
    # input: three pods started 15 s into a 60 s window, each admitting 1/s since
    source = StaticPodSource()
    source.set("ns", "p", [PodInfo("a"), PodInfo("b"), PodInfo("new")])
    signals = PrometheusSignals(source, connect=lambda url: AllYoung(), wall=lambda: NOW)
    o = await signals.observe(target("p", source="prometheus", prometheusUrl="http://prom:9090"))
    # expected: 0.75/s over 0.75 replicas: one replica admits 1/s
    assert o.reporting_share == 0.75
    assert o.admitted_per_s / o.rate_replicas == 1.0


class Unrouted(Recorder):
    """Pod ``a`` admits 1 request/s and holds 600 tokens; the serving warm pod ``w`` decided nothing and
    holds no tokens: the Service does not send it requests (endpoints lag, a Service still selecting
    ``role=active``). Both are scraped just now."""

    def custom_query(self, promql: str) -> list[dict[str, Any]]:
        self.asked.append(promql)
        if 'decision=~"admit|admit_demoted"' in promql:
            values = {"a": 1.0, "w": 0.0}
        elif 'decision="reject"' in promql or "started_at_seconds" in promql:
            return []
        elif "timestamp(" in promql:
            values = {"a": NOW, "w": NOW}
        elif "in_flight_tokens" in promql:
            values = {"a": 600.0, "w": 0.0}
        elif "token_budget" in promql:
            values = {"a": 1000.0, "w": 1000.0}
        else:
            return []
        return [{"metric": {"pod": pod}, "value": [NOW, str(v)]} for pod, v in values.items()]


async def test_a_serving_warm_pod_that_takes_no_request_is_not_counted_as_serving() -> None:
    source = StaticPodSource()
    source.set("ns", "p", [PodInfo("a"), PodInfo("w", role="warm", serving=True)])
    signals = PrometheusSignals(source, connect=lambda url: Unrouted(), wall=lambda: NOW)
    o = await signals.observe(target("p", source="prometheus", prometheusUrl="http://prom:9090"))
    assert (o.active, o.warm, o.warm_serving, o.stale, o.fresh, o.reporting) == (1, 1, 0, (), 1, 1)
    assert o.admitted_per_s / o.rate_replicas == 1.0  # what one replica admits: a's, not thinned by w
