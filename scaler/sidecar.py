"""Signal source ``sidecar`` (the default): read the stats endpoint of every pod in the Service, concurrently.

For one pool: list its pods (a :class:`~tidegate.scaler.pods.PodSource`), ``GET`` the
``/tidegate/stats`` of each active pod and each Ready warm pod labelled serving
(``spec.warmPool.serve``; :attr:`~tidegate.scaler.pods.PodInfo.in_service`) (``admission.stats.fetch``) at once with a per-request timeout, and turn
the answers plus each pod's baseline from :class:`~tidegate.scaler.rates.SampleHistory` into an
:class:`~tidegate.scaler.law.Observation`. A pod that does not answer is *missing data* (the law
holds), never zero demand. A pod source that cannot list at all raises
:class:`~tidegate.scaler.errors.PodSourceError` (the gRPC edge answers UNAVAILABLE, KEDA falls back).

Memory per pool: one ring of at most 17 samples per pod (``2 x windowSeconds``, one kept per
``windowSeconds / 8``), for the pods the pod source lists and those it stopped listing less than
``2 x windowSeconds`` ago; a pool's memory goes when the scaler forgets the pool (:meth:`SidecarSignals.forget`,
called by :class:`~tidegate.scaler.service.Scaler` for pools KEDA no longer asks about).
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from tidegate.admission import stats
from tidegate.scaler import rates
from tidegate.scaler.law import Observation
from tidegate.scaler.metadata import Target
from tidegate.scaler.pods import PodInfo, PodSource


@dataclass
class _PoolMemory:
    history: rates.SampleHistory


class SidecarSignals:
    """Scrapes a pool's sidecars; ``await observe(target)`` -> :class:`Observation`.

    ``timeout_s``: per-pod request timeout (seconds); ``stale_after_s``: a snapshot whose
    ``time_s`` is further than this from the scaler's wall clock counts as missing (clock skew or a
    frozen sidecar); ``wall``: wall-clock
    seconds (injectable for tests).

    ``max_connections`` bounds open (keep-alive) connections, one per pod, so a 2,000-pod pool is
    polled without new TCP handshakes; ``max_in_flight`` bounds requests outstanding at once per
    poll, which keeps the number of live objects (and so the garbage collector's cost per pod) flat
    as pools grow (bench/scaler_poll.py).
    """

    def __init__(
        self,
        pods: PodSource,
        timeout_s: float = 2.0,
        stale_after_s: float = 30.0,
        max_connections: int = 4096,
        max_in_flight: int = 128,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.pods = pods
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self.max_connections = max_connections
        self.max_in_flight = max_in_flight
        self._wall = wall
        self._session: aiohttp.ClientSession | None = None
        self._pools: dict[tuple[str, str], _PoolMemory] = {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def _fetch(self, pod: PodInfo, port: int) -> rates.Sample | None:
        url = pod.base_url(port)
        if not url:
            return None
        try:
            return rates.Sample.of(await stats.fetch(self._client(), url, timeout_s=self.timeout_s))
        except stats.StatsError:
            return None

    async def _fetch_all(self, pods: list[PodInfo], port: int) -> list[rates.Sample | None]:
        """Every pod's stats, at most ``max_in_flight`` requests at a time (a fixed set of workers, not
        one task per pod: a 2,000-pod poll keeps ~``max_in_flight`` coroutines alive, not 2,000), each
        reduced at once to a compact :class:`~tidegate.scaler.rates.Sample`."""
        answers: list[rates.Sample | None] = [None] * len(pods)
        work = iter(enumerate(pods))

        async def worker() -> None:
            for i, pod in work:
                answers[i] = await self._fetch(pod, port)

        await asyncio.gather(*(worker() for _ in range(min(self.max_in_flight, len(pods)))))
        return answers

    async def observe(self, target: Target) -> Observation:
        """One scrape of the target's pool, summed over the window ``target.scaling.signal.window_seconds``."""
        pods = await self.pods.pods(target.namespace, target.pool)
        now = self._wall()
        window = float(target.scaling.signal.window_seconds)
        memory = self._pools.get(target.key)
        if memory is None or memory.history.keep_s != 2 * window:
            history = rates.SampleHistory(keep_s=2 * window, min_spacing_s=window / 8)
            memory = self._pools[target.key] = _PoolMemory(history)
        polled = [p for p in pods if p.load_counts]
        answers = await self._fetch_all(polled, target.sidecar_port)
        current = {p.name: s for p, s in zip(polled, answers, strict=True) if s is not None}
        baselines = {name: memory.history.baseline(name, snap, window) for name, snap in current.items()}
        observation = rates.observe(
            pods,
            current,
            baselines,
            now,
            self.stale_after_s,
            max_window_s=2 * window,
            warm_pool_size=target.warm_pool_size,
            window_s=window,
        )
        for name, snap in current.items():
            memory.history.record(name, snap)
        memory.history.prune((p.name for p in pods), now)
        return observation

    def forget(self, key: tuple[str, str]) -> None:
        """Drop everything kept for pool ``key`` (``(namespace, pool)``): its samples and its pod watch.

        The next observation of that pool starts cleanly (no baselines: the law holds).
        """
        self._pools.pop(key, None)
        self.pods.forget(*key)

    @property
    def pools(self) -> int:
        """Pools with memory kept."""
        return len(self._pools)

    def pods_kept(self, key: tuple[str, str]) -> int:
        """Pods of pool ``key`` with samples kept (0 for a pool not remembered)."""
        memory = self._pools.get(key)
        return memory.history.pods if memory is not None else 0

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self.pods.close()
