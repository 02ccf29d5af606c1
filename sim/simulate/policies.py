"""The policies a scenario can be run under, by name (``tidegate simulate --policy NAME``)."""

from tidegate.sim.simulate import baselines
from tidegate.sim.simulate.tidegate_policy import Tidegate

POLICIES: dict[str, type[baselines.Policy]] = {
    "tidegate": Tidegate,
    "queue": baselines.QueueDepth,
    "http": baselines.HttpConcurrency,
    "gie": baselines.GieShedding,
    "gpu": baselines.GpuUtilization,
}


class UnknownPolicy(ValueError):
    """A policy name that is not in :data:`POLICIES`."""


def make(name: str) -> baselines.Policy:
    """A fresh policy object by name; raises :class:`UnknownPolicy`."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise UnknownPolicy(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
