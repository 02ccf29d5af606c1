"""Signal source ``prometheus``: the same observation, from PromQL over the sidecars' metrics.

For pools whose ``spec.scaling.signal.source`` is ``prometheus`` (metadata ``source`` and
``prometheusUrl``). The pool's pods still come from the pod source (current, starting and warm
replicas are Kubernetes facts); rates and gauges come from Prometheus, per pod, with ``W`` =
``windowSeconds`` and ``S`` = ``{namespace="<ns>", pod=~"<the pool's pods in the Service>"}``: the
active pods and the Ready warm ones labelled serving (``spec.warmPool.serve``), whose load counts
as in :func:`tidegate.scaler.rates.observe` (the active replicas are sized for it)::

    sum by (pod) (rate(tidegate_admission_decisions_total{S, decision=~"admit|admit_demoted"}[W]))
    sum by (pod) (rate(tidegate_admission_decisions_total{S, decision="reject", reason=~"<capacity>"}[W]))
    sum by (pod) (rate(tidegate_admission_decisions_total{S, decision="reject", reason=~"<policy>"}[W]))
    count(sum by (tenant) (increase(tidegate_admission_decisions_total{S, decision="reject", reason=~"<capacity>"}[W])) > 0)
    sum by (pod) (tidegate_admission_in_flight_tokens{S})      (and _token_budget, _queue_depth)
    max by (pod) (timestamp(tidegate_admission_token_budget{S}))     freshness
    min by (pod) (min_over_time(tidegate_admission_started_at_seconds{S}[W]))     each pod's share of W

``rate()`` already handles counter resets and pods coming and going, and counts a pod that joined
within the window over the whole window (its increase over ``W``: Prometheus extrapolates a series
that starts inside the range by at most half a scrape interval), so the summed rates are the pool's.
The per-replica rate ``A / n`` then counts such a pod as the share of the window since its sidecar
first started within it, ``min(1, (now - started) / W)`` (at least 1 s of it, so a node clock ahead
of the scaler's cannot make it 0), not as a whole replica (``reporting_share``, as
:func:`tidegate.scaler.rates.observe` does from the sidecars' own windows). ``started`` is the
sidecar's own gauge, the earliest value seen in the window: a sidecar restarted within it keeps the
share of its first start, as ``rate()`` keeps the counts from before the reset. Not the pod's
samples: a missed scrape, a series split by a relabelled ``role`` at a promotion, or a pool whose
pods all started within the window would each miscount them. A sidecar without the gauge (older
than it) counts whole.
Requirements: the scrape
adds ``namespace`` and ``pod`` target labels (a PodMonitor does; the label names are settable),
and ``windowSeconds`` spans at least two scrape intervals. A pod without a fresh gauge sample is
*stale* (the law holds), as in the sidecar source; a budget gauge that is NaN (a replica still
reading its capacity from the model server) is an unknown budget, left out of the per-replica one. Prometheus unreachable or failing:
:class:`~tidegate.scaler.errors.SourceError` (UNAVAILABLE to KEDA, which falls back).

Reasons are the closed sets of :mod:`tidegate.admission.reasons`, so a reason added there is
classed here without an edit.
"""

import asyncio
import dataclasses
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_api_client import PrometheusConnect

from tidegate.admission.reasons import CAPACITY_REASONS, POLICY_REASONS
from tidegate.scaler import rates
from tidegate.scaler.errors import SourceError
from tidegate.scaler.law import Observation
from tidegate.scaler.metadata import Target
from tidegate.scaler.pods import PodSource

DECISIONS = "tidegate_admission_decisions_total"


_REGEX_META = re.compile(r"([.+*?()\[\]{}|^$\\])")


def _alternation(values: frozenset[str] | list[str]) -> str:
    r"""``a|b|c`` for a PromQL ``=~`` string: a regex metacharacter ``.`` becomes ``\\.`` (PromQL
    string escaping, then RE2). Not Python's ``re.escape``: PromQL refuses its ``\-``."""
    return "|".join(_REGEX_META.sub(r"\\\\\1", v) for v in sorted(values))


def queries(namespace: str, pods: list[str], window_s: int, ns_label: str, pod_label: str) -> dict[str, str]:
    """The PromQL of one observation (module docstring), keyed by what each reads."""
    sel = f'{ns_label}="{namespace}",{pod_label}=~"{_alternation(pods)}"'
    w = f"[{window_s}s]"
    cap = f'decision="reject",reason=~"{_alternation(frozenset(r.value for r in CAPACITY_REASONS))}"'
    pol = f'decision="reject",reason=~"{_alternation(frozenset(r.value for r in POLICY_REASONS))}"'
    by_pod = f"sum by ({pod_label})"
    return {
        "admitted": f'{by_pod} (rate({DECISIONS}{{{sel},decision=~"admit|admit_demoted"}}{w}))',
        "capacity": f"{by_pod} (rate({DECISIONS}{{{sel},{cap}}}{w}))",
        "policy": f"{by_pod} (rate({DECISIONS}{{{sel},{pol}}}{w}))",
        "tenants": f"count(sum by (tenant) (increase({DECISIONS}{{{sel},{cap}}}{w})) > 0)",
        "in_flight": f"{by_pod} (tidegate_admission_in_flight_tokens{{{sel}}})",
        "budget": f"{by_pod} (tidegate_admission_token_budget{{{sel}}})",
        "queue": f"{by_pod} (tidegate_admission_queue_depth{{{sel}}})",
        "seen": f"max by ({pod_label}) (timestamp(tidegate_admission_token_budget{{{sel}}}))",
        "started": f"min by ({pod_label}) (min_over_time(tidegate_admission_started_at_seconds{{{sel}}}{w}))",
    }


class PrometheusSignals:
    """Observations from Prometheus (``prometheusUrl`` per pool) plus a pod source.

    ``timeout_s``: per query; ``stale_after_s``: a pod whose newest gauge sample is older is missing;
    ``connect``: ``url -> client with custom_query(str) -> list[dict]`` (injectable for tests);
    ``wall``: Unix seconds.
    """

    def __init__(
        self,
        pods: PodSource,
        timeout_s: float = 5.0,
        stale_after_s: float = 60.0,
        namespace_label: str = "namespace",
        pod_label: str = "pod",
        connect: Callable[[str], Any] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.pods = pods
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self.namespace_label, self.pod_label = namespace_label, pod_label
        self._connect = connect or (lambda url: PrometheusConnect(url=url, method="POST", timeout=timeout_s))
        self._wall = wall
        self._clients: dict[str, Any] = {}
        self._url_of: dict[tuple[str, str], str] = {}

    def _query(self, url: str, promql: str) -> list[dict[str, Any]]:
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = self._connect(url)
        try:
            return client.custom_query(promql)
        except Exception as exc:  # requests errors, PrometheusApiClientException, bad JSON
            raise SourceError(f"prometheus {url}: {type(exc).__name__}: {exc}") from exc

    def _by_pod(self, result: list[dict[str, Any]]) -> dict[str, float]:
        return {r["metric"].get(self.pod_label, ""): float(r["value"][1]) for r in result}

    async def observe(self, target: Target) -> Observation:
        url = target.scaling.signal.prometheus_url
        if not url:
            raise SourceError(f"pool {target.namespace}/{target.pool}: source prometheus needs prometheusUrl")
        if self._url_of.get(target.key, url) != url:
            self._forget_client(target.key)
        self._url_of[target.key] = url
        pods = await self.pods.pods(target.namespace, target.pool)
        active = [p for p in pods if p.active]
        serving_warm = [p for p in pods if p.load_counts and not p.active]
        warm = sum(1 for p in pods if p.warm and p.ready)
        loading = rates.loading(pods, target.warm_pool_size)
        if not active and not serving_warm:
            return Observation(active=0, warm=warm, loading=loading)
        qs = queries(
            target.namespace, [p.name for p in active + serving_warm], target.scaling.signal.window_seconds,
            self.namespace_label, self.pod_label,
        )  # fmt: skip
        results = await asyncio.gather(*(asyncio.to_thread(self._query, url, q) for q in qs.values()))
        r = dict(zip(qs, results, strict=True))
        observation = self._observation(active, serving_warm, warm, r, float(target.scaling.signal.window_seconds))
        return dataclasses.replace(observation, loading=loading)

    def _observation(
        self, active: list, serving_warm: list, warm: int, r: Mapping[str, list[dict[str, Any]]], window_s: float
    ) -> Observation:
        """``active``: the active pods; ``serving_warm``: the Ready warm ones in the Service (their load
        counts, they are not active replicas); ``warm``: Ready warm pods, serving or not."""
        now = self._wall()
        seen = self._by_pod(r["seen"])
        admitted, capacity, policy = self._by_pod(r["admitted"]), self._by_pod(r["capacity"]), self._by_pod(r["policy"])
        in_flight, budget, queue = self._by_pod(r["in_flight"]), self._by_pod(r["budget"]), self._by_pod(r["queue"])
        in_service = active + serving_warm
        fresh = [p for p in in_service if now - seen.get(p.name, float("-inf")) <= self.stale_after_s]
        stale = tuple(sorted(p.name for p in in_service if p not in fresh and p.ready))
        # a serving warm pod that took no request in the window has no share of the load (rates.observe)
        unrouted = {
            p.name
            for p in serving_warm
            if not any(series.get(p.name, 0.0) for series in (admitted, capacity, policy, in_flight, queue))
        }
        fresh = [p for p in fresh if p.name not in unrouted]
        fresh_names = {p.name for p in fresh}
        starting = sum(1 for p in active if not p.ready)
        budgets = {n: budget[n] for n in fresh_names if math.isfinite(budget.get(n, math.nan))}  # NaN: pending
        # a fresh pod without decision series has decided nothing yet (labelled counters appear on first use)
        reporting = [p.name for p in fresh]
        tenants = int(float(r["tenants"][0]["value"][1])) if r["tenants"] else 0
        started = self._by_pod(r["started"])
        shares = [
            min(1.0, max(now - started[n], 1.0) / window_s) if math.isfinite(started.get(n, math.nan)) else 1.0
            for n in reporting
        ]
        return Observation(
            active=len(active),
            starting=starting,
            warm=warm,
            warm_serving=sum(1 for p in serving_warm if p.name in fresh_names),
            reporting=len(reporting),
            reporting_share=sum(shares) if reporting else None,
            stale=stale,
            window_s=window_s if reporting else 0.0,
            admitted_per_s=sum(admitted.get(n, 0.0) for n in reporting),
            capacity_rejected_per_s=sum(capacity.get(n, 0.0) for n in reporting),
            policy_rejected_per_s=sum(policy.get(n, 0.0) for n in reporting),
            capacity_rejected_tenants=tenants,
            in_flight_tokens=round(sum(in_flight.get(n, 0.0) for n in fresh_names)),
            token_budget=round(sum(budgets.values())),
            fresh=len(budgets),
            queue_depth=round(sum(queue.get(n, 0.0) for n in fresh_names)),
        )

    def forget(self, key: tuple[str, str]) -> None:
        """Drop pool ``key``'s pod watch, and its Prometheus client once no remembered pool uses that URL."""
        self._forget_client(key)
        self.pods.forget(*key)

    def _forget_client(self, key: tuple[str, str]) -> None:
        url = self._url_of.pop(key, None)
        if url is not None and url not in self._url_of.values():
            self._clients.pop(url, None)

    @property
    def clients(self) -> int:
        """Prometheus clients kept (one per URL in use)."""
        return len(self._clients)

    async def close(self) -> None:
        await self.pods.close()
