"""The scaler's memory follows the pools and pods that exist: a scaler that runs for months while
pools and pods come and go keeps state only for those in use, and a pool it forgot starts cleanly.

The clock is injected and the sidecars' answers are stubbed (no HTTP): the real
:class:`~tidegate.scaler.service.Scaler`, :class:`~tidegate.scaler.sidecar.SidecarSignals`,
:class:`~tidegate.scaler.rates.SampleHistory` and law run.
"""

import threading
from typing import Any

import pytest
from prometheus_client import generate_latest

from tests.unit.scaler.test_rates import snap
from tidegate.admission.stats import StatsSnapshot
from tidegate.scaler import metadata, rates
from tidegate.scaler.errors import PodSourceError
from tidegate.scaler.kube import KubernetesPodSource
from tidegate.scaler.law import Reason
from tidegate.scaler.metrics import DesiredReplicasMetric
from tidegate.scaler.pods import PodInfo, StaticPodSource
from tidegate.scaler.prometheus import PrometheusSignals
from tidegate.scaler.service import Scaler
from tidegate.scaler.sidecar import SidecarSignals
from tidegate.scaler.sideport import DecisionLog

BUDGET = 10_000


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Sidecars:
    """What each pod's sidecar would answer now: admitted counter and in-flight tokens, per pod name."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.admitted: dict[str, int] = {}
        self.instance: dict[str, str] = {}
        self.util = 0.2

    def answer(self, pod: PodInfo) -> rates.Sample:
        self.admitted[pod.name] = self.admitted.get(pod.name, 0) + 300  # 20/s over a 15 s poll
        return rates.Sample.of(
            StatsSnapshot(
                pod=pod.name,
                instance_id=self.instance.get(pod.name, "i1"),
                started_at_s=0.0,
                time_s=self.clock.now,
                admitted_total=self.admitted[pod.name],
                in_flight_tokens=round(self.util * BUDGET),
                token_budget=BUDGET,
            )
        )


class StubbedSignals(SidecarSignals):
    def __init__(self, pods: StaticPodSource, sidecars: Sidecars, clock: Clock) -> None:
        super().__init__(pods, wall=clock)
        self.sidecars = sidecars

    async def _fetch_all(self, pods: list[PodInfo], port: int) -> list[rates.Sample | None]:
        return [self.sidecars.answer(p) for p in pods]


def target(pool: str, **md: str) -> metadata.Target:
    return metadata.parse(pool, "ns", {"pool": pool, "scaleDownCooldownSeconds": "120", **md})


def pods(pool: str, n: int) -> list[PodInfo]:
    return [PodInfo(f"{pool}-{i}", f"http://{pool}-{i}") for i in range(n)]


def rig() -> tuple[Clock, StaticPodSource, Sidecars, StubbedSignals, Scaler, DesiredReplicasMetric, DecisionLog]:
    clock = Clock()
    source, sidecars = StaticPodSource(), Sidecars(clock)
    signals = StubbedSignals(source, sidecars, clock)
    metric, log = DesiredReplicasMetric(), DecisionLog()
    scaler = Scaler(
        signals,
        min_refresh_s=0.0,
        clock=clock,
        hooks=(metric.record, log.record),
        forget_hooks=(metric.forget, log.forget),
    )
    return clock, source, sidecars, signals, scaler, metric, log


async def test_pools_keda_stops_asking_about_are_forgotten_everywhere() -> None:
    clock, source, _, signals, scaler, metric, log = rig()
    names = [f"pool-{i}" for i in range(20)]
    for name in names:
        source.set("ns", name, pods(name, 3))
    for _ in range(8):  # two minutes of KEDA polling every pool
        clock.now += 15
        for name in names:
            await scaler.decide(target(name))
    assert (scaler.pools, signals.pools, len(log.latest)) == (20, 20, 20)
    assert b'pool="pool-7"' in generate_latest(metric.registry)

    keep = target("pool-0")
    for _ in range(41):  # ten minutes and a bit in which KEDA only asks about pool-0
        clock.now += 15
        await scaler.decide(keep)
    assert (scaler.pools, signals.pools, list(log.latest)) == (1, 1, ["ns/pool-0"])
    exported = generate_latest(metric.registry).decode()
    assert "pool-7" not in exported and 'pool="pool-0"' in exported

    clock.now += 601  # and then not even that one
    scaler.forget_idle()
    assert (scaler.pools, signals.pools, len(log.latest)) == (0, 0, 0)
    assert "pool=" not in generate_latest(metric.registry).decode()


async def test_a_longer_window_keeps_a_pool_longer() -> None:
    clock, source, _, _, scaler, _, _ = rig()
    source.set("ns", "slow", pods("slow", 2))
    await scaler.decide(target("slow", windowSeconds="120"))
    clock.now += 1_100  # more than the 600 s floor, less than 10 x 120 s
    scaler.forget_idle()
    assert scaler.pools == 1
    clock.now += 101
    scaler.forget_idle()
    assert scaler.pools == 0


async def test_a_forgotten_pool_asked_again_holds_its_count_then_waits_a_whole_cooldown() -> None:
    clock, source, _, _, scaler, _, _ = rig()
    source.set("ns", "quiet", pods("quiet", 4))
    quiet = target("quiet")  # 4 replicas at 20% utilisation: the law wants fewer after its cooldown
    decisions = []
    for _ in range(12):
        clock.now += 15
        decisions.append(await scaler.decide(quiet))
    assert decisions[-1].desired < 4  # it did scale down once it had watched a whole cooldown

    clock.now += 3_600  # KEDA stopped asking (the ScaledObject was paused), then asks again
    scaler.forget_idle()
    assert scaler.pools == 0
    again = await scaler.decide(quiet)
    assert (again.desired, again.reason) == (4, Reason.HOLD_WARMUP)  # no baseline yet: hold, never guess
    for _ in range(7):  # a rate again, but not a whole cooldown watched: still no scale-down
        clock.now += 15
        d = await scaler.decide(quiet)
        assert d.desired == 4, d.text
        assert d.reason is Reason.COOLDOWN
    for _ in range(2):
        clock.now += 15
        d = await scaler.decide(quiet)
    assert d.desired < 4 and d.reason is Reason.SCALE_DOWN


async def test_pods_that_left_the_watch_are_dropped_after_the_window() -> None:
    clock, source, _, signals, scaler, _, _ = rig()
    key, churn = ("ns", "churn"), target("churn")  # windowSeconds 60: samples kept 120 s
    for generation in range(10):  # a rolling update every minute and a half, for 15 minutes
        source.set("ns", "churn", [PodInfo(f"churn-{generation}-{i}", f"http://g{generation}-{i}") for i in range(3)])
        for _ in range(6):
            clock.now += 15
            await scaler.decide(churn)
        assert signals.pods_kept(key) <= 3 * 3  # this generation, and at most two before it
    source.set("ns", "churn", [])
    for _ in range(9):
        clock.now += 15
        await scaler.decide(churn)
    assert signals.pods_kept(key) == 0


def test_a_pod_back_within_the_window_keeps_its_baseline_and_its_restart_is_seen() -> None:
    h = rates.SampleHistory(keep_s=120)
    h.record("p0", snap(0, admitted=100))
    h.prune([], now_s=60)  # dropped out of the watch for a minute (a relist), then back
    h.prune(["p0"], now_s=90)
    restarted = snap(100, admitted=5, instance="i2", started=95)
    delta = rates.pod_delta(h.baseline("p0", restarted, 60), restarted, max_window_s=120)
    assert delta is not None and delta.reset and delta.admitted == 5  # counted from its restart, not -95
    h.prune([], now_s=211)
    assert (h.pods, len(h)) == (0, 0)


def test_a_gone_pod_whose_clock_ran_ahead_is_still_forgotten() -> None:
    h = rates.SampleHistory(keep_s=120)
    h.record("ahead", snap(10_000))  # its sidecar's clock is hours ahead of the scaler's
    h.prune(["ahead"], now_s=0)
    h.prune([], now_s=121)
    assert h.pods == 0


class FailingApi:
    """A CoreV1Api whose list always fails (the watch thread retries with back-off until stopped)."""

    def list_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("API server down")


async def test_forgetting_a_pool_stops_its_watch_thread() -> None:
    source = KubernetesPodSource(api=FailingApi(), first_list_timeout_s=5)  # type: ignore[arg-type]
    for name in ("a", "b"):
        with pytest.raises(PodSourceError):  # never listed; the watch thread keeps retrying
            await source.pods("ns", name)
    assert source.watches == 2
    source.forget("ns", "a")
    source.forget("ns", "never-watched")
    assert source.watches == 1
    threads = [t for t in threading.enumerate() if t.name == "tidegate-pods-ns-a"]
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    await source.close()


class EmptyPrometheus:
    def custom_query(self, promql: str) -> list[dict[str, Any]]:
        return []


async def test_prometheus_clients_go_with_the_last_pool_that_uses_them() -> None:
    source = StaticPodSource()
    signals = PrometheusSignals(source, connect=lambda url: EmptyPrometheus())
    for pool, url in (("a", "http://prom-1:9090"), ("b", "http://prom-1:9090"), ("c", "http://prom-2:9090")):
        source.set("ns", pool, pods(pool, 1))
        await signals.observe(target(pool, source="prometheus", prometheusUrl=url))
    assert signals.clients == 2
    signals.forget(("ns", "c"))
    signals.forget(("ns", "a"))
    assert signals.clients == 1  # prom-1 still serves pool b
    signals.forget(("ns", "b"))
    assert signals.clients == 0
