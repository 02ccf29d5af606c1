"""The HPA model: tolerance, stabilisation, rate limits (kubernetes.io HPA algorithm)."""

from tidegate.operator.builders.scaled_object import SCALE_DOWN_WINDOW_S
from tidegate.sim.simulate import policies, scenario
from tidegate.sim.simulate.hpa import Hpa, MetricType

AV = MetricType.AVERAGE_VALUE


def test_within_tolerance_nothing_moves() -> None:
    hpa = Hpa(1, 20)
    assert hpa.sync(0, 10.9, 1.0, AV, 10) == 10  # 9% over: inside the 10% tolerance
    assert hpa.sync(15, 12.0, 1.0, AV, 10) == 12


def test_scale_down_waits_for_the_stabilisation_window() -> None:
    hpa = Hpa(1, 20)
    hpa.seed(0, 8)
    assert hpa.sync(15, 2.0, 1.0, AV, 8) == 8
    assert hpa.sync(290, 2.0, 1.0, AV, 8) == 8
    assert hpa.sync(305, 2.0, 1.0, AV, 8) == 2


def test_scale_up_is_rate_limited_per_period() -> None:
    hpa = Hpa(1, 100)
    assert hpa.sync(0, 50.0, 1.0, AV, 2) == 6  # max(2 + 4 pods, 2 x 100%)
    assert hpa.sync(10, 50.0, 1.0, AV, 6) == 6  # same 15 s period: nothing more
    assert hpa.sync(15, 50.0, 1.0, AV, 6) == 12  # next period: doubling


def test_utilization_scales_with_current_replicas() -> None:
    hpa = Hpa(1, 100)
    assert hpa.sync(0, 1.0, 0.8, MetricType.UTILIZATION, 4) == 5  # ceil(4 x 1.0 / 0.8)


def test_tidegate_runs_under_the_behaviour_the_operator_writes() -> None:
    sc = scenario.load("spike")
    behavior = policies.make("tidegate").hpa_behavior(sc)
    window = behavior["scaleDown"]["stabilizationWindowSeconds"]
    assert window == SCALE_DOWN_WINDOW_S  # the operator's own ScaledObject, not the HPA's default
    hpa = Hpa(1, 20, behavior)
    assert hpa.sync(0, 20.0, 1.0, AV, 4) == 4 + sc.scaling.max_scale_up_step
    assert hpa.sync(15, 2.0, 1.0, AV, 8) == 8  # within the window: the highest recommendation holds
    assert hpa.sync(15 + window + 1, 2.0, 1.0, AV, 8) == 7  # after it: one pod per minute down
