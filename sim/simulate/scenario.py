"""A simulation scenario: the traffic, the cluster's timings, the pool's spec, and the faults.

A scenario is a YAML document (built-ins live in ``tidegate/sim/simulate/scenarios/``)::

    name: spike
    duration_s: 2400                 # arrivals stop here; requests in flight then finish (drain)
    streams:                         # one Poisson stream per (tenant, class); rates in requests/s
      - {tenant: acme, priority: interactive, rate_per_s: 3.5, max_tokens: 1024,
         prompt: {median: 1500, sigma: 0.9, max: 12000}, output: {median: 220, sigma: 0.8}}
    load:                            # rate multipliers applied to every stream (product of all)
      spikes: [{start_s: 600, end_s: 1200, factor: 3, ramp_s: 30}]
      diurnal: {period_s: 86400, trough: 0.25, peak_at_s: 50400}
    cluster:
      initial_replicas: 3
      node_provisioning_s: {mean: 110, sd: 15, min: 60}
      model_load_s: {mean: 80, sd: 10, min: 40}
    admission: {...}                 # spec.admission (tidegate.api.AdmissionSpec, camelCase)
    scaling: {...}                   # spec.scaling   (tidegate.api.ScalingSpec)
    warm_pool: 1                     # spec.warmPool.size (tidegate policy only; see policies), or
                                     # the whole spec.warmPool: {size: 1, serve: true}
    replica: {...}                   # tidegate.sim.replica.ReplicaConfig overrides
    faults: [{at_s: 900, kind: lose_replica, count: 1}]

Lengths are log-normal (``median`` x exp(``sigma`` x N(0,1)), clipped to ``[min, max]``): heavy-tailed
like real chat and RAG traffic (the ShareGPT and LMSYS-Chat length histograms are close to
log-normal). A stream may carry its own ``spikes`` (one tenant's burst) on top of ``load``.

Errors: :class:`ScenarioError` for an unknown name, a bad file or a bad field (pydantic's message
for the ``admission``/``scaling`` sections).
"""

import dataclasses
import math
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import yaml

from tidegate.api.admission import AdmissionSpec
from tidegate.api.scaling import ScalingSpec, WarmPoolSpec
from tidegate.api.serving import ModelSpec
from tidegate.sim.replica import ReplicaConfig


class ScenarioError(Exception):
    """A scenario that cannot be loaded: unknown name, unreadable file, or an invalid field."""


@dataclasses.dataclass(frozen=True)
class Duration:
    """A duration distribution in seconds: normal(``mean``, ``sd``) clipped below at ``min``."""

    mean: float
    sd: float = 0.0
    min: float = 0.0

    def sample(self, rng: np.random.Generator) -> float:
        value = self.mean if self.sd <= 0 else rng.normal(self.mean, self.sd)
        return float(max(self.min, value))


@dataclasses.dataclass(frozen=True)
class Lengths:
    """Token counts: log-normal with ``median`` and ``sigma`` (of ln), clipped to ``[min, max]``."""

    median: float
    sigma: float = 0.0
    min: int = 1
    max: int = 32_768

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        values = self.median * np.exp(self.sigma * rng.standard_normal(n))
        return np.clip(np.rint(values), self.min, self.max).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Spike:
    """Rate x ``factor`` between ``start_s`` and ``end_s``, with linear ramps of ``ramp_s`` on both sides."""

    start_s: float
    end_s: float
    factor: float
    ramp_s: float = 0.0

    def multiplier(self, t: np.ndarray) -> np.ndarray:
        if self.ramp_s <= 0:
            inside = (t >= self.start_s) & (t < self.end_s)
            return np.where(inside, self.factor, 1.0)
        up = np.clip((t - self.start_s) / self.ramp_s, 0.0, 1.0)
        down = np.clip((self.end_s - t) / self.ramp_s, 0.0, 1.0)
        return 1.0 + (self.factor - 1.0) * np.minimum(up, down)


@dataclasses.dataclass(frozen=True)
class Diurnal:
    """A day-shaped multiplier: 1 at ``peak_at_s``, ``trough`` half a ``period_s`` away (cosine)."""

    period_s: float
    trough: float
    peak_at_s: float = 0.0

    def multiplier(self, t: np.ndarray) -> np.ndarray:
        phase = np.cos(2 * math.pi * (t - self.peak_at_s) / self.period_s)
        return self.trough + (1.0 - self.trough) * (phase + 1.0) / 2.0


@dataclasses.dataclass(frozen=True)
class Stream:
    """One tenant's requests of one priority class: Poisson at ``rate_per_s`` x the load multipliers."""

    tenant: str
    priority: str
    rate_per_s: float
    prompt: Lengths
    output: Lengths
    max_tokens: int
    spikes: tuple[Spike, ...] = ()


@dataclasses.dataclass(frozen=True)
class Fault:
    """``lose_replica``: ``count`` serving replicas die at ``at_s`` (node gone; in-flight requests fail)."""

    at_s: float
    kind: str = "lose_replica"
    count: int = 1


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Timings and sizes of the pool's nodes and pods (seconds)."""

    initial_replicas: int
    node_provisioning_s: Duration
    model_load_s: Duration
    promotion_s: float = 2.0
    gpus_per_replica: int = 1


@dataclasses.dataclass(frozen=True)
class Scenario:
    """Everything one run needs besides the policy and the seed (see the module docstring)."""

    name: str
    description: str
    duration_s: float
    streams: tuple[Stream, ...]
    cluster: Cluster
    admission: AdmissionSpec
    scaling: ScalingSpec
    model: ModelSpec
    replica: ReplicaConfig
    warm_pool: int = WarmPoolSpec.model_fields["size"].default
    warm_pool_serve: bool = WarmPoolSpec.model_fields["serve"].default
    """``spec.warmPool.serve``: the warm replicas are in the Service too (:mod:`~.cluster`)."""
    spikes: tuple[Spike, ...] = ()
    diurnal: Diurnal | None = None
    faults: tuple[Fault, ...] = ()
    client_timeout_s: dict[str, float] = dataclasses.field(default_factory=dict)
    baselines: dict[str, float] = dataclasses.field(default_factory=dict)
    drain_limit_s: float = 600.0
    notes: str = ""

    def slo_s(self, priority: str) -> float:
        """The TTFT objective of a class, seconds (from ``admission.priorityClasses``)."""
        for klass in self.admission.priority_classes:
            if klass.name == priority:
                return klass.ttft_slo_ms / 1000.0
        raise ScenarioError(f"class {priority!r} has no SLO in admission.priorityClasses")

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.admission.priority_classes)

    def with_replica(self, **changes: float) -> "Scenario":
        """A copy with replica model figures changed (sensitivity runs)."""
        return dataclasses.replace(self, replica=dataclasses.replace(self.replica, **changes))


def builtin_names() -> list[str]:
    """Names of the scenarios shipped with tidegate, sorted."""
    folder = resources.files("tidegate.sim.simulate") / "scenarios"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a YAML file by path. Raises :class:`ScenarioError`."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text()
        except OSError as exc:
            raise ScenarioError(f"cannot read scenario {name_or_path}: {exc}") from exc
    else:
        resource = resources.files("tidegate.sim.simulate") / "scenarios" / f"{name_or_path}.yaml"
        if not resource.is_file():
            raise ScenarioError(f"unknown scenario {name_or_path!r} (built-in: {', '.join(builtin_names())})")
        text = resource.read_text()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario {name_or_path}: not YAML: {exc}") from exc
    return parse(doc, default_name=path.stem)


def _build(kind: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected a mapping, got {type(raw).__name__}")
    try:
        return kind(**raw)
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{where}: {exc}") from exc


def _api(kind: type[pydantic.BaseModel], raw: Any, where: str) -> Any:
    try:
        return kind.model_validate(raw or {})
    except pydantic.ValidationError as exc:
        raise ScenarioError(f"{where}: {exc}") from exc


def parse(doc: Any, default_name: str = "scenario") -> Scenario:
    """A :class:`Scenario` from a parsed YAML mapping. Raises :class:`ScenarioError`."""
    if not isinstance(doc, dict):
        raise ScenarioError("a scenario is a YAML mapping")
    doc = dict(doc)
    streams = []
    for i, raw in enumerate(doc.pop("streams", None) or []):
        raw = dict(raw)
        where = f"streams[{i}]"
        raw["prompt"] = _build(Lengths, raw.get("prompt"), f"{where}.prompt")
        raw["output"] = _build(Lengths, raw.get("output"), f"{where}.output")
        raw["spikes"] = tuple(_build(Spike, s, f"{where}.spikes") for s in raw.get("spikes", []))
        streams.append(_build(Stream, raw, where))
    if not streams:
        raise ScenarioError("a scenario needs at least one stream")
    load_doc = doc.pop("load", None) or {}
    cluster = dict(doc.pop("cluster", None) or {})
    for key in ("node_provisioning_s", "model_load_s"):
        cluster[key] = _build(Duration, cluster.get(key, {"mean": 0.0}), f"cluster.{key}")
    diurnal = load_doc.get("diurnal")
    if isinstance(doc.get("warm_pool"), dict):  # spec.warmPool as the API writes it
        warm = _api(WarmPoolSpec, doc.pop("warm_pool"), "warm_pool")
        doc |= {"warm_pool": warm.size, "warm_pool_serve": warm.serve}
    fields = {
        "name": doc.pop("name", default_name),
        "description": doc.pop("description", ""),
        "streams": tuple(streams),
        "cluster": _build(Cluster, cluster, "cluster"),
        "admission": _api(AdmissionSpec, doc.pop("admission", None), "admission"),
        "scaling": _api(ScalingSpec, doc.pop("scaling", None), "scaling"),
        "model": _api(ModelSpec, doc.pop("model", None) or {"name": "sim-llama-3.1-8b"}, "model"),
        "replica": _build(ReplicaConfig, doc.pop("replica", None) or {}, "replica"),
        "spikes": tuple(_build(Spike, s, "load.spikes") for s in load_doc.get("spikes", [])),
        "diurnal": None if diurnal is None else _build(Diurnal, diurnal, "load.diurnal"),
        "faults": tuple(_build(Fault, f, "faults") for f in doc.pop("faults", None) or []),
    }
    unknown_classes = {s.priority for s in streams} - {c.name for c in fields["admission"].priority_classes}
    if unknown_classes:
        raise ScenarioError(f"streams use classes without an SLO: {sorted(unknown_classes)}")
    try:
        return Scenario(**fields, **doc)
    except TypeError as exc:
        raise ScenarioError(f"scenario: {exc}") from exc
