"""Determinism and conservation: what makes a simulator's numbers worth reading."""

import pytest

from tidegate.sim.simulate import core, policies, report, scenario, workload


@pytest.mark.parametrize("policy", list(policies.POLICIES))
def test_every_arrival_is_settled_exactly_once(tiny: scenario.Scenario, policy: str) -> None:
    sim = core.Simulator(tiny, policies.make(policy), seed=3).run()
    assert len(sim.requests) == len(sim.arrivals) > 500
    assert sim.open == 0
    assert all(r.outcome is not None for r in sim.requests)
    served = [r for r in sim.requests if r.outcome is core.Outcome.SERVED]
    assert all(r.first_token_s is not None and r.done_s >= r.first_token_s >= r.arrival_s for r in served)
    assert all(not p.running for p in sim.pool.pods)  # nothing left on a model server
    summary = report.summarize(sim)
    assert sum(sum(c.outcomes.values()) for c in summary.classes.values()) == len(sim.requests)


def test_a_request_settled_twice_is_caught(tiny: scenario.Scenario) -> None:
    sim = core.Simulator(tiny, policies.make("queue"), seed=3)
    sim._arrive(0)
    req = sim.requests[0]
    if req.outcome is None:
        sim.settle(req, core.Outcome.REFUSED, "test")
    with pytest.raises(core.DoubleSettle):
        sim.settle(req, core.Outcome.SERVED)


def test_the_lost_replica_loses_requests_and_tidegate_admission_refuses_some(tiny: scenario.Scenario) -> None:
    summary = report.summarize(core.Simulator(tiny, policies.make("tidegate"), seed=3).run())
    outcomes = {k: sum(c.outcomes.get(k, 0) for c in summary.classes.values()) for k in core.Outcome}
    assert outcomes[core.Outcome.LOST] > 0
    assert outcomes[core.Outcome.REFUSED] > 0


@pytest.mark.parametrize("policy", ["tidegate", "gie"])
def test_same_seed_same_results(tiny: scenario.Scenario, policy: str) -> None:
    first = report.summarize(core.Simulator(tiny, policies.make(policy), seed=7).run())
    second = report.summarize(core.Simulator(tiny, policies.make(policy), seed=7).run())
    assert first.to_json() == second.to_json()
    other = report.summarize(core.Simulator(tiny, policies.make(policy), seed=8).run())
    assert other.to_json() != first.to_json()


def test_policies_see_the_same_arrivals(tiny: scenario.Scenario) -> None:
    a = core.Simulator(tiny, policies.make("tidegate"), seed=5).run()
    b = core.Simulator(tiny, policies.make("http"), seed=5).run()
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in a.requests] == [
        (r.arrival_s, r.prompt_tokens, r.output_tokens) for r in b.requests
    ]


def test_arrivals_follow_the_spike(tiny: scenario.Scenario) -> None:
    arrivals = workload.generate(tiny, seed=1)
    t = arrivals.time_s
    before = ((t >= 0) & (t < 100)).sum() / 100
    during = ((t >= 100) & (t < 200)).sum() / 100
    assert 2.3 < before < 3.7  # 3 req/s
    assert 7.5 < during < 10.5  # 9 req/s
    assert (arrivals.output_tokens <= arrivals.max_tokens).all()
    assert arrivals.prompt_tokens.max() > 3 * 1500  # heavy tail
