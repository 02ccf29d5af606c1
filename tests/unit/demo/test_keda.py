"""The demo's scale table says why the HPA wrote a different count than the scaler asked for."""

import io

from rich.console import Console

from tidegate.demo import keda, scenario, view
from tidegate.demo.timeline import ScaleEvent, Timeline
from tidegate.scaler.proto import externalscaler_pb2 as pb
from tidegate.sim.simulate.hpa import Hpa, MetricType


class _StandIn:
    """The stand-in's bookkeeping around the real HPA model, without the gRPC calls."""

    def __init__(self, s: scenario.DemoSettings) -> None:
        self.s = s
        self.hpa = Hpa(min_replicas=s.replicas, max_replicas=s.max_replicas, behavior=keda.behavior(s))
        self.hpa.seed(0.0, s.replicas)
        self.current = s.replicas
        self.events: list[ScaleEvent] = []
        self.asked: list[tuple[float, int]] = []

    def sync(self, now_s: float, asked: int) -> ScaleEvent | None:
        self.asked.append((now_s, asked))
        after = self.hpa.sync(now_s, float(asked), 1.0, MetricType.AVERAGE_VALUE, self.current)
        if after == self.current:
            return None
        note = keda.hpa_note(self.s, self.events, self.asked, now_s, self.current, after, asked)
        event = ScaleEvent(now_s, self.current, after, f"{self.current} -> {asked}: capacity reject 30%", note)
        self.events.append(event)
        self.current = after
        return event


def test_a_step_limited_scale_up_names_the_hpa_policy() -> None:
    # Input: 2 -> 3 written at t=10; 1.5 s later (inside the 2 s policy period) the scaler asks for 8.
    standin = _StandIn(scenario.DemoSettings())
    first = standin.sync(10.0, 3)
    assert first is not None and first.hpa == ""  # written as asked: nothing to explain
    second = standin.sync(11.5, 8)
    assert second is not None and (second.before, second.after) == (3, 6)
    assert second.hpa == "HPA scaleUp policy: at most 4 pod(s) per 2 s, 1 added in the last 2 s (the scaler asked 8)"
    # The summary's decision table shows the reason beside the two counts.
    out = io.StringIO()
    view.print_summary(scenario.DemoSettings(), Timeline(scale_events=standin.events), Console(file=out, width=300))
    assert "3 -> 6" in out.getvalue() and "at most 4 pod(s) per 2 s" in out.getvalue()


def test_max_replicas_and_the_scale_down_policy_are_named() -> None:
    standin = _StandIn(scenario.DemoSettings())
    up = standin.sync(10.0, 6)
    assert up is not None and up.after == 6 and up.hpa == ""
    capped = standin.sync(13.0, 12)
    assert capped is not None and capped.after == 8
    assert capped.hpa == "HPA: held at maxReplicas 8 (the scaler asked 12)"
    down = standin.sync(40.0, 3)  # past the 15 s stabilisation: one pod per period
    assert down is not None and (down.before, down.after) == (8, 7)
    assert down.hpa == "HPA scaleDown policy: at most 1 pod(s) per 2 s (the scaler asked 3)"


def test_a_scale_down_held_by_the_stabilisation_window_says_so() -> None:
    s = scenario.DemoSettings()
    note = keda.hpa_note(s, [], [(30.0, 6), (40.0, 3)], 42.0, before=7, after=6, asked=3)
    assert note == (
        "HPA scale-down stabilisation: 6 was asked within the last 15 s"
        " and scaleDown policy: at most 1 pod(s) per 2 s (the scaler asked 3)"
    )
    assert keda.hpa_note(s, [], [(42.0, 5)], 42.0, before=7, after=5, asked=5) == ""


class _Pool:
    def __init__(self, replicas: int) -> None:
        self.spec_replicas = replicas

    def scale(self, replicas: int) -> None:
        self.spec_replicas = replicas


class _Stub:
    """The scaler: each GetMetrics decides the next of ``answers``; IsActive then decides afresh."""

    def __init__(self, decisions: dict[str, str], answers: list[tuple[str, int]]) -> None:
        self.decisions, self.answers = decisions, answers

    async def GetMetrics(self, request, timeout):
        text, value = self.answers.pop(0)
        self.decisions["text"] = text
        return pb.GetMetricsResponse(metricValues=[pb.MetricValue(metricValue=value, metricValueFloat=float(value))])

    async def IsActive(self, request, timeout):
        self.decisions["text"] = "6 -> 6: steady"  # a later window than the metric's
        return pb.IsActiveResponse(result=True)


async def test_a_write_carries_the_decision_behind_its_metric_and_the_hpa_step_that_cut_it() -> None:
    s = scenario.DemoSettings(replicas=2)
    decisions: dict[str, str] = {}
    timeline = Timeline()
    now = [0.0]
    pool = _Pool(2)
    standin = keda.KedaStandIn("127.0.0.1:1", s, pool, timeline, lambda: now[0], lambda: decisions.get("text", ""))
    try:
        standin.stub = _Stub(decisions, [("2 -> 5: capacity reject 40%", 5), ("5 -> 7: capacity reject 30%", 7)])
        standin.hpa.seed(0.0, 2)
        now[0] = 9.0
        await standin.poll()
        now[0] = 10.0  # 1 s later, inside the policy's 2 s period: 3 of its 4 pods are spent
        await standin.poll()
    finally:
        await standin.close()
    first, second = timeline.scale_events
    assert (first.before, first.after, first.hpa) == (2, 5, "")
    assert (second.before, second.after, pool.spec_replicas) == (5, 6, 6)
    assert second.text == "5 -> 7: capacity reject 30%"  # not IsActive's later "6 -> 6"
    assert second.hpa == "HPA scaleUp policy: at most 4 pod(s) per 2 s, 3 added in the last 2 s (the scaler asked 7)"
