"""``spec.warmPool.serve`` in the simulator: the warm replica is in the Service, the scaler counts its
load, the ReplicaSet deletes what the operator marks for deletion, and the frontier can sweep it."""

import dataclasses

import numpy as np
import pytest

from tests.unit.simulate.conftest import BASE
from tidegate.api import constants
from tidegate.sim.simulate import cluster, core, frontier, policies, scenario

QUIET = {**BASE, "load": {}, "faults": []}  # 1 active replica and 1 warm at 3 req/s: no reason to scale
SPIKE = {**BASE, "faults": []}  # 3x between 100 s and 200 s


def _run(doc: dict, serve: bool, seed: int) -> core.Simulator:
    sc = dataclasses.replace(scenario.parse(doc), warm_pool_serve=serve)
    return core.Simulator(sc, policies.make("tidegate"), seed=seed).run()


def test_the_scenario_takes_spec_warm_pool_as_the_api_writes_it() -> None:
    sc = scenario.parse({**BASE, "warm_pool": {"size": 2, "serve": True}})
    assert (sc.warm_pool, sc.warm_pool_serve) == (2, True)
    assert (scenario.parse(BASE).warm_pool, scenario.parse(BASE).warm_pool_serve) == (1, True)  # the API's defaults
    assert scenario.parse({**BASE, "warm_pool": {"size": 1, "serve": False}}).warm_pool_serve is False
    with pytest.raises(scenario.ScenarioError, match="warm_pool"):
        scenario.parse({**BASE, "warm_pool": {"size": 1, "serves": True}})


def test_a_serving_warm_replica_takes_its_share_of_requests_for_no_more_gpus() -> None:
    for seed in (1, 2):
        idle, serving = _run(QUIET, False, seed), _run(QUIET, True, seed)
        served = [r for r in serving.requests if r.outcome is core.Outcome.SERVED]
        warm = {p.name for p in serving.pool.pods if p.role == constants.ROLE_WARM and p.live}
        assert warm and not serving.actions  # the warm replica stayed warm all along
        share = sum(1 for r in served if r.pod.name in warm) / len(served)
        assert 0.4 < share < 0.6  # round robin over both
        idle_gpu_h, serving_gpu_h = (s.pool.gpu_hours(s.scenario.duration_s) for s in (idle, serving))
        assert serving_gpu_h <= idle_gpu_h
        assert frontier.in_quota_attainment(serving) >= frontier.in_quota_attainment(idle)


def test_a_serving_warm_replica_serves_the_first_minute_of_a_burst() -> None:
    def first_minute(sim: core.Simulator) -> int:
        slo = sim.scenario.slo_s("interactive")
        return sum(
            1
            for r in sim.requests
            if r.priority == "interactive" and 100 <= r.arrival_s < 160
            and r.outcome is core.Outcome.SERVED and r.ttft_s <= slo
        )  # fmt: skip

    met = [(first_minute(_run(SPIKE, False, s)), first_minute(_run(SPIKE, True, s))) for s in (0, 1, 2)]
    assert all(with_serve >= without for without, with_serve in met)
    assert sum(w for _, w in met) > sum(w for w, _ in met)


def _pool(serve: bool) -> tuple[cluster.Pool, dict[str, cluster.Pod]]:
    events: list[tuple[float, str, object]] = []
    sc = scenario.parse(QUIET)
    pool = cluster.Pool(
        sc.cluster, sc.replica, np.random.default_rng(0), lambda t, k, p: events.append((t, k, p)), 600.0, serve
    )
    pods = {name: pool.create(0.0, ready_now=True) for name in ("active", "drained", "warm")}
    pods["active"].role, pods["active"].serving = constants.ROLE_ACTIVE, True
    pods["drained"].role, pods["drained"].draining_since_s = constants.ROLE_DRAINING, 100.0
    pods["drained"].serving = False
    pods["warm"].created_s = 500.0  # the warm pool's refill: the newest pod
    return pool, pods


def test_the_replicaset_deletes_the_drained_replica_not_the_serving_warm_one() -> None:
    # spec.replicas 1 and a warm pool of 1, full: the drained replica has no room, so the operator
    # leaves it at the draining pod-deletion-cost and the ReplicaSet deletes it, not the (newer) warm
    # replica that is serving requests
    pool, pods = _pool(serve=True)
    assert pods["warm"].serving
    pods["warm"].running = {1: object()}
    pool.reconcile(600.0, desired_active=1, warm_size=1, in_flight=lambda p: len(p.running))
    assert [p.name for p in pool.live_pods()] == [pods["active"].name, pods["warm"].name]
    assert pods["warm"].serving and not pods["drained"].live


def test_without_serve_a_warm_replica_stays_out_of_the_service() -> None:
    pool, pods = _pool(serve=False)
    assert not pods["warm"].serving and pool.serving() == [pods["active"]]


def test_the_frontier_sweeps_warm_pool_serve() -> None:
    sc = scenario.parse(BASE)
    assert frontier.configure(sc, (("warmPool.serve", 1),)).warm_pool_serve
    assert not frontier.configure(sc, (("warmPool.serve", 0),)).warm_pool_serve
    spike = scenario.load("spike")
    todo = frontier.tasks(["spike"], "full", [0], pols=["tidegate"])
    other = [t.config for t in todo if frontier.configure(spike, t.config).warm_pool_serve != spike.warm_pool_serve]
    assert other  # the full grid has configurations on the other side of the default


def test_the_simulated_scaler_sees_replicas_loading_as_the_real_one_does(monkeypatch) -> None:
    # The real scaler reads warmPoolSize from the trigger (scaler/metadata.py) and counts the pods
    # beyond the warm pool that are not Ready yet as loading (rates.loading); the simulator's scaler
    # left it out, so every hold there counted no replica on its way.
    from tidegate.scaler import law

    seen: list[law.Observation] = []
    real_decide = law.decide

    def decide(policy, obs, state, now_s):
        seen.append(obs)
        return real_decide(policy, obs, state, now_s)

    monkeypatch.setattr(law, "decide", decide)
    sim = _run(SPIKE, True, 0)
    assert any(a.after > a.before for a in sim.actions)  # the burst bought replicas
    assert max(o.loading for o in seen) >= 1
