"""Decision cost of the pure admission engine with 1, 100 and 10,000 tenants.

Scenarios (fake clock advancing 1 ms per request, one process, one core):

- ``admit+release``: the common path: the request fits, is admitted directly, then released;
- ``queued``: a replica kept full (budget for 32 requests in flight, 64 waiting): every request
  is queued, dispatched in weighted-fair order when one in flight is released;
- ``refuse (rate)``: every tenant is over its token rate: the fast no (429).

Reported: CPU microseconds per request (submit + its release or refusal; ``time.process_time``, so
other processes on a shared machine do not count), the best of ``--repeat`` runs,
and the ratio to the 1-tenant figure (target, issue 3: <= 1.2x with 10,000 tenants).

Not a test and not a CI gate. Run: ``.venv/bin/python bench/admission_engine.py [--requests 100000] [--repeat 5]``
"""

import argparse
import collections
import time

from tidegate.admission.breaker import Completion
from tidegate.admission.cost import RequestCost
from tidegate.admission.engine import Engine
from tidegate.admission.ticket import TicketState
from tidegate.api.admission import AdmissionSpec
from tidegate.api.serving import ModelSpec

COST = RequestCost.fixed(200, 300)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _engine(clock: Clock, tenants: int, scenario: str) -> Engine:
    spec: dict = {
        "tokenBudget": 100_000_000, "maxConcurrency": 100_000,
        "priorityClasses": [{"name": "std", "ttftSloMs": 3_600_000}], "defaultPriorityClass": "std",
        "queue": {"maxDepth": 64, "maxWaitMs": 600_000},
        # separate: the names past the listed 1,000 keep a state each (shared would fold them into one)
        "tenancy": {"tenants": [{"name": f"t{i}", "weight": 1 + i % 4} for i in range(min(tenants, 1000))],
                    "unlistedTenants": "separate"},
    }  # fmt: skip
    if scenario == "queued":
        spec["tokenBudget"] = 32 * COST.reserved_tokens
    if scenario == "refuse (rate)":
        spec["tenancy"]["default"] = {"tokensPerSecond": 1, "burstTokens": COST.reserved_tokens}
        spec["tenancy"]["tenants"] = []
    return Engine(AdmissionSpec.model_validate(spec), ModelSpec(name="m", max_context_tokens=32768), clock)


def run(tenants: int, scenario: str, requests: int) -> float:
    """Microseconds per request."""
    clock = Clock()
    engine = _engine(clock, tenants, scenario)
    names = [f"t{i}" for i in range(tenants)]
    in_flight: collections.deque = collections.deque()
    if scenario == "refuse (rate)":
        for name in names:  # empty every tenant's bucket first
            engine.release(engine.submit(name, None, COST), Completion.SUCCESS)
    started = time.process_time()
    for i in range(requests):
        clock.now += 0.001
        ticket = engine.submit(names[i % tenants], None, COST)
        if scenario == "admit+release":
            engine.release(ticket, Completion.SUCCESS, used_tokens=400)
        elif scenario == "queued":
            if ticket.state is TicketState.ADMITTED:
                in_flight.append(ticket)
            while engine.queue.depth >= 64 and in_flight:
                engine.release(in_flight.popleft(), Completion.SUCCESS, used_tokens=400)
                in_flight.extend(engine.take_settled())
        elif ticket.state is not TicketState.REJECTED:
            raise AssertionError(f"expected a refusal, got {ticket.state}")
        if i % 100 == 0:
            engine.tick()
    elapsed = time.process_time() - started
    return elapsed / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tenants", type=int, nargs="+", default=[1, 100, 10_000])
    args = parser.parse_args()
    print(f"{'scenario':<16}{'tenants':>9}{'us/request':>12}{'vs 1 tenant':>13}")
    for scenario in ("admit+release", "queued", "refuse (rate)"):
        base = None
        for tenants in args.tenants:
            cost = min(run(tenants, scenario, args.requests) for _ in range(args.repeat))
            base = base or cost
            print(f"{scenario:<16}{tenants:>9}{cost:>12.2f}{cost / base:>12.2f}x")


if __name__ == "__main__":
    main()
