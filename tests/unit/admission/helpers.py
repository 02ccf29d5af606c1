"""Shared builders for admission unit tests: a fake clock and small specs."""

from typing import Any

from tidegate.admission.cost import RequestCost
from tidegate.admission.engine import Engine, EngineTuning
from tidegate.api.admission import AdmissionSpec
from tidegate.api.serving import ModelSpec


class FakeClock:
    """A clock tests move by hand (seconds)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def admission(**overrides: Any) -> AdmissionSpec:
    """An AdmissionSpec from camelCase or snake_case overrides (validated like a config file)."""
    base: dict[str, Any] = {"tokenBudget": 1000, "maxConcurrency": 4}
    base.update(overrides)
    return AdmissionSpec.model_validate(base)


def engine(clock: FakeClock | None = None, tuning: EngineTuning | None = None, **overrides: Any) -> Engine:
    """An engine over :func:`admission` with a 32k-context model."""
    return Engine(admission(**overrides), ModelSpec(name="m", max_context_tokens=32768), clock or FakeClock(), tuning)


def tokens(n: int) -> RequestCost:
    """A request holding exactly ``n`` tokens (half prompt, half output)."""
    return RequestCost.fixed(n // 2, n - n // 2)
