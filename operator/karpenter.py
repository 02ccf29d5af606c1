"""What Karpenter says about a pool's NodePool, in the pool's words (pure: dicts in, text out).

Karpenter v1 writes two things on a NodePool that the pool's conditions repeat
(sigs.k8s.io/karpenter v1.14.1):

- ``status.conditions``: ``Ready``, which follows ``ValidationSucceeded`` and ``NodeClassReady``
  (``pkg/apis/v1/nodepool_status.go``), and ``NodeRegistrationHealthy``, which is not part of
  ``Ready``: False once nodes of the NodePool fail to launch or register
  (``pkg/controllers/nodeclaim/lifecycle/liveness.go``), said in NodePoolReady's message. A NodePool whose ``nodeClassRef`` the running cloud
  provider does not serve is skipped by every NodePool controller (``pkg/controllers/nodepool/
  readiness``: "Ignore NodePools which aren't using a supported NodeClass"): it never gets a
  condition, and no node is ever launched for it. A missing node class gives
  ``NodeClassReady=False`` (``NodeClassNotFound``).
- a ``FailedScheduling`` Warning Event (source ``karpenter``) on each pod it cannot place:
  "Failed to schedule pod, " and one error per NodePool joined by "; "
  (``pkg/controllers/provisioning/scheduling/events.go``, ``scheduler.go``), e.g. "no instance
  type has enough resources, requirements=..., resources={...}" for a pod larger than every
  instance type. The scheduler's own Event on the same pod only says the node selector matched
  no node.
- a ``NoCompatibleInstanceTypes`` Warning Event on the NodePool itself (in namespace ``default``,
  where client-go files the Events of cluster-scoped objects) when its requirements leave no
  instance type at all, "... due to minValues incompatibility" when a ``minValues`` is what does it
  (``events.go`` ``NoCompatibleInstanceTypes``, posted from ``NewScheduler`` at most once a minute
  per NodePool). The pod then hears only "nodepool requirements filtered out all available
  instance types", or nothing about this NodePool at all when others exist.
- ``status.resources``: the capacity of its nodes, launched or still launching
  (``pkg/controllers/nodepool/counter``). Before launching a node Karpenter checks it against
  ``spec.limits``; a pod that would cross the limit stays Pending, and what reaches the pod is a
  generic "no instance type has enough resources" or "all available instance types exceed limits
  for nodepool" (``pkg/controllers/provisioning/scheduling``), without the numbers.
"""

import datetime
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidegate.operator import names

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Readiness:
    """The NodePool as Karpenter reports it: ``ok`` (Ready=True), a CamelCase reason, a message."""

    ok: bool
    reason: str
    message: str


def _conditions(node_pool: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found = (node_pool.get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in found if isinstance(c, Mapping) and "type" in c}


def readiness(node_pool: Mapping[str, Any]) -> Readiness:
    """Karpenter's verdict on ``node_pool`` (the live object, with its ``status``).

    No conditions: Karpenter has not reconciled it (not running, or its cloud provider does not
    serve the ``nodeClassRef``). ``Ready`` not True: each condition that is False (or Unknown when
    none is False), with Karpenter's own reason and message.
    """
    name = node_pool.get("metadata", {}).get("name", "")
    ref = ((node_pool.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeClassRef") or {}
    ref_text = f"{ref.get('kind', '?')} {ref.get('name', '?')} ({ref.get('group', '?')})"
    conditions = _conditions(node_pool)
    if not conditions:
        return Readiness(
            False,
            "NotReconciled",
            f"Karpenter has not reconciled NodePool {name} (it has no status conditions): either Karpenter is "
            f"not running, or its cloud provider does not serve the node class {ref_text}, and then it "
            "launches no node for this pool",
        )
    ready = conditions.get("Ready")
    nodes = (node_pool.get("status") or {}).get("nodes")
    if ready is not None and ready.get("status") == "True":
        message = f"NodePool {name} is Ready in Karpenter ({nodes or 0} node(s))"
        registration = conditions.get("NodeRegistrationHealthy")
        if registration is not None and registration.get("status") == "False":
            # Not part of Karpenter's Ready: its nodes launch but fail to register (or to launch).
            message += (
                f", but NodeRegistrationHealthy=False ({registration.get('reason') or 'no reason'}: "
                f"{registration.get('message') or 'no message'}): its nodes fail to launch or join the cluster"
            )
        return Readiness(True, "Ready", message)
    others = [c for t, c in conditions.items() if t != "Ready"]
    failing = [c for c in others if c.get("status") == "False"] or [c for c in others if c.get("status") != "True"]
    if ready is not None and not failing:
        failing = [ready]
    details = "; ".join(
        f"{c['type']}={c.get('status', 'Unknown')} ({c.get('reason') or 'no reason'}: {c.get('message') or 'no message'})"
        for c in failing
    )
    return Readiness(
        False, "NotReady", f"Karpenter reports NodePool {name} not Ready: {details or 'no Ready condition'}"
    )


def gpu_count(value: Any) -> int | None:
    """A GPU quantity (``2``, ``"2"``) as an int; None for anything else (GPUs are whole devices)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def limit_reached(node_pool: Mapping[str, Any], pending_gpus: Iterable[int], placed_gpus: int) -> str | None:
    """Why pods wait, when the NodePool's ``nvidia.com/gpu`` limit is what holds them; else None.

    ``pending_gpus``: the GPUs each long-Pending pod of the pool needs; ``placed_gpus``: the GPUs
    of the pool's pods already on nodes. The NodePool's nodes (``status.resources``, launching
    ones included) that are not taken by placed pods are on their way to pending ones; the pods
    left over need a new node, and when the limit leaves less room than one pod needs,
    Karpenter launches none.
    """
    limit = gpu_count(((node_pool.get("spec") or {}).get("limits") or {}).get(GPU_RESOURCE))
    in_use = gpu_count(((node_pool.get("status") or {}).get("resources") or {}).get(GPU_RESOURCE, "0"))
    needs = sorted((n for n in pending_gpus if n > 0), reverse=True)
    if limit is None or in_use is None or not needs:
        return None
    spare = max(in_use - placed_gpus, 0)  # capacity launched or launching for pending pods
    waiting = []
    for need in needs:
        if spare >= need:
            spare -= need
        else:
            waiting.append(need)
    if not waiting or limit - in_use >= min(waiting):
        return None
    name = node_pool.get("metadata", {}).get("name", "")
    return (
        f"{len(waiting)} pod(s) Pending at the NodePool's {GPU_RESOURCE} limit: NodePool {name} allows "
        f"{limit} GPU(s) and {in_use} are in use, so Karpenter launches no node for a pod that needs "
        f"{min(waiting)} more (raise spec.nodePool.limits, or lower scaling.maxReplicas or warmPool.size)"
    )


def _when(event: Any) -> float:
    stamp = event.last_timestamp or event.event_time or event.first_timestamp
    return stamp.timestamp() if stamp else 0.0


NO_COMPATIBLE_INSTANCE_TYPES = "NoCompatibleInstanceTypes"
NO_COMPATIBLE_FRESH_S = 360.0
"""How long Karpenter's ``NoCompatibleInstanceTypes`` counts after it was last posted. Karpenter posts it
on each scheduling round while the NodePool's pods wait, at most once a minute (its DedupeTimeout),
and client-go's spam filter lets 25 through at once, then one every 300 s per object and reason
(``tools/record/events_cache.go``): seen with the real v1.14.1, every minute up to count 25, then
every 5 minutes."""


def filtered_out(
    events: Iterable[Any],
    node_pool: Mapping[str, Any],
    now_s: float,
    requirements: Iterable[Mapping[str, Any]] = (),
    capacity_types: Iterable[str] = (),
) -> str | None:
    """Why Karpenter launches nothing for ``node_pool``, when its requirements leave it no instance type;
    else None.

    ``events``: ``CoreV1Event`` s on NodePools (reason ``NoCompatibleInstanceTypes``). One counts when it
    is about this NodePool (the live object's ``metadata.uid``: a NodePool deleted and made again is
    another), was last posted within :data:`NO_COMPATIBLE_FRESH_S` of ``now_s`` (epoch seconds), and
    not before the NodePool's template last changed (:func:`template_changed_s`): Karpenter's word on
    requirements since fixed is no longer true, and it stops saying it. A word on ``minValues`` when
    no requirement has one is such a word.

    ``requirements``: the pool's ``spec.nodePool.requirements`` (dicts, in order); ``capacity_types``:
    its ``spec.nodePool.capacityTypes``. The text names the field to change: the entries with a
    ``minValues`` (by index) when Karpenter says minValues, else the requirements and capacity types.
    """
    uid = (node_pool.get("metadata") or {}).get("uid")
    if uid is None:
        return None
    since_s = max(now_s - NO_COMPATIBLE_FRESH_S, template_changed_s(node_pool))
    mine = [
        e
        for e in events
        if e.reason == NO_COMPATIBLE_INSTANCE_TYPES
        and e.involved_object is not None
        and e.involved_object.uid == uid
        and _when(e) >= since_s
    ]
    if not mine:
        return None
    said = max(mine, key=_when).message or "NodePool requirements filtered out all compatible instance types"
    if "minValues" in said:
        asked = [
            f"spec.nodePool.requirements[{i}] ({r.get('key')} minValues {r['minValues']})"
            for i, r in enumerate(requirements)
            if r.get("minValues") is not None
        ]
        if not asked:
            return None
        if len(asked) == 1:
            hint = (
                f"{asked[0]} asks for more distinct values than the instance types that meet every other "
                "requirement offer: lower its minValues, or widen the values it and the others allow"
            )
        else:
            hint = (
                f"one or more of {', '.join(asked)} ask for more distinct values than the instance types that "
                "meet every other requirement offer: lower their minValues, or widen the values they and the "
                "others allow"
            )
    else:
        types = ", ".join(capacity_types)
        hint = (
            "no instance type Karpenter offers for this NodeClass meets every spec.nodePool.requirements entry "
            f"and spec.nodePool.capacityTypes [{types}] at once, or none that does has capacity now: check "
            "their values (instance type names, GPU labels, zones, capacity types) against what the NodeClass "
            "offers, or widen them"
        )
    return f"{said} ({hint})"


def template_changed_s(node_pool: Mapping[str, Any]) -> float:
    """Epoch seconds at which the NodePool's ``spec.template`` last changed, as the operator stamped it
    (``tidegate.dev/template-changed-at``, :func:`tidegate.operator.builders.nodepool.stamp_template`);
    0 when not stamped. Not ``metadata.managedFields``: any write (a label, raised limits) moves those."""
    stamp = ((node_pool.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_TEMPLATE_CHANGED)
    try:
        return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp() if stamp else 0.0
    except ValueError:
        return 0.0


def cannot_place(events: Iterable[Any], node_pool: str | None = None, since_s: float = 0.0) -> dict[str, str]:
    """Karpenter's latest ``FailedScheduling`` message per pod uid, reduced to what it says of the pod's
    own NodePool (``node_pool``, its name), when posted at or after ``since_s`` (epoch seconds: when the
    NodePool's template last changed, :func:`template_changed_s`). Karpenter tells a pod at most once every
    five minutes whatever it has to say (its DedupeTimeout per pod), so after requirements are fixed
    its older word on the pod outlives the mistake.

    ``events``: ``CoreV1Event`` s of pods posted by Karpenter. The errors for other NodePools (their
    requirements never match a pod that selects this NodePool, and a clause naming another
    ``NodePool=...``, such as its limits) are left out, and so is the long ``requirements=`` list;
    ``resources=`` (what the pod asks for) stays. A pod of whom Karpenter said only things about other
    NodePools has no entry (seen with the real Karpenter v1.14.1: a pool whose node class was missing
    was told another NodePool's "exceed limits").
    """
    latest: dict[str, Any] = {}
    for event in events:
        uid = event.involved_object.uid if event.involved_object else None
        if _when(event) < since_s:
            continue
        if uid and (uid not in latest or _when(event) >= _when(latest[uid])):
            latest[uid] = event
    found = {}
    for uid, event in latest.items():
        text = (event.message or "").removeprefix("Failed to schedule pod, ")
        # A requirement mismatch ("incompatible requirements, key K, ... not in ...", one "key" part per
        # key) is another NodePool's: the pool's pods select their own NodePool's nodes.
        every = text.split("; ")
        mine = [p for p in every if not _names_another(p, node_pool)]
        parts = [p for p in mine if not p.startswith(("incompatible requirements, key ", "key "))]
        if not parts and len(mine) < len(every):
            continue
        parts = parts or [text]
        found[uid] = "; ".join(re.sub(r"requirements=.*?, (resources=)", r"\1", p) for p in parts)
    return found


def _names_another(part: str, node_pool: str | None) -> bool:
    """Whether one clause of Karpenter's message names a ``NodePool=`` other than ``node_pool``."""
    named = re.search(r"NodePool=([^\s),;]+)", part)
    return node_pool is not None and named is not None and named.group(1) != node_pool
