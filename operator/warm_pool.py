"""The warm pool planner: which pods to promote, drain or return, and how many the Deployment needs.

Pure and level-triggered: given the pool's pods as observed now, return the actions that move
them toward ``desired_active`` active pods plus ``warm_size`` ready, loaded warm pods (serving
too when ``spec.warmPool.serve``). Applying a plan and planning again yields an empty plan once
converged.

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
- Every pod carries ``tidegate.dev/serving`` (the Service's selector): ``"true"`` when active, or
  warm under ``serve``; ``"false"`` when draining, or warm without it. A pod whose label (or lack
  of one) differs from its role after the plan is listed in ``Plan.label_serving``, relabelled pods
  included, so the label changes in the same reconcile and the same patch as the role.
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
    serving: str | None = None  # its tidegate.dev/serving label as observed; None: not labelled


@dataclass(frozen=True)
class Plan:
    """Actions for one reconcile, and the counts the status reports."""

    promote: list[str] = field(default_factory=list)  # warm or draining -> active
    drain: list[str] = field(default_factory=list)  # active -> draining
    return_to_warm: list[str] = field(default_factory=list)  # draining -> warm
    label_serving: dict[str, bool] = field(default_factory=dict)  # pod -> its new tidegate.dev/serving
    deployment_replicas: int = 0
    active: int = 0  # pods that will be active after the plan
    ready_active: int = 0
    warm_ready: int = 0
    draining: int = 0

    @property
    def empty(self) -> bool:
        return not (self.promote or self.drain or self.return_to_warm or self.label_serving)


def serves(role: str, serve: bool) -> bool:
    """Whether a pod in ``role`` belongs in the Service: active always, warm (or unlabelled) only
    under ``spec.warmPool.serve``, draining never."""
    if role == constants.ROLE_ACTIVE:
        return True
    return serve and role != constants.ROLE_DRAINING


def serving_selector_safe(pods: Iterable[PodView]) -> bool:
    """Whether the Service may select ``tidegate.dev/serving=true`` rather than ``role=active``.

    True once every live active pod is observed carrying ``serving="true"`` (always, for a pool
    with no active pod), so the switch never drops a pod the ``role=active`` selector holds: after
    an operator upgrade, the pods are labelled in one reconcile and the selector switches in a later
    one, when the labels are read back from the API server. Pure.
    """
    return all(p.serving == "true" for p in pods if not p.deleting and p.role == constants.ROLE_ACTIVE)


def plan(
    pods: Iterable[PodView],
    desired_active: int,
    warm_size: int,
    now_s: float,
    drain_timeout_s: float,
    serve: bool = False,
) -> Plan:
    """Plan one reconcile step (see the module docstring for the rules).

    ``desired_active`` and ``warm_size`` are ``spec.replicas`` and ``spec.warmPool.size``; ``serve``
    is ``spec.warmPool.serve``; ``now_s`` is Unix seconds; raises ``ValueError`` on negative counts.
    """
    if desired_active < 0 or warm_size < 0:
        raise ValueError("desired_active and warm_size must be >= 0")
    live = [p for p in pods if not p.deleting]
    by_name = {p.name: p for p in live}
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

    new_role = {p.name: constants.ROLE_ACTIVE for p in active}
    new_role |= {p.name: constants.ROLE_DRAINING for p in still_draining}
    new_role |= {n: constants.ROLE_WARM for n in return_to_warm}
    label_serving = {}
    for name, view in by_name.items():
        want = serves(new_role.get(name, view.role), serve)
        if view.serving != ("true" if want else "false"):
            label_serving[name] = want

    warm_ready = sum(1 for p in warm if p.ready) + sum(1 for p in draining if p.name in return_to_warm and p.ready)
    return Plan(
        promote=promote,
        drain=drain,
        return_to_warm=return_to_warm,
        label_serving=label_serving,
        deployment_replicas=desired_active + warm_size + len(still_draining),
        active=len(active),
        ready_active=sum(1 for p in active if p.ready),
        warm_ready=warm_ready,
        draining=len(still_draining),
    )


@dataclass(frozen=True)
class AfterDrain:
    """Where the replicas that finished draining this reconcile go (pod names)."""

    returned: list[str]  # kept as warm replicas
    removed: list[str]  # the warm pool is full: the ReplicaSet deletes these
    room: int  # warm replicas the warm pool still lacked (>= 0)


def after_drain(views: list[PodView], plan: Plan, warm_size: int) -> AfterDrain:
    """Split ``plan.return_to_warm`` into the replicas the warm pool keeps and those it has no room for.

    The planner relabels every drained replica ``warm`` and lowers the Deployment by as many, so a
    pool that shrinks by more replicas than its warm pool lacks deletes the surplus. The
    ReplicaSet deletes not-Ready pods first and then the lowest pod-deletion-cost (kube-controller
    -manager's ``ActivePodsWithRanks``; https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/#pod-deletion-cost).
    The room is the warm pool's size less its Ready warm replicas (a loading one goes before any
    Ready one); drained replicas fill it Ready first, then longest-lived, and the rest keep the
    draining cost, so they are the Ready pods deleted. Pure.
    """
    promoted = set(plan.promote)
    ready_warm = sum(
        1
        for v in views
        if v.ready
        and not v.deleting
        and v.name not in promoted
        and v.role not in (constants.ROLE_ACTIVE, constants.ROLE_DRAINING)
    )
    room = max(0, warm_size - ready_warm)
    by_name = {v.name: v for v in views}
    drained = sorted(
        plan.return_to_warm, key=lambda n: (not by_name[n].ready, by_name[n].created_s) if n in by_name else (True, 0.0)
    )
    return AfterDrain(returned=drained[:room], removed=drained[room:], room=room)


def serving_labels(plan: Plan, removed: Iterable[str] = ()) -> dict[str, bool]:
    """The ``tidegate.dev/serving`` labels to write this reconcile: ``plan.label_serving``, except that a
    drained pod the warm pool has no room for (``removed``, :func:`after_drain`) stays ``false``: the
    ReplicaSet deletes it next, so it does not re-enter the Service. Pure."""
    gone = set(removed)
    return plan.label_serving | {n: False for n in gone if n in plan.label_serving}
