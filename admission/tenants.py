"""Per-tenant policy state: a concurrency count held until the response ends, and a token bucket.

- **Concurrency** counts requests accepted (queued or in flight) and is decremented only when the
  request is released, cancelled or refused from the queue: it is not a refilling bucket. The
  same holds for **in-flight tokens** (``maxInFlightTokens``: the tenant's share of the KV cache).
- **Token rate**: a bucket of ``burstTokens`` (default 10 s of ``tokensPerSecond``) refilling at
  ``tokensPerSecond``. Accepting a request takes its reserved tokens; releasing it refunds what was
  reserved but not used (usage reported by the backend, else the reservation: never zero), so the
  tenant is charged by usage. A request larger than the whole bucket can never pass: refused as
  ``request_too_large``, not ``tenant_rate``.

Idle tenants (nothing accepted, bucket full, unused for a while) hold no state:
:meth:`TenantBook.prune` drops them, so state is bounded by recently active tenants, not by every
tenant ever seen (keeping recent ones spares the churn of re-creating them on every request).

Accounts: state is kept per *account*, the key a request is charged to. A listed tenant is its own
account; every unlisted name is the one :data:`UNLISTED` account under ``unlistedTenants: shared``
(the default: one concurrency count, bucket, in-flight token count and fair-queue flow for all of
them together, so rotating the header value cannot multiply the default quota), or its own account
under ``separate``. A ticket keeps the account it was charged to (``Ticket.account``), so a config
reload that moves a name between accounts releases each request where it was taken.

Pure: times are passed in.
"""

from dataclasses import dataclass, field

from tidegate.api.admission import TenancySpec, TenantPolicy, UnlistedTenants

UNLISTED = ",unlisted"
"""The account of unlisted tenants under ``unlistedTenants: shared``: a comma is never part of a
tenant name (the API refuses one, the sidecar refuses such a header), so no tenant can be it."""


def burst_tokens(policy: TenantPolicy) -> float:
    """Bucket size in tokens (``inf`` when the tenant has no rate limit)."""
    if policy.tokens_per_second is None:
        return float("inf")
    return float(policy.burst_tokens or 10.0 * policy.tokens_per_second)


@dataclass(slots=True)
class TenantState:
    """Live state of one tenant. ``accepted`` / ``accepted_tokens``: requests (and their reserved
    tokens) queued or in flight; ``running_tokens``: reserved tokens of its admitted requests."""

    policy: TenantPolicy
    accepted: int = 0
    accepted_tokens: int = 0
    running_tokens: int = 0
    bucket_tokens: float = float("inf")
    bucket_at_s: float = 0.0
    used_at_s: float = 0.0
    last_cost: int = 1  # reserved tokens of its last accepted request (a guess at the next one's cost)

    def refill(self, now: float) -> float:
        """Bring the bucket up to ``now``; returns the tokens available."""
        rate = self.policy.tokens_per_second
        if rate is None:
            self.bucket_tokens = float("inf")
        else:
            burst = burst_tokens(self.policy)
            self.bucket_tokens = min(burst, self.bucket_tokens + rate * max(0.0, now - self.bucket_at_s))
        self.bucket_at_s = now
        return self.bucket_tokens

    def rate_wait_s(self, tokens: int, now: float) -> float:
        """Seconds until the bucket holds ``tokens`` (0 when it does now)."""
        available = self.refill(now)
        if available >= tokens:
            return 0.0
        return (tokens - available) / (self.policy.tokens_per_second or 1.0)

    def take(self, tokens: int, now: float) -> None:
        """Take ``tokens`` from the bucket (the caller checked :meth:`rate_wait_s`)."""
        self.refill(now)
        self.bucket_tokens -= tokens

    def give_back(self, tokens: int, now: float) -> None:
        """Refund ``tokens`` (unused reservation, or a request that never ran)."""
        self.refill(now)
        self.bucket_tokens = min(burst_tokens(self.policy), self.bucket_tokens + tokens)

    def idle(self, now: float) -> bool:
        """Nothing accepted and the bucket full: the state can be forgotten."""
        return self.accepted == 0 and self.refill(now) >= burst_tokens(self.policy)


@dataclass(slots=True)
class TenantBook:
    """Policies by tenant name and the state of active accounts (module docstring)."""

    spec: TenancySpec
    states: dict[str, TenantState] = field(default_factory=dict)
    _policies: dict[str, TenantPolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.reconfigure(self.spec)

    def reconfigure(self, spec: TenancySpec) -> None:
        """New policies apply at once; live counts are kept, buckets are clamped to the new burst."""
        self.spec = spec
        self._policies = {t.name: t for t in spec.tenants}
        for name, state in self.states.items():
            state.policy = self.policy(name)
            state.bucket_tokens = min(state.bucket_tokens, burst_tokens(state.policy))

    def account(self, tenant: str) -> str:
        """The account ``tenant`` is charged to: its own name when listed or under ``separate``,
        else :data:`UNLISTED`."""
        if tenant in self._policies or self.spec.unlisted_tenants is UnlistedTenants.SEPARATE:
            return tenant
        return UNLISTED

    def policy(self, account: str) -> TenantPolicy:
        """The account's own policy (a listed tenant), else the default."""
        return self._policies.get(account, self.spec.default)

    def state(self, account: str, now: float) -> TenantState:
        """The account's live state, created (bucket full) on first use."""
        state = self.states.get(account)
        if state is None:
            policy = self.policy(account)
            state = TenantState(policy=policy, bucket_tokens=burst_tokens(policy), bucket_at_s=now)
            self.states[account] = state
        state.used_at_s = now
        return state

    @staticmethod
    def describe(account: str, tenant: str) -> str:
        """How refusal messages name the account: the tenant, or the unlisted tenants together."""
        if account == UNLISTED:
            return f"unlisted tenants (sharing the default policy; this one {tenant!r})"
        return f"tenant {tenant!r}"

    def prune(self, now: float, unused_for_s: float = 0.0) -> int:
        """Forget tenants idle and unused for ``unused_for_s``; returns how many were dropped."""
        horizon = now - unused_for_s
        idle = [name for name, state in self.states.items() if state.used_at_s <= horizon and state.idle(now)]
        for name in idle:
            del self.states[name]
        return len(idle)
