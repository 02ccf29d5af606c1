"""The demo's pool: pods of (sim-backend + real admission sidecar), and the operator's part.

Each pod is a :class:`~tidegate.sim.server.SimBackend` behind a real
:class:`~tidegate.admission.sidecar.Sidecar` (the proxy the ``tidegate admission`` command runs),
both served over loopback on their own ports, reading the pool's admission config *file* and a
downward-API style labels file that carries ``tidegate.dev/role`` and ``tidegate.dev/serving``. They
run in this process (one asyncio loop) so the demo starts in about a second and needs nothing else.

:class:`Pool` plays the operator (and the kubelet / endpoints controller) on a short period:

- a pod the Deployment has asked for but which is still cold (node + model load) loads after
  ``cold_start_s``; pods start as ``warm`` with no serving label, as the Deployment creates them;
- :func:`tidegate.operator.warm_pool.plan` decides promotions (role file -> ``active``),
  drains (-> ``draining``, out of the Service, in-flight requests finish), returns to warm and
  the ``tidegate.dev/serving`` label of every pod (``true`` when active, or warm under
  ``DemoSettings.serve``, the pool's ``spec.warmPool.serve``); :func:`~tidegate.operator.warm_pool.after_drain`
  and :func:`~tidegate.operator.warm_pool.serving_labels` keep a drained pod the warm pool has no
  room for out of the Service, as the operator does;
- the Deployment's replica count (desired active + warm pool + draining) creates cold pods or
  deletes surplus ones in the ReplicaSet's order (not loaded first, then those drained with no room
  in the warm pool, then the newest warm);
- the Service selects ``tidegate.dev/serving=true`` (``role=active`` until every active pod carries
  the label, :func:`~tidegate.operator.warm_pool.serving_selector_safe`): a selected pod joins the
  endpoints once its ``/readyz`` answers 200 (the readiness probe), and leaves them as soon as it is
  no longer selected. Under ``serve`` a loaded warm pod is in the Service: it takes its share of a
  burst before any scale write, and its promotion is a relabel with no gap;
- the scaler's :class:`~tidegate.scaler.pods.StaticPodSource` is updated as a pod watch would be,
  with ``serving`` from the label.

Promotion time: from the scale write that asked for more replicas to the pod's first ready
answer as an active pod (recorded in the :class:`~tidegate.demo.timeline.Timeline`); for a pod
already in the Service (a serving warm pod), to the relabel.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tidegate.admission import stats
from tidegate.admission.config import ROLE_LABEL, SERVING_LABEL, ConfigWatcher, SidecarSettings
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
    """One replica: its role and serving labels, when it was created and when it is loaded (seconds since start)."""

    name: str
    role: str
    created_s: float
    loaded_at_s: float
    labels_file: Path
    sim: SimBackend | None = None
    sidecar: Sidecar | None = None
    label_serving: bool | None = None  # its tidegate.dev/serving label; None: not labelled yet
    in_service: bool = False  # in the Service's endpoints
    draining_since_s: float | None = None
    promote_asked_s: float | None = None
    in_flight: int | None = None

    @property
    def loaded(self) -> bool:
        return self.sidecar is not None

    @property
    def url(self) -> str:
        return self.sidecar.url if self.sidecar is not None else ""

    def write_labels(self, role: str, serving: bool | None) -> None:
        """Label the pod (one patch: role and serving label together); the sidecar reads the file."""
        self.role, self.label_serving = role, serving
        text = f'{ROLE_LABEL}="{role}"\n'
        if serving is not None:
            text += f'{SERVING_LABEL}="{str(serving).lower()}"\n'
        self.labels_file.write_text(text, encoding="utf-8")

    def view(self) -> warm_pool.PodView:
        """What the operator observes of the pod."""
        serving = None if self.label_serving is None else str(self.label_serving).lower()
        return warm_pool.PodView(self.name, self.role, self.loaded, self.created_s,
                                 draining_since_s=self.draining_since_s, in_flight=self.in_flight,
                                 serving=serving)  # fmt: skip


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
        self.by_serving = False  # the Service selects tidegate.dev/serving=true (else role=active)
        self._serial = 0

    # ---- pods ----------------------------------------------------------------------------------

    def _new_pod(self, role: str, cold: bool) -> Pod:
        now = self.clock()
        name = f"{scenario.POOL}-{self._serial}"
        self._serial += 1
        pod = Pod(name, role, now, now + (self.s.cold_start_s if cold else 0.0), self.workdir / f"{name}.labels")
        pod.write_labels(role, None)  # the Deployment's template carries no serving label
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
        pod.in_service = False
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

    def selected(self, pod: Pod) -> bool:
        """Whether the Service's selector matches the pod."""
        return pod.label_serving is True if self.by_serving else pod.role == ROLE_ACTIVE

    def endpoints(self) -> list[str]:
        """The Service's endpoints: selected pods that passed their readiness probe."""
        return [p.url for p in self.pods if p.in_service and self.selected(p)]

    def role_of(self, url: str) -> str:
        """The role of the pod serving at ``url`` ("" when none does)."""
        return next((p.role for p in self.pods if p.url == url and p.loaded), "")

    # ---- the operator loop -----------------------------------------------------------------------

    async def reconcile(self) -> None:
        """One pass: load cold pods that are due, probe, plan the warm pool, size the Deployment."""
        now = self.clock()
        due = [p for p in self.pods if not p.loaded and p.loaded_at_s <= now]
        await asyncio.gather(*(self._load(p) for p in due))
        await asyncio.gather(*(self._probe(p) for p in self.pods if p.loaded))
        views = [p.view() for p in self.pods]
        self.by_serving = warm_pool.serving_selector_safe(views)
        plan = warm_pool.plan(views, self.spec_replicas, self.s.warm, now, DRAIN_TIMEOUT_S, self.s.serve)
        removed = warm_pool.after_drain(views, plan, self.s.warm).removed
        serving = warm_pool.serving_labels(plan, removed)
        by_name = {p.name: p for p in self.pods}
        roles = {n: ROLE_ACTIVE for n in plan.promote}
        roles |= {n: ROLE_DRAINING for n in plan.drain} | {n: ROLE_WARM for n in plan.return_to_warm}
        for name in {*roles, *serving}:
            pod = by_name[name]
            pod.write_labels(roles.get(name, pod.role), serving.get(name, pod.label_serving))
            if not self.selected(pod):
                pod.in_service = False  # out of the endpoints at once
        for name in plan.promote:
            pod = by_name[name]
            pod.draining_since_s = None
            # a loaded pod answers the latest scale-up; a cold one the scale-up that created it
            asked = self.last_scale_up_s if self.last_scale_up_s is not None else now
            pod.promote_asked_s = asked if pod.loaded_at_s <= asked else pod.created_s
            if pod.in_service:  # a serving warm pod: the relabel is the promotion, no gap
                self._promoted(pod)
        for name in plan.drain:
            by_name[name].draining_since_s = now
        for name in plan.return_to_warm:
            by_name[name].draining_since_s = None
        surplus = len(self.pods) - plan.deployment_replicas
        if surplus < 0:
            for _ in range(-surplus):
                self._new_pod(ROLE_WARM, cold=True)
        elif surplus > 0:
            spare = sorted(
                (p for p in self.pods if p.role == ROLE_WARM),
                key=lambda p: (p.loaded, p.name not in removed, -p.created_s),
            )  # not loaded first, then pod-deletion-cost (drained with no room < warm), then the newest
            for pod in spare[:surplus]:
                await self._delete(pod)
        self.pod_source.set(
            scenario.NAMESPACE,
            scenario.POOL,
            [
                PodInfo(p.name, p.url, p.role, p.loaded and (p.in_service or not self.selected(p)),
                        serving=p.label_serving is True)
                for p in self.pods
            ],
        )  # fmt: skip

    def _promoted(self, pod: Pod) -> None:
        """Record the promotion of ``pod`` (now serving as an active pod) against its scale write."""
        if pod.promote_asked_s is None:
            return
        kind = "warm" if pod.loaded_at_s <= pod.promote_asked_s else "cold"  # loaded before it was asked
        now = self.clock()
        self.timeline.promotions.append(Promotion(now, pod.name, kind, now - pod.promote_asked_s))
        pod.promote_asked_s = None

    async def _probe(self, pod: Pod) -> None:
        """The readiness probe of a selected pod (joins the Service), and in-flight of a draining one."""
        if self.selected(pod) and not pod.in_service:
            try:
                async with self.http.get(pod.url + "/readyz", timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                    ready = resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ready = False
            if ready and self.selected(pod):
                pod.in_service = True
                if pod.role == ROLE_ACTIVE:
                    self._promoted(pod)
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
            serving=sum(1 for p in self.pods if p.in_service),
            active=sum(1 for p in self.pods if p.in_service and p.role == ROLE_ACTIVE),
            warm=sum(1 for p in self.pods if p.role == ROLE_WARM and p.loaded),
            starting=sum(1 for p in self.pods if not p.loaded),
            pods=len(self.pods),
        )
