"""The warm pool planner: which pods to promote, drain or return, and how many the Deployment needs.

Pure and level-triggered: given the pool's pods as observed now, return the actions that move
them toward ``desired_active`` serving pods plus ``warm_size`` ready, loaded, not-serving
pods. Applying a plan and planning again yields an empty plan once converged.

Rules:
- Promote (``warm -> active``) ready warm pods, oldest first (loaded longest), when fewer than
  ``desired_active`` pods are active. A draining pod is promoted back before any warm one: it
  is already loaded and warm.
- When more pods are active than desired, mark the excess ``draining`` (out of the Service at
  once), not-ready ones first, then the newest.
- A draining pod returns to ``warm`` when its sidecar reports nothing in flight or when it
  has drained for ``drain_timeout_s``.
- Deployment replicas = desired active + warm size + pods still draining, so draining pods are
  never the ones the ReplicaSet must delete to reach its count (pod-deletion-cost orders the
  rest: draining < warm < active).
- A pod that is not Ready is never counted as warm; pods being deleted are ignored.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

from tidegate.api import constants


@dataclass(frozen=True)
class PodView:
    """What the planner needs to know about one pod of the pool."""

    name: str
    role: str  # constants.ROLE_ACTIVE / ROLE_WARM / ROLE_DRAINING (anything else: warm)
    ready: bool
    created_s: float  # creation time, Unix seconds
    deleting: bool = False
    draining_since_s: float | None = None
    in_flight: int | None = None  # requests in flight per the sidecar; None: unknown


@dataclass(frozen=True)
class Plan:
    """Actions for one reconcile, and the counts the status reports."""

    promote: list[str] = field(default_factory=list)  # warm or draining -> active
    drain: list[str] = field(default_factory=list)  # active -> draining
    return_to_warm: list[str] = field(default_factory=list)  # draining -> warm
    deployment_replicas: int = 0
    active: int = 0  # pods that will be active after the plan
    ready_active: int = 0
    warm_ready: int = 0
    draining: int = 0

    @property
    def empty(self) -> bool:
        return not (self.promote or self.drain or self.return_to_warm)


def plan(pods: Iterable[PodView], desired_active: int, warm_size: int, now_s: float, drain_timeout_s: float) -> Plan:
    """Plan one reconcile step (see the module docstring for the rules).

    ``desired_active`` and ``warm_size`` are ``spec.replicas`` and ``spec.warmPool.size``;
    ``now_s`` is Unix seconds; raises ``ValueError`` on negative counts.
    """
    if desired_active < 0 or warm_size < 0:
        raise ValueError("desired_active and warm_size must be >= 0")
    live = [p for p in pods if not p.deleting]
    active = [p for p in live if p.role == constants.ROLE_ACTIVE]
    draining = [p for p in live if p.role == constants.ROLE_DRAINING]
    warm = [p for p in live if p.role not in (constants.ROLE_ACTIVE, constants.ROLE_DRAINING)]

    promote: list[str] = []
    drain: list[str] = []
    deficit = desired_active - len(active)
    if deficit > 0:
        # Draining pods are loaded: take them back first, then the longest-loaded warm pods.
        candidates = sorted(draining, key=lambda p: p.created_s) + sorted(
            (p for p in warm if p.ready), key=lambda p: p.created_s
        )
        chosen = candidates[:deficit]
        promote = [p.name for p in chosen]
        draining = [p for p in draining if p.name not in promote]
        warm = [p for p in warm if p.name not in promote]
        active = active + chosen
    elif deficit < 0:
        excess = sorted(active, key=lambda p: (p.ready, -p.created_s))[:-deficit]
        drain = [p.name for p in excess]
        active = [p for p in active if p.name not in drain]
        draining = draining + [p for p in excess]

    return_to_warm = []
    still_draining = []
    for p in draining:
        if p.name in drain:
            still_draining.append(p)
            continue
        timed_out = p.draining_since_s is not None and now_s - p.draining_since_s >= drain_timeout_s
        if p.in_flight == 0 or timed_out or p.draining_since_s is None:
            return_to_warm.append(p.name)
        else:
            still_draining.append(p)

    warm_ready = sum(1 for p in warm if p.ready) + sum(1 for p in draining if p.name in return_to_warm and p.ready)
    return Plan(
        promote=promote,
        drain=drain,
        return_to_warm=return_to_warm,
        deployment_replicas=desired_active + warm_size + len(still_draining),
        active=len(active),
        ready_active=sum(1 for p in active if p.ready),
        warm_ready=warm_ready,
        draining=len(still_draining),
    )
