"""Pareto frontiers: which points are on them, what "reaches a level" means, the dominance verdict,
the knobs and overrides, and ``tidegate simulate --frontier`` end to end on a small grid."""

import itertools
import json
import math

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.simulate.conftest import BASE
from tidegate.cli.main import main
from tidegate.sim.simulate import core, frontier, matrix, policies, report, scenario
from tidegate.sim.simulate.frontier import Point


def _p(
    policy: str, att: float, gpu_h: float, worst: float | None = None, config: frontier.Config = (("k", 1),)
) -> Point:
    return Point(policy, config, att, att if worst is None else worst, gpu_h, 3)


points_st = st.lists(
    st.builds(
        lambda a, g, k: _p("queue", a, g, config=(("k", k),)),
        st.floats(0, 1),
        st.floats(0.1, 50),
        st.integers(0, 10_000),
    ),
    min_size=1,
    max_size=30,
)


@given(points_st)
def test_the_frontier_is_exactly_the_points_nothing_beats(pts: list[Point]) -> None:
    front = frontier.frontier(pts)
    assert front, "a non-empty set always has a non-dominated point"
    for p in front:
        assert not any(frontier.dominates(q, p) for q in pts)
    for p in pts:
        if p not in front:
            assert any(frontier.dominates(q, p) for q in front)
    # along the frontier, more GPU-hours buy strictly more attainment (equal points may both stay)
    for a, b in itertools.pairwise(front):
        tie = (a.gpu_hours, a.attainment) == (b.gpu_hours, b.attainment)
        assert a.gpu_hours <= b.gpu_hours and (a.attainment < b.attainment or tie)


def test_reach_is_the_cheapest_point_at_or_above_the_level_and_never_when_none_is() -> None:
    pts = [_p("queue", 0.96, 3.0), _p("queue", 0.995, 5.0, worst=0.985), _p("queue", 0.999, 9.0)]
    assert frontier.reach(pts, 0.95).gpu_hours == 3.0
    assert frontier.reach(pts, 0.99).gpu_hours == 5.0
    assert frontier.reach(pts, 0.99, worst_seed=True).gpu_hours == 9.0  # one seed of the 5.0 point missed
    assert frontier.reach(pts, 0.999).gpu_hours == 9.0
    assert frontier.reach(pts, 0.9999) is None
    table = frontier.reach_table("s", pts)
    row = next(line for line in table.splitlines() if line.startswith("| queue "))
    assert row.split(" | ")[2:5] == ["3.00 / 3.00", "5.00 / 9.00", "9.00 / 9.00"]
    assert "never / never" not in row
    only_bad = frontier.reach_table("s", [_p("gpu", 0.5, 1.0)])
    assert "| gpu | 1 | never / never | never / never | never / never |" in only_bad


def test_a_planted_dominating_baseline_is_reported_and_ties_count() -> None:
    default = _p("tidegate", 0.99, 4.0, config=())
    others = [_p("tidegate", 0.999, 6.0), _p("queue", 0.95, 3.0), _p("http", 0.999, 8.0)]
    assert frontier.dominators([default, *others], default) == []
    assert "no baseline configuration dominates it" in frontier.verdict([default, *others])
    planted = _p("gie", 0.99, 4.0, config=(("queue_waiting_target", 1),))  # equal on both axes
    assert frontier.dominators([default, *others, planted], default) == [planted]
    line = frontier.verdict([default, *others, planted])
    assert "DOMINATED" in line and "gie[queue_waiting_target=1]" in line


def test_the_table_has_a_row_for_tidegates_default_and_the_plot_stars_it(tmp_path) -> None:
    pts = [_p("tidegate", 0.99, 4.0, config=()), _p("tidegate", 0.999, 6.0), _p("queue", 0.9, 3.0)]
    table = frontier.reach_table("s", pts)
    assert "| tidegate default | 1 | 4.00 / 4.00 | 4.00 / 4.00 | never / never |" in table
    paths = frontier.write({"s": pts}, tmp_path, "text", plots=True)
    assert (tmp_path / "s.png").read_bytes().startswith(b"\x89PNG") and tmp_path / "s.md" in paths


def test_points_average_over_seeds_and_keep_the_worst() -> None:
    runs = [
        frontier.Run("s", "queue", (("k", 1),), seed, att, gpu) for seed, att, gpu in [(0, 1.0, 2.0), (1, 0.9, 4.0)]
    ]
    (p,) = frontier.points(runs)["s"]
    assert (p.attainment, p.worst, p.gpu_hours, p.seeds) == (pytest.approx(0.95), 0.9, 3.0, 2)


def test_knobs_change_the_scenario_and_refuse_what_the_spec_refuses(tiny) -> None:
    sc = frontier.configure(tiny, (("warm_pool", 3), ("targetUtilization", 0.6), ("headroom_replicas", 2)))
    assert (sc.warm_pool, sc.scaling.target_utilization, sc.baselines["headroom_replicas"]) == (3, 0.6, 2)
    raised = frontier.configure(tiny, (("minReplicas", 3),))
    assert raised.scaling.min_replicas == raised.cluster.initial_replicas == 3
    with pytest.raises(frontier.FrontierError, match="target_capacity_reject_rate"):
        frontier.configure(tiny, (("targetCapacityRejectRate", 1.5),))
    with pytest.raises(frontier.FrontierError, match="unknown knob"):
        frontier.configure(tiny, (("magic", 1),))
    shared = frontier.configure(tiny, (("reservedShare", 0.5),))
    assert [c.reserved_share for c in shared.admission.priority_classes] == [0.5, 0.0]
    with pytest.raises(frontier.FrontierError, match=r"(?s)reservedShare=1.5: .*less than or equal to 1"):
        frontier.configure(tiny, (("reservedShare", 1.5),))


def test_every_grid_configuration_is_valid_on_every_builtin_scenario() -> None:
    for name in scenario.builtin_names():
        sc = scenario.load(name)
        for task in frontier.tasks([name], "full", [0]):
            frontier.configure(sc, task.config)
            policies.make(task.policy)


def test_a_configuration_the_pool_spec_refuses_is_skipped_and_said(tiny) -> None:
    small = frontier.configure(tiny, (("maxReplicas", 2),))
    assert "warmPool.size must be <= scaling.maxReplicas" in frontier._refusal(small, "tidegate", (("warm_pool", 4),))
    assert frontier._refusal(small, "tidegate", (("warm_pool", 2),)) == ""
    skipped: list[str] = []
    todo = frontier.tasks(["mixed-34b-a100"], "full", [0], pols=["tidegate"], skipped=skipped)  # maxReplicas 2
    assert (("warm_pool", 4),) not in {t.config for t in todo} and (("warm_pool", 2),) in {t.config for t in todo}
    assert any("tidegate[warm_pool=4]" in line and "maxReplicas" in line for line in skipped)


def test_a_failed_run_fails_the_sweep(tiny) -> None:
    bad = frontier.Task("steady", "queue", (("magic", 1),), 0)
    with pytest.raises(frontier.FrontierError, match="unknown knob"):
        frontier.run_all([bad, bad], jobs=2)


def test_tidegates_default_is_run_once_even_when_the_grid_contains_it() -> None:
    todo = frontier.tasks(["spike"], "full", [0, 1], pols=["tidegate"])
    configs = [frontier.configure(scenario.load("spike"), t.config) for t in todo if t.seed == 0]
    assert () in {t.config for t in todo}
    assert sum(1 for c in configs if c == scenario.load("spike")) == 1


def test_headroom_replicas_serve_on_top_of_the_hpa_and_cost_gpus(tiny) -> None:
    plain = core.Simulator(tiny, policies.make("queue"), seed=1)
    spare = core.Simulator(frontier.configure(tiny, (("headroom_replicas", 2),)), policies.make("queue"), seed=1)
    assert len(spare.pool.serving()) == len(plain.pool.serving()) + 2
    assert spare.policy.hpa_current(spare) == plain.policy.hpa_current(plain)  # the HPA sees its own share
    a, b = report.summarize(plain.run()), report.summarize(spare.run())
    assert b.start_gpus == a.start_gpus + 2 and b.gpu_hours > a.gpu_hours


def test_cold_start_override_rescales_provisioning_and_load_to_the_given_mean(tiny) -> None:
    sc = matrix.apply_overrides(tiny, decode_scale=0.5, cold_start_s=240)
    c = sc.cluster
    assert math.isclose(c.node_provisioning_s.mean + c.model_load_s.mean, 240)
    assert math.isclose(c.node_provisioning_s.mean / c.model_load_s.mean, 60 / 30)
    assert sc.replica.decode_tokens_per_s == tiny.replica.decode_tokens_per_s * 0.5
    assert sc.name == "tiny@decode0.5x@cold240s"


def test_frontier_cli_on_a_small_grid_writes_tables_plots_and_runs(tmp_path, capsys) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**BASE, "duration_s": 120, "drain_limit_s": 60}))
    out = tmp_path / "frontier"
    args = ["simulate", "--frontier", "--grid", "small", "--scenarios", str(path), "--seeds", "0", "--out", str(out)]
    assert main([*args, "--cold-start-s", "120"]) == 0
    printed = capsys.readouterr().out
    assert "| tiny@cold120s: policy | configs | 95% | 99% | 99.9% |" in printed
    assert "tidegate default:" in printed
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["policy"] for r in runs} == {"tidegate", "queue", "gie", "http", "gpu"}
    assert (out / "tiny@cold120s.png").read_bytes().startswith(b"\x89PNG")
    table = (out / "tiny@cold120s.md").read_text()
    assert "| tidegate default |" in table
    # the same tables again from the runs file, without running anything
    again = tmp_path / "again"
    assert (
        main(["simulate", "--frontier", "--from-runs", str(out / "runs.jsonl"), "--out", str(again), "--no-plots"]) == 0
    )
    assert (again / "tiny@cold120s.md").read_text() == table


def test_frontier_cli_refuses_an_unknown_grid(capsys) -> None:
    assert main(["simulate", "--frontier", "--grid", "huge", "--scenarios", "spike"]) == 2
    assert "unknown grid 'huge'" in capsys.readouterr().err


def test_a_tenant_refused_over_its_quota_is_not_a_miss_and_is_left_out_for_every_policy(tiny) -> None:
    # noisy-tenant's question is "does everyone else keep the SLO": the frontier once scored tidegate
    # 67% there because the noisy tenant's tenant_rate refusals, the outcome asked for, counted as misses
    noisy = {"tenant": "noisy", "priority": "interactive", "rate_per_s": 3.0, "max_tokens": 512,
             "prompt": {"median": 1500, "sigma": 0.8, "max": 8000}, "output": {"median": 120, "sigma": 0.7}}  # fmt: skip
    admission = {
        **BASE["admission"],
        "tenancy": {"identity": "header", "tenants": [{"name": "noisy", "tokensPerSecond": 300}, {"name": "a"}]},
    }
    sc = scenario.parse({**BASE, "streams": [*BASE["streams"], noisy], "admission": admission})
    assert frontier.quota_tenants(sc) == {"noisy"}
    sim = core.Simulator(sc, policies.make("tidegate"), seed=1).run()
    summary = report.summarize(sim)
    assert summary.tenant_attainment["noisy"] < 0.5  # refused over its quota, as asked
    others = frontier.in_quota_attainment(sim)
    assert others == pytest.approx(summary.tenant_attainment["a"], abs=1e-6)  # the in-quota interactive tenant
    assert others > summary.classes["interactive"].attainment
    # a baseline is measured on the same requests: the noisy tenant is left out for it too
    base = core.Simulator(sc, policies.make("queue"), seed=1).run()
    assert frontier.in_quota_attainment(base) == pytest.approx(report.summarize(base).tenant_attainment["a"], abs=1e-6)


def test_the_oracle_has_the_spikes_replicas_serving_when_it_starts_and_returns_them_after() -> None:
    # 3 req/s, x3 from 150 s to 250 s; cold start at 2 sd = (60 + 2 x 10) + 30 s: the oracle asks at
    # the first poll after 150 - 110 = 40 s, the replicas serve before 150 s and go once it has passed
    sc = scenario.parse({**BASE, "load": {"spikes": [{"start_s": 150, "end_s": 250, "factor": 3}]}, "faults": []})
    sim = core.Simulator(frontier.configure(sc, (("oracle_replica_rate", 3.0),)), policies.make("oracle"), seed=1).run()
    assert [(a.time_s, a.after) for a in sim.actions] == [(45.0, 3), (255.0, 1)]  # 9 req/s at 3 a replica
    serving = {row["t"]: row["serving"] for row in sim.timeline}
    assert all(n == 3 for t, n in serving.items() if 150 <= t < 250)
    # without foresight (sizing for the load 15 s ago, one spare replica): it asks once the spike is
    # on and its replicas come a cold start later
    late = frontier.configure(sc, (("oracle_replica_rate", 3.0), ("oracle_lead_s", -15), ("headroom_replicas", 1)))
    sim = core.Simulator(late, policies.make("oracle"), seed=1).run()
    assert [(a.time_s, a.after) for a in sim.actions] == [(165.0, 4), (270.0, 2)]  # from 1 + 1 spare


def test_the_oracle_is_a_bound_on_the_frontier_not_a_baseline_that_dominates() -> None:
    default = _p("tidegate", 0.99, 4.0, config=())
    oracle = _p("oracle", 0.999, 2.0, config=(("oracle_replica_rate", 3.0),))
    assert frontier.dominators([default, oracle], default) == []
    table = frontier.reach_table("s", [default, _p("queue", 0.9, 3.0), oracle])
    assert table.splitlines()[-1].startswith("| oracle | 1 | 2.00 / 2.00 | 2.00 / 2.00 |")
    assert "oracle" in frontier.GRIDS["full"] and "oracle" not in policies.POLICIES  # not in --all's matrix
