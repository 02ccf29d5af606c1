"""The policies a scenario can be run under, by name (``tidegate simulate --policy NAME``)."""

from tidegate.sim.simulate import baselines
from tidegate.sim.simulate.tidegate_policy import Tidegate, TidegateHpaWindow

POLICIES: dict[str, type[baselines.Policy]] = {
    "tidegate": Tidegate,
    "queue": baselines.QueueDepth,
    "http": baselines.HttpConcurrency,
    "gie": baselines.GieShedding,
    "gpu": baselines.GpuUtilization,
}
"""The matrix: tidegate and the four baselines."""

VARIANTS: dict[str, type[baselines.Policy]] = {"tidegate-hpa300": TidegateHpaWindow, "oracle": baselines.Oracle}
"""Runnable by name, not in the default matrix (``oracle``: the frontier's lower bound, not a baseline)."""


class UnknownPolicy(ValueError):
    """A policy name that is not in :data:`POLICIES`."""


def make(name: str) -> baselines.Policy:
    """A fresh policy object by name; raises :class:`UnknownPolicy`."""
    kind = POLICIES.get(name) or VARIANTS.get(name)
    if kind is None:
        raise UnknownPolicy(f"unknown policy {name!r} (known: {', '.join([*POLICIES, *VARIANTS])})")
    return kind()
