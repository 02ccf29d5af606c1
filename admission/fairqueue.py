"""A bounded weighted-fair queue across tenants by token cost (self-clocked fair queueing).

Each flow (tenant account, priority class) has weight ``tenant.weight x class.weight`` (the
account: ``Ticket.account``, one for all unlisted tenants under ``unlistedTenants: shared``). A request of
cost ``c`` arriving on a flow gets ``start = max(V, last_finish(flow))`` and
``finish = start + c / weight``; the queue serves the smallest finish tag first and sets the
virtual time ``V`` to the finish tag of what it serves (Golestani, "A Self-Clocked Fair Queueing
Scheme for Broadband Applications", INFOCOM 1994). Under backlog, tokens served per unit weight of
any two flows differ by at most ``c_max_i / w_i + c_max_j / w_j`` — the margin the fairness
property test checks.

Shorter work first, with ageing: among flows, a short request (small ``c / weight``) is served
before a long one that started at the same virtual time, but because ``V`` advances with every
request served, a long request is overtaken by at most its own ``c / weight`` of other flows'
work and is never starved (ordering by finish tag with ``V`` = the last *start* tag would let a
stream of new tenants overtake it forever). Within a flow, requests keep their arrival order.

Demoted requests (their tenant was over ``borrowingCap`` x its fair share on arrival) form a
lower band: every normal request is offered before any demoted one, and a demoted request is
promoted back (keeping its tags) as soon as its tenant is within its share again, so demotion can
delay a tenant but never starve it.

The queue only orders; the engine decides what fits (:meth:`FairQueue.candidates` yields the
head of each (band, class) in service order). Removal is lazy (a ticket that left the queue is
skipped when it surfaces), so cancel and expiry are O(1) and pops O(log n).

Pure: no I/O, no clock.
"""

import heapq
from collections.abc import Callable, Iterator

from tidegate.admission.reasons import Outcome
from tidegate.admission.ticket import Ticket, TicketState

_Key = tuple[int, int]  # (band: 0 normal / 1 demoted, class rank)


class FairQueue:
    """Queued tickets ordered by (band, finish tag), per class; see the module docstring."""

    def __init__(self) -> None:
        self._heaps: dict[_Key, list[tuple[float, int, Ticket]]] = {}
        self._last_finish: dict[tuple[str, str], float] = {}
        self._queued_per_flow: dict[tuple[str, str], int] = {}
        self.virtual_time = 0.0
        self.depth = 0
        self.tokens = 0
        self._seq = 0

    def peek_finish(self, account: str, priority: str, tokens: int, weight: float) -> float:
        """The finish tag a request of ``account``'s flow would get now (nothing changes)."""
        start = max(self.virtual_time, self._last_finish.get((account, priority), 0.0))
        return start + tokens / weight

    def tag(self, ticket: Ticket, weight: float) -> None:
        """Give ``ticket`` its start and finish tags on its flow (also for direct admissions)."""
        flow = (ticket.account, ticket.priority)
        start = max(self.virtual_time, self._last_finish.get(flow, 0.0))
        ticket.start_tag = start
        ticket.finish_tag = start + ticket.reserved_tokens / weight
        self._last_finish[flow] = ticket.finish_tag
        self._seq += 1
        ticket.seq = self._seq

    def push(self, ticket: Ticket) -> None:
        """Queue a tagged ticket."""
        key = (int(ticket.demoted), ticket.rank)
        heapq.heappush(self._heaps.setdefault(key, []), (ticket.finish_tag, ticket.seq, ticket))
        flow = (ticket.account, ticket.priority)
        self._queued_per_flow[flow] = self._queued_per_flow.get(flow, 0) + 1
        self.depth += 1
        self.tokens += ticket.reserved_tokens

    def served(self, ticket: Ticket) -> None:
        """``ticket`` starts service (directly or from the queue): the virtual time moves to its finish tag."""
        self.virtual_time = max(self.virtual_time, ticket.finish_tag)

    def left(self, ticket: Ticket, served: bool) -> None:
        """``ticket`` (queued) left the queue; call before changing its state.

        A request that leaves unserved (cancelled, expired, displaced) and was its flow's latest
        gives its virtual time back, so a tenant is not charged for work never done.
        """
        self.depth -= 1
        self.tokens -= ticket.reserved_tokens
        flow = (ticket.account, ticket.priority)
        if not served and self._last_finish.get(flow) == ticket.finish_tag:
            self._last_finish[flow] = ticket.start_tag
        remaining = self._queued_per_flow[flow] - 1
        if remaining:
            self._queued_per_flow[flow] = remaining
        else:
            del self._queued_per_flow[flow]
            if self._last_finish.get(flow, 0.0) <= self.virtual_time:
                self._last_finish.pop(flow, None)

    def candidates(self, still_demoted: Callable[[Ticket], bool]) -> Iterator[Ticket]:
        """Heads of each (band, class), in service order (band, then finish tag).

        A demoted head whose tenant is back within its share (``still_demoted`` false) is promoted
        to the normal band first, so demotion lasts only while the tenant is over its share.
        """
        for key in [k for k in self._heaps if k[0] == 1]:
            heap = self._heaps[key]
            while heap:
                ticket = heap[0][2]
                if ticket.state is TicketState.QUEUED and still_demoted(ticket):
                    break
                heapq.heappop(heap)
                if ticket.state is TicketState.QUEUED:
                    ticket.outcome = Outcome.ADMIT
                    heapq.heappush(self._heaps.setdefault((0, key[1]), []), (ticket.finish_tag, ticket.seq, ticket))
        heads = []
        for key, heap in self._heaps.items():
            while heap and heap[0][2].state is not TicketState.QUEUED:
                heapq.heappop(heap)
            if heap:
                finish, seq, ticket = heap[0]
                heads.append((key[0], finish, seq, ticket))
        heads.sort(key=lambda h: h[:3])
        for head in heads:
            yield head[3]

    def pop(self, ticket: Ticket) -> None:
        """Take the head ``ticket`` (from :meth:`candidates`) out of its heap."""
        heap = self._heaps[(int(ticket.demoted), ticket.rank)]
        _, _, top = heapq.heappop(heap)
        assert top is ticket, "pop() takes the head yielded by candidates()"
        self.left(ticket, served=True)
        self.served(ticket)

    def queued(self) -> Iterator[Ticket]:
        """Every queued ticket (any order)."""
        for heap in self._heaps.values():
            for _, _, ticket in heap:
                if ticket.state is TicketState.QUEUED:
                    yield ticket

    def ahead_of(self, demoted: bool, finish_tag: float) -> tuple[int, int]:
        """(tokens, requests) queued that would be served before a request with these tags."""
        tokens = requests = 0
        band = int(demoted)
        for ticket in self.queued():
            if (int(ticket.demoted), ticket.finish_tag) < (band, finish_tag):
                tokens += ticket.reserved_tokens
                requests += 1
        return tokens, requests

    def lowest_priority(self) -> Ticket | None:
        """The queued ticket to displace first: lowest class, demoted first, newest."""
        worst: Ticket | None = None
        for ticket in self.queued():
            key = (ticket.rank, ticket.demoted, ticket.finish_tag, ticket.seq)
            if worst is None or key > (worst.rank, worst.demoted, worst.finish_tag, worst.seq):
                worst = ticket
        return worst

    def compact(self) -> None:
        """Drop flows that are idle and behind the virtual time (bounded memory)."""
        stale = [
            flow
            for flow, finish in self._last_finish.items()
            if finish <= self.virtual_time and flow not in self._queued_per_flow
        ]
        for flow in stale:
            del self._last_finish[flow]
