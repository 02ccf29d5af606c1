"""The demo's scenario: phases, sizes and arrivals say what the README claims."""

import itertools

import pytest

from tidegate.admission.config import SidecarConfig
from tidegate.demo import scenario
from tidegate.scaler import metadata


def test_phases_cover_the_run_in_order() -> None:
    s = scenario.DemoSettings(duration_s=100)
    ps = scenario.phases(s)
    assert [p.name for p in ps] == ["steady", "spike", "calm", "noisy"]
    assert ps[0].start_s == 0 and ps[-1].end_s == pytest.approx(100)
    assert all(a.end_s == b.start_s for a, b in itertools.pairwise(ps))


def test_spike_is_three_times_the_base_and_needs_more_than_the_warm_pool() -> None:
    s = scenario.DemoSettings()
    spike = next(p for p in scenario.phases(s) if p.name == "spike")
    regular = lambda t: sum(r for (tenant, _), r in scenario.rates_at(s, t).items() if tenant != scenario.NOISY)  # noqa: E731
    assert regular(spike.start_s + 1) == pytest.approx(3 * regular(1.0))
    # sized at the scaler's target utilisation (0.75), the spike needs more than active + warm: a cold start follows
    capacity = scenario.replica_capacity_rps(s.size)
    assert regular(spike.start_s + 1) > s.replicas * capacity  # the active replicas alone refuse for capacity
    assert regular(spike.start_s + 1) > (s.replicas + s.warm) * capacity * 0.75


def test_noisy_tenant_offers_ten_times_its_quota_only_in_its_phase() -> None:
    s = scenario.DemoSettings()
    noisy = next(p for p in scenario.phases(s) if p.name == "noisy")
    quota_rps = scenario.NOISY_QUOTA_TOKENS_PER_S * s.replicas / scenario.estimated_cost_tokens(scenario.INTERACTIVE)
    assert scenario.rates_at(s, noisy.start_s + 1)[(scenario.NOISY, scenario.INTERACTIVE)] == pytest.approx(
        10 * quota_rps
    )
    assert scenario.rates_at(s, 1.0)[(scenario.NOISY, scenario.INTERACTIVE)] < quota_rps


def test_arrivals_are_seeded_sorted_and_follow_the_phases() -> None:
    s = scenario.DemoSettings(duration_s=60, seed=3)
    a, b = scenario.arrivals(s), scenario.arrivals(s)
    assert a == b and a == sorted(a) and all(0 <= x.t_s < 60 for x in a)
    assert scenario.arrivals(scenario.DemoSettings(duration_s=60, seed=4)) != a
    spike = next(p for p in scenario.phases(s) if p.name == "spike")
    steady = next(p for p in scenario.phases(s) if p.name == "steady")

    def per_s(p):
        return sum(1 for x in a if p.start_s <= x.t_s < p.end_s and x.tenant != scenario.NOISY) / (p.end_s - p.start_s)

    assert per_s(spike) > 2 * per_s(steady)


def test_config_and_trigger_metadata_parse_with_the_real_models() -> None:
    s = scenario.DemoSettings()
    config = SidecarConfig.model_validate(scenario.admission_config(s))
    names = [t.name for t in config.admission.tenancy.tenants]
    assert len(names) == 4 and scenario.NOISY in names
    assert [c.name for c in config.admission.priority_classes] == ["interactive", "batch"]
    # the noisy tenant's requests fit its bucket (else they would be refused as too large, not rate-limited)
    assert scenario.estimated_cost_tokens(scenario.INTERACTIVE) <= scenario.NOISY_BURST_TOKENS
    target = metadata.parse(scenario.POOL, scenario.NAMESPACE, scenario.scaler_metadata(s))
    assert (target.scaling.min_replicas, target.scaling.max_replicas) == (s.replicas, s.max_replicas)
    assert target.scaling.scale_down_cooldown_seconds == s.cooldown_s


@pytest.mark.parametrize("kw", [{"duration_s": 5}, {"replicas": 9}, {"warm": -1}, {"window_s": 5}])
def test_bad_settings_are_refused(kw) -> None:
    with pytest.raises(ValueError):
        scenario.DemoSettings(**kw)
