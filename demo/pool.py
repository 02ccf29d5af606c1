"""The demo's pool: pods of (sim-backend + real admission sidecar), and the operator's part.

Each pod is a :class:`~tidegate.sim.server.SimBackend` behind a real
:class:`~tidegate.admission.sidecar.Sidecar` (the proxy the ``tidegate admission`` command runs),
both served over loopback on their own ports, reading the pool's admission config *file* and a
downward-API style labels file that carries ``tidegate.dev/role``. They run in this process
(one asyncio loop) so the demo starts in about a second and needs nothing else.

:class:`Pool` plays the operator (and the kubelet / endpoints controller) on a short period:

- a pod the Deployment has asked for but which is still cold (node + model load) loads after
  ``cold_start_s``; pods start as ``warm`` (not serving), as the operator creates them;
- :func:`tidegate.operator.warm_pool.plan` decides promotions (role file -> ``active``),
  drains (-> ``draining``, out of the Service, in-flight requests finish) and returns to warm;
- the Deployment's replica count (desired active + warm pool + draining) creates cold pods or
  deletes surplus ones (not-loaded first, then the newest warm);
- the Service: an active pod joins the endpoints once its ``/readyz`` answers 200 (the readiness
  probe), and leaves them as soon as its role is no longer ``active``;
- the scaler's :class:`~tidegate.scaler.pods.StaticPodSource` is updated as a pod watch would be.

Promotion time: from the scale write that asked for more replicas to the pod's first ready
answer (recorded in the :class:`~tidegate.demo.timeline.Timeline`).
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tidegate.admission import stats
from tidegate.admission.config import ROLE_LABEL, ConfigWatcher, SidecarSettings
from tidegate.admission.sidecar import Sidecar
from tidegate.api.constants import ROLE_ACTIVE, ROLE_DRAINING, ROLE_WARM
from tidegate.demo import scenario
from tidegate.demo.timeline import Promotion, ReplicaSample, Timeline
from tidegate.operator import warm_pool
from tidegate.scaler.pods import PodInfo, StaticPodSource
from tidegate.sim.replica import ReplicaConfig
from tidegate.sim.server import SimBackend, SimSettings

log = logging.getLogger(__name__)
DRAIN_TIMEOUT_S = 30.0


@dataclass(eq=False)
class Pod:
    """One replica: its role label, when it was created and when it is loaded (seconds since start)."""

    name: str
    role: str
    created_s: float
    loaded_at_s: float
    labels_file: Path
    sim: SimBackend | None = None
    sidecar: Sidecar | None = None
    serving: bool = False  # in the Service's endpoints
    draining_since_s: float | None = None
    promote_asked_s: float | None = None
    in_flight: int | None = None

    @property
    def loaded(self) -> bool:
        return self.sidecar is not None

    @property
    def url(self) -> str:
        return self.sidecar.url if self.sidecar is not None else ""

    def write_role(self, role: str) -> None:
        self.role = role
        self.labels_file.write_text(f'{ROLE_LABEL}="{role}"\n', encoding="utf-8")
        if role != ROLE_ACTIVE:
            self.serving = False  # the Service selects role=active only


class Pool:
    """Pods of one pool and the operator loop; ``spec_replicas`` is what the HPA stand-in writes."""

    def __init__(
        self,
        settings: scenario.DemoSettings,
        config_path: Path,
        workdir: Path,
        clock: Callable[[], float],
        timeline: Timeline,
        pod_source: StaticPodSource,
        http: aiohttp.ClientSession,
    ) -> None:
        self.s = settings
        self.config_path = config_path
        self.workdir = workdir
        self.clock = clock
        self.timeline = timeline
        self.pod_source = pod_source
        self.http = http
        self.spec_replicas = settings.replicas
        self.last_scale_up_s: float | None = None
        self.pods: list[Pod] = []
        self.addresses: list[str] = []  # every URL a pod served on (sim-backends and sidecars), for leak checks
        self._serial = 0

    # ---- pods ----------------------------------------------------------------------------------

    def _new_pod(self, role: str, cold: bool) -> Pod:
        now = self.clock()
        name = f"{scenario.POOL}-{self._serial}"
        self._serial += 1
        pod = Pod(name, role, now, now + (self.s.cold_start_s if cold else 0.0), self.workdir / f"{name}.labels")
        pod.write_role(role)
        self.pods.append(pod)
        return pod

    async def _load(self, pod: Pod) -> None:
        z = self.s.size
        replica = ReplicaConfig(
            decode_tokens_per_s=z.decode_tokens_per_s,
            batch_slowdown=z.batch_slowdown,
            kv_capacity_tokens=100_000,
            max_running=64,
        )
        sim = SimBackend(SimSettings(model_name=scenario.MODEL, replica=replica, seed=self.s.seed))
        await sim.start("127.0.0.1", 0)
        watcher = ConfigWatcher(self.config_path)
        settings = SidecarSettings(
            config_path=str(self.config_path), upstream=sim.url, labels_file=str(pod.labels_file),
            pod=pod.name, tick_s=0.02, reload_s=0.1, drain_grace_s=5.0,
        )  # fmt: skip
        sidecar = Sidecar(settings, watcher.config, watcher=watcher)
        try:
            await sidecar.start("127.0.0.1", 0)
        except BaseException:
            await sim.stop()
            raise
        pod.sim, pod.sidecar = sim, sidecar
        self.addresses += [sim.url, sidecar.url]

    async def _delete(self, pod: Pod) -> None:
        self.pods.remove(pod)
        pod.serving = False
        if pod.sidecar is not None:
            await pod.sidecar.stop()
        if pod.sim is not None:
            await pod.sim.stop()
        pod.sidecar = pod.sim = None
        with contextlib.suppress(OSError):
            pod.labels_file.unlink()

    async def start(self) -> None:
        """Create the initial pods, loaded: ``replicas`` active and ``warm`` warm."""
        for _ in range(self.s.replicas):
            self._new_pod(ROLE_ACTIVE, cold=False)
        for _ in range(self.s.warm):
            self._new_pod(ROLE_WARM, cold=False)
        await asyncio.gather(*(self._load(p) for p in self.pods))
        await self.reconcile()

    async def stop(self) -> None:
        """Delete every pod (sidecars and sim-backends stop; nothing keeps a port)."""
        for pod in list(self.pods):
            await self._delete(pod)
        self.pod_source.set(scenario.NAMESPACE, scenario.POOL, [])

    # ---- what the HPA stand-in writes ------------------------------------------------------------

    def scale(self, replicas: int) -> None:
        """Write spec.replicas (the /scale subresource)."""
        if replicas > self.spec_replicas:
            self.last_scale_up_s = self.clock()
        self.spec_replicas = replicas

    @property
    def status_replicas(self) -> int:
        """status.replicas: active pods (serving or about to)."""
        return sum(1 for p in self.pods if p.role == ROLE_ACTIVE)

    def endpoints(self) -> list[str]:
        """The Service's endpoints: active pods that passed their readiness probe."""
        return [p.url for p in self.pods if p.serving and p.role == ROLE_ACTIVE]

    # ---- the operator loop -----------------------------------------------------------------------

    async def reconcile(self) -> None:
        """One pass: load cold pods that are due, probe, plan the warm pool, size the Deployment."""
        now = self.clock()
        due = [p for p in self.pods if not p.loaded and p.loaded_at_s <= now]
        await asyncio.gather(*(self._load(p) for p in due))
        await asyncio.gather(*(self._probe(p) for p in self.pods if p.loaded))
        views = [
            warm_pool.PodView(p.name, p.role, p.loaded, p.created_s, draining_since_s=p.draining_since_s,
                              in_flight=p.in_flight)
            for p in self.pods
        ]  # fmt: skip
        plan = warm_pool.plan(views, self.spec_replicas, self.s.warm, now, DRAIN_TIMEOUT_S)
        by_name = {p.name: p for p in self.pods}
        for name in plan.promote:
            pod = by_name[name]
            pod.write_role(ROLE_ACTIVE)
            pod.draining_since_s = None
            # a loaded pod answers the latest scale-up; a cold one the scale-up that created it
            asked = self.last_scale_up_s if self.last_scale_up_s is not None else now
            pod.promote_asked_s = asked if pod.loaded_at_s <= asked else pod.created_s
        for name in plan.drain:
            by_name[name].write_role(ROLE_DRAINING)
            by_name[name].draining_since_s = now
        for name in plan.return_to_warm:
            by_name[name].write_role(ROLE_WARM)
            by_name[name].draining_since_s = None
        surplus = len(self.pods) - plan.deployment_replicas
        if surplus < 0:
            for _ in range(-surplus):
                self._new_pod(ROLE_WARM, cold=True)
        elif surplus > 0:
            spare = sorted(
                (p for p in self.pods if p.role == ROLE_WARM), key=lambda p: (p.loaded, -p.created_s)
            )  # pod-deletion-cost: not loaded first, then the newest
            for pod in spare[:surplus]:
                await self._delete(pod)
        self.pod_source.set(
            scenario.NAMESPACE,
            scenario.POOL,
            [PodInfo(p.name, p.url, p.role, p.loaded and (p.serving or p.role != ROLE_ACTIVE)) for p in self.pods],
        )

    async def _probe(self, pod: Pod) -> None:
        """The readiness probe of an active pod (joins the Service), and in-flight of a draining one."""
        if pod.role == ROLE_ACTIVE and not pod.serving:
            try:
                async with self.http.get(pod.url + "/readyz", timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                    ready = resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ready = False
            if ready and pod.role == ROLE_ACTIVE:
                pod.serving = True
                if pod.promote_asked_s is not None:
                    kind = "warm" if pod.loaded_at_s <= pod.promote_asked_s else "cold"  # loaded before it was asked
                    now = self.clock()
                    self.timeline.promotions.append(Promotion(now, pod.name, kind, now - pod.promote_asked_s))
                    pod.promote_asked_s = None
        elif pod.role == ROLE_DRAINING:
            try:
                snap = await stats.fetch(self.http, pod.url, timeout_s=1.0)
                pod.in_flight = snap.in_flight_requests + snap.queue_depth
            except stats.StatsError:
                pod.in_flight = None

    def sample(self) -> ReplicaSample:
        """The pool now, for the timeline."""
        return ReplicaSample(
            t_s=self.clock(),
            desired=self.spec_replicas,
            serving=sum(1 for p in self.pods if p.serving),
            warm=sum(1 for p in self.pods if p.role == ROLE_WARM and p.loaded),
            starting=sum(1 for p in self.pods if not p.loaded),
            pods=len(self.pods),
        )
