"""The demo's records: outcome classes, per-second series, phase summaries and findings."""

import pytest

from tidegate.demo import findings, scenario
from tidegate.demo.timeline import (
    ADMITTED,
    CAPACITY,
    ERROR,
    POLICY,
    Outcome,
    Promotion,
    ReplicaSample,
    ScaleEvent,
    Timeline,
    kind_of,
    percentile,
)


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (200, None, ADMITTED),
        (503, "queue_full", CAPACITY),
        (503, "slo_unreachable", CAPACITY),
        (429, "tenant_rate", POLICY),
        (413, "request_too_large", POLICY),
        (503, "not_active", ERROR),
        (502, None, ERROR),
        (503, "something_new", ERROR),
    ],
)
def test_kind_of_answers(status, code, kind) -> None:
    assert kind_of(status, code) == kind


def test_per_second_and_p99() -> None:
    tl = Timeline(
        outcomes=[
            Outcome(0.1, "a", "interactive", ADMITTED, ttft_s=0.2),
            Outcome(0.5, "a", "batch", CAPACITY, "queue_full"),
            Outcome(1.2, "b", "interactive", POLICY, "tenant_rate"),
            Outcome(1.3, "b", "interactive", ADMITTED, ttft_s=1.0),
        ]
    )
    per = tl.per_second(2)
    assert per["offered"] == [2, 2] and per[CAPACITY + ":batch"] == [1, 0] and per[POLICY] == [0, 1]
    assert tl.ttft_p99(2, "interactive", window_s=2) == [0.2, 1.0]
    assert percentile([3, 1, 2], 0.5) == 2
    with pytest.raises(ValueError):
        percentile([], 0.99)


def test_gpu_seconds_count_every_pod() -> None:
    tl = Timeline(
        replicas=[ReplicaSample(0, 2, 2, 2, 0, 4), ReplicaSample(10, 6, 4, 0, 2, 8), ReplicaSample(20, 6, 6, 2, 0, 8)]
    )
    assert tl.gpu_seconds() == (4 * 10 + 8 * 10, 2 * 10 + 4 * 10)


def _story(noisy_kind: str, noisy_up: bool) -> tuple[scenario.DemoSettings, Timeline]:
    s = scenario.DemoSettings(duration_s=100, serve=False)  # warm replicas serve once promoted only
    spike = next(p for p in scenario.phases(s) if p.name == "spike")
    noisy = next(p for p in scenario.phases(s) if p.name == "noisy")
    outcomes = [
        Outcome(spike.start_s + 1 + i * 0.1, "acme", "interactive", CAPACITY, "slo_unreachable") for i in range(20)
    ]
    outcomes += [Outcome(spike.end_s - 1, "acme", "interactive", ADMITTED, ttft_s=0.3)]
    reason = "tenant_rate" if noisy_kind == POLICY else "queue_full"
    outcomes += [Outcome(noisy.start_s + 1, scenario.NOISY, "interactive", noisy_kind, reason)]
    events = [
        ScaleEvent(spike.start_s + 4, 2, 6, "2 -> 6: capacity reject 40% across 3 tenants (2 warm promoted first)")
    ]
    if noisy_up:
        events.append(ScaleEvent(noisy.start_s + 2, 2, 3, "2 -> 3: token utilisation 90% over target 75%"))
    promos = [
        Promotion(spike.start_s + 4.3, "demo-2", "warm", 0.3),
        Promotion(spike.start_s + 25, "demo-4", "cold", 21),
    ]
    return s, Timeline(outcomes=outcomes, scale_events=events, promotions=promos)


def test_findings_hold_for_the_story_and_fail_when_it_does_not_happen() -> None:
    s, tl = _story(POLICY, noisy_up=False)
    got = findings.findings(s, tl)
    assert all(f.ok for f in got), [f.text for f in got]
    assert any("2 -> 6" in f.text for f in got) and any("0.3 s" in f.text for f in got)
    s, tl = _story(CAPACITY, noisy_up=True)
    bad = [f.text for f in findings.findings(s, tl) if not f.ok]
    assert any("noisy tenant" in t for t in bad) and any("scale-up(s) during the noisy phase" in t for t in bad)
    assert not all(f.ok for f in findings.findings(s, Timeline()))
