"""Unlisted tenants (``tenancy.unlistedTenants``): a client rotating its tenant name cannot escape
the default quota under ``shared``; ``separate`` gives every name its own copy of it."""

import pytest

from tidegate.admission.breaker import Completion
from tidegate.admission.reasons import Reason
from tidegate.admission.tenants import UNLISTED
from tidegate.admission.ticket import TicketState
from tidegate.api.admission import UnlistedTenants
from tidegate.api.serving import ModelSpec

from .helpers import FakeClock, admission, engine, tokens

ONE_CLASS = {"priorityClasses": [{"name": "std", "ttftSloMs": 600_000}], "defaultPriorityClass": "std"}
ROTATING = [f"rotating-{i}" for i in range(6)]


def test_shared_is_the_default() -> None:
    assert admission().tenancy.unlisted_tenants is UnlistedTenants.SHARED
    assert admission().tenancy.require_identity is False


def test_rotating_names_share_one_concurrency_cap() -> None:
    e = engine(tokenBudget=100_000, maxConcurrency=100, tenancy={"default": {"maxConcurrency": 4}})
    tickets = [e.submit(name, None, tokens(10)) for name in ROTATING]
    assert [t.state for t in tickets] == [TicketState.ADMITTED] * 4 + [TicketState.REJECTED] * 2
    refused = tickets[4]
    assert refused.reason is Reason.TENANT_CONCURRENCY
    assert "unlisted tenants" in refused.message and "rotating-4" in refused.message
    assert refused.tenant == "rotating-4"  # counted under the name sent
    assert e.counters.tenants["rotating-4"].policy_rejected == 1
    early = e.precheck("yet-another", None)  # the fast no knows the shared count too
    assert early is not None and early.reason is Reason.TENANT_CONCURRENCY
    e.release(tickets[0], Completion.SUCCESS)
    assert e.submit("rotating-5", None, tokens(10)).state is TicketState.ADMITTED


def test_rotating_names_share_one_token_bucket() -> None:
    clock = FakeClock()
    e = engine(clock, tokenBudget=100_000, tenancy={"default": {"tokensPerSecond": 100, "burstTokens": 1000}})
    first = e.submit("a", None, tokens(600))
    e.release(first, Completion.SUCCESS)
    refused = e.submit("b", None, tokens(600))  # a new name, but the same bucket: 400 left
    assert refused.reason is Reason.TENANT_RATE
    assert refused.retry_after_s == pytest.approx(2.0)  # 200 tokens short at 100 tokens/s
    clock.advance(2.0)
    assert e.submit("c", None, tokens(600)).state is TicketState.ADMITTED


def test_rotating_names_share_one_in_flight_token_cap() -> None:
    e = engine(tokenBudget=100_000, tenancy={"default": {"maxInFlightTokens": 500}})
    assert e.submit("a", None, tokens(400)).state is TicketState.ADMITTED
    refused = e.submit("b", None, tokens(200))
    assert refused.reason is Reason.TENANT_CONCURRENCY and "500" in refused.message


def test_separate_gives_each_unlisted_name_its_own_default_quota() -> None:
    e = engine(
        tokenBudget=100_000, maxConcurrency=100,
        tenancy={"default": {"maxConcurrency": 4}, "unlistedTenants": "separate"},
    )  # fmt: skip
    tickets = [e.submit(name, None, tokens(10)) for name in ROTATING]
    assert all(t.state is TicketState.ADMITTED for t in tickets)
    assert {t.account for t in tickets} == set(ROTATING)
    more = [e.submit("rotating-0", None, tokens(10)) for _ in range(4)]
    assert [t.state for t in more] == [TicketState.ADMITTED] * 3 + [TicketState.REJECTED]


def test_listed_tenants_keep_their_own_quota_beside_the_shared_one() -> None:
    e = engine(
        tokenBudget=100_000, maxConcurrency=100,
        tenancy={"default": {"maxConcurrency": 2}, "tenants": [{"name": "search", "maxConcurrency": 3},
                                                               {"name": "bot", "maxConcurrency": 1}]},
    )  # fmt: skip
    unlisted = [e.submit(name, None, tokens(10)) for name in ("x", "y", "z")]
    assert [t.state for t in unlisted] == [TicketState.ADMITTED] * 2 + [TicketState.REJECTED]
    search = [e.submit("search", None, tokens(10)) for _ in range(4)]
    assert [t.state for t in search] == [TicketState.ADMITTED] * 3 + [TicketState.REJECTED]
    assert "tenant 'search'" in search[3].message
    assert e.submit("bot", None, tokens(10)).state is TicketState.ADMITTED  # not search's, not the shared one
    assert e.tenants.states[UNLISTED].accepted == 2


def test_unlisted_names_are_one_flow_in_the_fair_queue() -> None:
    def dispatch_order(unlisted: str) -> list[str]:
        e = engine(
            tokenBudget=100, maxConcurrency=100, queue={"maxWaitMs": 600_000},
            tenancy={"unlistedTenants": unlisted, "tenants": [{"name": "paid"}], "borrowingCap": 10}, **ONE_CLASS,
        )  # fmt: skip
        running = e.submit("paid", None, tokens(100))
        for i in range(4):
            e.submit(f"u{i}", None, tokens(100))
        for _ in range(4):
            e.submit("paid", None, tokens(100))
        order = []
        ticket = running
        for _ in range(4):
            e.release(ticket, Completion.SUCCESS)
            (ticket,) = e.take_settled()
            order.append(ticket.tenant)
        return order

    shared = dispatch_order("shared")
    assert shared.count("paid") == 2  # weight 1 against weight 1: turn about
    assert dispatch_order("separate").count("paid") <= 1  # four unlisted weights against one


def test_a_reload_that_lists_a_name_releases_where_it_was_taken() -> None:
    spec = {"tokenBudget": 100_000, "tenancy": {"default": {"maxConcurrency": 1}}}
    e = engine(**spec)
    taken = e.submit("a", None, tokens(10))
    assert taken.account == UNLISTED
    listed = admission(**{**spec, "tenancy": {"default": {"maxConcurrency": 1}, "tenants": [{"name": "a"}]}})
    e.reconfigure(listed, ModelSpec(name="m", max_context_tokens=32768))
    assert e.submit("a", None, tokens(10)).state is TicketState.ADMITTED  # its own account now
    e.release(taken, Completion.SUCCESS)
    assert e.tenants.states[UNLISTED].accepted == 0
    assert e.tenants.states["a"].accepted == 1
    assert e.submit("b", None, tokens(10)).state is TicketState.ADMITTED  # the shared slot came back
