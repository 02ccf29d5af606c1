"""A ticket: one request's passage through the admission engine.

Life cycle (every arrow is one engine call; nothing else moves a ticket)::

    submit ──> ADMITTED ──release──> RELEASED
       │          ▲
       ├──> QUEUED ┤ (dispatch)
       │          ├──cancel──> CANCELLED          (client gone while queued: never dispatched)
       │          └──expire / displace / breaker open──> REJECTED
       └──> REJECTED

An admitted ticket is released exactly once; a second release raises
:class:`TicketStateError`. ``retry_after_s`` is set on every capacity or policy rejection that a
retry can cure, computed from real drain, refill or cooldown time (never below 0; the proxy rounds
it up to whole seconds >= 1).

Pure data: no I/O.
"""

from dataclasses import dataclass
from enum import StrEnum

from tidegate.admission.cost import RequestCost
from tidegate.admission.reasons import Outcome, Reason


class TicketState(StrEnum):
    """Where a ticket is in its life cycle."""

    QUEUED = "queued"
    ADMITTED = "admitted"
    REJECTED = "rejected"
    RELEASED = "released"
    CANCELLED = "cancelled"


class TicketStateError(Exception):
    """An engine call on a ticket in the wrong state (e.g. a second release)."""


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's admission record (see the module docstring)."""

    id: int
    tenant: str
    priority: str
    cost: RequestCost
    submitted_at_s: float
    deadline_s: float = float("inf")
    state: TicketState = TicketState.REJECTED
    outcome: Outcome = Outcome.REJECT
    reason: Reason | None = None
    message: str = ""
    code: str | None = None
    retry_after_s: float | None = None
    admitted_at_s: float | None = None
    released_at_s: float | None = None
    probe_epoch: int | None = None
    charged_tokens: int = 0
    # weighted fair queueing tags (virtual time, tokens / weight)
    rank: int = 0
    start_tag: float = 0.0
    finish_tag: float = 0.0
    seq: int = 0
    reserved_tokens: int = 0  # tokens this request holds while admitted (``cost.reserved_tokens``)
    prefilling: bool = False  # admitted and no first token yet (batch-composition control)
    prefill_work_tokens: int = 0  # prompt tokens prefilling here when admitted, its own included (breaker)
    ttft_judged: bool = False  # the breaker took its TTFT at the first token (not again at release)
    account: str = ""  # the tenant state it is charged to (``tenants.TenantBook.account``; "" = ``tenant``)

    def __post_init__(self) -> None:
        self.reserved_tokens = self.cost.reserved_tokens
        if not self.account:
            self.account = self.tenant

    @property
    def demoted(self) -> bool:
        """Over its fair share when it arrived: queued behind others."""
        return self.outcome is Outcome.ADMIT_DEMOTED

    @property
    def settled(self) -> bool:
        """No longer waiting: admitted, refused, released or cancelled."""
        return self.state is not TicketState.QUEUED
