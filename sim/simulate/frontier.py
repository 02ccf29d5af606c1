"""Pareto frontiers: interactive SLO attainment against GPU-hours, each policy over a grid of its knobs.

One configuration of each policy says little: a baseline with a lower threshold or more headroom
buys attainment with GPUs, and so does tidegate with a bigger warm pool. ``tidegate simulate
--frontier`` runs every policy over a grid of its own knobs (:data:`KNOBS`, :data:`GRIDS`) on
every scenario and seed, and reports per scenario:

- every configuration's point: GPU-hours and first-class (interactive) SLO attainment, both the
  **mean over seeds**; the worst seed's attainment beside it;
- each policy's **Pareto frontier**: the points no other point of the same policy beats on both
  axes (as cheap or cheaper *and* as good or better, strictly better on one);
- the **GPU-hours to reach** 95%, 99% and 99.9%: the least mean GPU-hours among configurations
  whose mean attainment over the seeds is >= the level ("mean" criterion), and among those whose
  *every* seed is >= the level ("worst seed" criterion); ``never`` when none does;
- **tidegate's default**: the scenario as written (its ``warm_pool`` and ``scaling``), always in
  the grid, and whether some baseline configuration **dominates** it: mean attainment >= and
  mean GPU-hours <= the default's.

Attainment: first-class requests served within the class's TTFT SLO over all first-class arrivals
(a refusal is a miss), **except those of tenants the scenario gives a quota** (``tokensPerSecond``,
``maxConcurrency`` or ``maxInFlightTokens`` in ``admission.tenancy.tenants``): refusing a tenant over
its quota is the outcome asked for, not a miss, and the same requests are left out for every policy
(:func:`in_quota_attainment`). GPU-hours are :mod:`~.report`'s: GPUs held over ``[0, duration_s]``.

A knob is a name and a function ``(scenario, value) -> scenario`` (``dataclasses.replace`` on the
loaded scenario; ``spec.scaling`` re-validated by pydantic): a new knob of the scaling law is one
entry in :data:`KNOBS` and a list of values in :data:`GRIDS`. Errors: :class:`FrontierError`
(unknown grid or knob, a value the spec refuses).
"""

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import lru_cache
from pathlib import Path

from tidegate.sim.simulate import core, matrix, policies, report, scenario
from tidegate.sim.simulate.scenario import Scenario

LEVELS = (0.95, 0.99, 0.999)
"""Attainment levels the reach table reports (ratios 0..1)."""

BASELINES = frozenset(policies.POLICIES) - {"tidegate"}
"""The policies a dominance check counts: not tidegate, not the oracle (a bound no one can run)."""

ORACLE_RATES = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0)
"""Requests/s a replica is given by :class:`~.baselines.Oracle`: its grid, wide enough that each
scenario's cheapest point reaching 99% is inside it."""


class FrontierError(ValueError):
    """A grid or knob that cannot be run (unknown name, a value the spec refuses)."""


def _validated(sc: Scenario, part: str, raw: dict, what: str) -> Scenario:
    """``sc`` with its pydantic ``part`` (``scaling``, ``admission``) rebuilt from ``raw`` and validated as
    the spec validates it; :class:`FrontierError` naming ``what`` if the spec refuses it."""
    try:
        return dataclasses.replace(sc, **{part: type(getattr(sc, part)).model_validate(raw)})
    except ValueError as exc:  # pydantic.ValidationError
        raise FrontierError(f"{what}: {exc}") from exc


def _scaling(field: str) -> Callable[[Scenario, float], Scenario]:
    def apply(sc: Scenario, value: float) -> Scenario:
        raw = sc.scaling.model_dump(by_alias=False) | {field: value}
        return _validated(sc, "scaling", raw, f"scaling.{field}={value}")

    return apply


def _baseline(key: str) -> Callable[[Scenario, float], Scenario]:
    return lambda sc, value: dataclasses.replace(sc, baselines={**sc.baselines, key: value})


def _min_replicas(sc: Scenario, value: float) -> Scenario:
    sc = _scaling("min_replicas")(sc, int(value))
    initial = max(sc.cluster.initial_replicas, int(value))  # a floor the pool starts at, not one it climbs to
    return dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster, initial_replicas=initial))


def _first_class_share(sc: Scenario, value: float) -> Scenario:
    """``admission.priorityClasses[0].reservedShare`` (the interactive class's headroom kept from the others)."""
    raw = sc.admission.model_dump(by_alias=False)
    raw["priority_classes"][0]["reserved_share"] = value
    return _validated(sc, "admission", raw, f"priorityClasses[0].reservedShare={value}")


KNOBS: dict[str, Callable[[Scenario, float], Scenario]] = {
    # tidegate: spec.warmPool.size, spec.scaling and the first priority class's reserved share
    "warm_pool": lambda sc, value: dataclasses.replace(sc, warm_pool=int(value)),
    "warmPool.serve": lambda sc, value: dataclasses.replace(sc, warm_pool_serve=bool(value)),  # 0 / 1
    "targetUtilization": _scaling("target_utilization"),
    "targetCapacityRejectRate": _scaling("target_capacity_reject_rate"),
    "reservedShare": _first_class_share,
    # baselines: scenario.baselines (see tidegate.sim.simulate.baselines)
    "queue_waiting_target": _baseline("queue_waiting_target"),
    "http_concurrency_target": _baseline("http_concurrency_target"),
    "gpu_util_target": _baseline("gpu_util_target"),
    "headroom_replicas": _baseline("headroom_replicas"),
    "oracle_replica_rate": _baseline("oracle_replica_rate"),  # the bound (baselines.Oracle)
    "oracle_lead_s": _baseline("oracle_lead_s"),
    # any policy: the HPA's floor (the pool starts there too) and ceiling
    "minReplicas": _min_replicas,
    "maxReplicas": _scaling("max_replicas"),
}
"""Knob name -> ``(scenario, value) -> scenario``. Names are what the tables print."""

Config = tuple[tuple[str, float], ...]
"""One configuration: ``((knob, value), ...)`` in the grid's knob order; ``()`` is the scenario as written."""


def _product(**axes: Iterable[float]) -> list[Config]:
    names = list(axes)
    return [tuple(zip(names, values, strict=True)) for values in itertools.product(*axes.values())]


def _baseline_grid(threshold: str, values: tuple[float, ...], default: float) -> list[Config]:
    """Each threshold without headroom; the lowest and the default threshold with 2 headroom
    replicas; the default with 1."""
    return [
        *_product(**{threshold: values, "headroom_replicas": (0,)}),
        *_product(**{threshold: (min(values), default), "headroom_replicas": (2,)}),
        *_product(**{threshold: (default,), "headroom_replicas": (1,)}),
    ]


GRIDS: dict[str, dict[str, list[Config]]] = {
    # sized for the budget: the whole sweep (7 scenarios x 3 seeds, ~800 runs) in under
    # 30 minutes on 2 cores with --jobs 2
    "full": {
        "tidegate": [
            *_product(warm_pool=(0, 2, 4)),
            *_product(targetUtilization=(0.6, 0.9)),
            *_product(warm_pool=(0,), targetUtilization=(0.9,)),  # the cheapest corner
            *_product(warm_pool=(2, 4), targetUtilization=(0.6,)),  # the most headroom
            *_product(targetCapacityRejectRate=(0.005, 0.1)),
            *_product(reservedShare=(0.2, 0.5)),
            # spec.warmPool.serve both ways; the side a scenario already has repeats a point above
            # (or the default) and is run once
            *_product(**{"warmPool.serve": (0, 1)}),
            *_product(**{"warm_pool": (2,), "warmPool.serve": (0, 1)}),
            *_product(**{"targetUtilization": (0.9,), "warmPool.serve": (0, 1)}),
        ],
        "queue": _baseline_grid("queue_waiting_target", (1, 2, 5, 10), 5),
        "gie": _baseline_grid("queue_waiting_target", (1, 2, 5, 10), 5),
        "http": _baseline_grid("http_concurrency_target", (4, 8, 16, 32), 16),
        "gpu": [
            *_product(gpu_util_target=(0.6, 0.8, 0.95), headroom_replicas=(0,)),
            *_product(gpu_util_target=(0.8,), headroom_replicas=(2,)),
        ],
        "oracle": _product(oracle_replica_rate=ORACLE_RATES),
    },
    "small": {
        "tidegate": _product(warm_pool=(0, 2)),
        "queue": _product(queue_waiting_target=(2,), headroom_replicas=(0, 1)),
        "gie": _product(queue_waiting_target=(2,)),
        "http": _product(http_concurrency_target=(8,)),
        "gpu": _product(gpu_util_target=(0.8,)),
    },
    # the oracle alone, with and without foresight: `--grid bounds --policies oracle`
    "bounds": {
        "oracle": [
            *_product(oracle_replica_rate=ORACLE_RATES),
            *_product(oracle_replica_rate=ORACLE_RATES, oracle_lead_s=(-15,), headroom_replicas=(0, 1)),
        ],
    },
}
"""Named grids: policy -> configurations; a knob a configuration leaves out keeps the scenario's
value (``targetUtilization=0.6`` keeps ``warm_pool`` as written). tidegate's default (``()``) is
always added."""


@dataclasses.dataclass(frozen=True)
class Overrides:
    """Sensitivity overrides applied to every scenario before the knobs.

    ``decode_scale`` multiplies the replica's decode rate; ``cold_start_s`` (seconds, ``None``:
    as written) rescales node provisioning and model load (mean, sd and floor alike) so that their
    means add up to it.
    """

    decode_scale: float = 1.0
    cold_start_s: float | None = None

    def apply(self, sc: Scenario) -> Scenario:
        return matrix.apply_overrides(sc, self.decode_scale, self.cold_start_s)


@dataclasses.dataclass(frozen=True)
class Task:
    scenario: str
    policy: str
    config: Config
    seed: int
    overrides: Overrides = Overrides()


@dataclasses.dataclass(frozen=True)
class Run:
    """One run's result: ``scenario`` is the scenario's name with its overrides (``spike@cold240s``),
    ``attainment`` the first class's (0..1), ``gpu_hours`` over the run."""

    scenario: str
    policy: str
    config: Config
    seed: int
    attainment: float
    gpu_hours: float


@dataclasses.dataclass(frozen=True)
class Point:
    """One configuration over its seeds: means, and the worst seed's attainment."""

    policy: str
    config: Config
    attainment: float
    worst: float
    gpu_hours: float
    seeds: int

    @property
    def label(self) -> str:
        return config_label(self.policy, self.config)


def config_label(policy: str, config: Config) -> str:
    """``tidegate[warm_pool=2 targetUtilization=0.6]``; ``tidegate[default]`` for ``()``."""
    inner = " ".join(f"{k}={v:g}" for k, v in config) or "default"
    return f"{policy}[{inner}]"


def configure(sc: Scenario, config: Config) -> Scenario:
    """``sc`` with the knobs of ``config`` set; raises :class:`FrontierError` for an unknown knob."""
    for knob, value in config:
        if knob not in KNOBS:
            raise FrontierError(f"unknown knob {knob!r} (known: {', '.join(KNOBS)})")
        sc = KNOBS[knob](sc, value)
    return sc


def tasks(
    scenarios: list[str],
    grid: str,
    seeds: Iterable[int],
    overrides: Overrides = Overrides(),
    pols: Iterable[str] = (),
    skipped: list[str] | None = None,
) -> list[Task]:
    """Every (scenario, policy, configuration, seed) of ``grid``; tidegate's default always included.

    A configuration the pool's spec refuses on a scenario (a warm pool larger than its
    ``maxReplicas``: the whole ``InferencePool`` is validated, as ``kubectl apply`` would) is left
    out, and said in ``skipped`` when given: one grid serves scenarios of every size. Raises
    :class:`FrontierError`, :class:`~.scenario.ScenarioError` (a scenario that does not load),
    :class:`~.policies.UnknownPolicy`.
    """
    if grid not in GRIDS:
        raise FrontierError(f"unknown grid {grid!r} (known: {', '.join(GRIDS)})")
    chosen = list(pols) or list(GRIDS[grid])
    seeds = list(seeds)
    out = []
    for name in scenarios:
        as_written = _scenario(name, overrides)
        for policy in chosen:
            configs = list(GRIDS[grid].get(policy, [()]))
            if policy == "tidegate":
                # the default once, as (), and each scenario once: a grid point that only restates
                # the default or an earlier point would run it twice
                kept, seen = [()], [as_written]
                for c in configs:
                    sc = configure(as_written, c)
                    if sc not in seen:
                        kept.append(c)
                        seen.append(sc)
                configs = kept
            for config in configs:
                refused = _refusal(as_written, policy, config)
                if refused:
                    if skipped is not None:
                        skipped.append(f"{as_written.name}: {config_label(policy, config)}: {refused}")
                    continue
                out += [Task(name, policy, config, s, overrides) for s in seeds]
    return out


def _refusal(sc: Scenario, policy: str, config: Config) -> str:
    """Why the pool's spec refuses ``config`` on ``sc`` ("" when it does not)."""
    try:
        policies.make(policy).hpa_behavior(configure(sc, config))  # tidegate: validates the InferencePool
    except FrontierError as exc:
        return str(exc).splitlines()[0]
    except ValueError as exc:  # pydantic.ValidationError
        return next((line.strip() for line in str(exc).splitlines() if "Value error" in line), str(exc).splitlines()[0])
    return ""


@lru_cache(maxsize=16)
def _scenario(name: str, overrides: Overrides) -> Scenario:
    return overrides.apply(scenario.load(name))


def run_one(task: Task) -> Run:
    """One simulation (module docstring); raises :class:`FrontierError`, :class:`~.scenario.ScenarioError`."""
    sc = configure(_scenario(task.scenario, task.overrides), task.config)
    sim = core.Simulator(sc, policies.make(task.policy), seed=task.seed).run()
    summary = report.summarize(sim)
    return Run(sc.name, task.policy, task.config, task.seed, in_quota_attainment(sim), summary.gpu_hours)


def quota_tenants(sc: Scenario) -> frozenset[str]:
    """Tenants the scenario gives a quota (their policy refusals are intended, see the module docstring)."""
    return frozenset(
        t.name
        for t in sc.admission.tenancy.tenants
        if t.tokens_per_second is not None or t.max_concurrency is not None or t.max_in_flight_tokens is not None
    )


def in_quota_attainment(sim: core.Simulator) -> float:
    """First-class SLO attainment (0..1) over the arrivals of tenants without a quota; 0 without any."""
    sc = sim.scenario
    first, quota = sc.classes[0], quota_tenants(sc)
    reqs = [r for r in sim.requests if r.priority == first and r.tenant not in quota]
    met = sum(1 for r in reqs if r.outcome is core.Outcome.SERVED and r.ttft_s <= sc.slo_s(first))
    return met / len(reqs) if reqs else 0.0


def run_all(todo: list[Task], jobs: int = 1, on_run: Callable[[Run, int, int], None] | None = None) -> list[Run]:
    """Every task, in ``todo``'s order; ``jobs`` > 1 runs them in that many processes.

    ``on_run(run, done, total)`` is called as each run completes (in completion order), so a caller
    can keep partial results of a long sweep.
    """
    results: list[Run | None] = [None] * len(todo)

    def record(i: int, r: Run) -> None:
        results[i] = r
        if on_run is not None:
            on_run(r, sum(x is not None for x in results), len(todo))

    if jobs <= 1:
        for i, t in enumerate(todo):
            record(i, run_one(t))
    else:
        # the slow runs (tidegate's engine in every pod) first, so that no worker idles at the end
        order = sorted(range(len(todo)), key=lambda i: (todo[i].policy != "tidegate", i))
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(run_one, todo[i]): i for i in order}
            try:
                for future in as_completed(futures):
                    record(futures[future], future.result())
            except BaseException:
                # one failed run ends the sweep now, not after every other run has been simulated
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    return [r for r in results if r is not None]


def load_runs(path: Path) -> list[Run]:
    """The runs a ``runs.jsonl`` holds (one JSON object per line, as ``--frontier`` writes them)."""
    import json

    runs = []
    for line in path.read_text().splitlines():
        if line.strip():
            doc = json.loads(line)
            doc["config"] = tuple((k, v) for k, v in doc["config"])
            runs.append(Run(**doc))
    return runs


def points(runs: Iterable[Run]) -> dict[str, list[Point]]:
    """Scenario -> one :class:`Point` per (policy, configuration), over the seeds run."""
    groups: dict[tuple[str, str, Config], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.scenario, r.policy, r.config), []).append(r)
    out: dict[str, list[Point]] = {}
    for (name, policy, config), rs in groups.items():
        att = [r.attainment for r in rs]
        point = Point(
            policy, config, statistics.fmean(att), min(att), statistics.fmean(r.gpu_hours for r in rs), len(rs)
        )
        out.setdefault(name, []).append(point)
    return out


def dominates(a: Point, b: Point) -> bool:
    """``a`` is as cheap or cheaper and as good or better than ``b``, and strictly one of the two."""
    return (
        a.gpu_hours <= b.gpu_hours
        and a.attainment >= b.attainment
        and (a.gpu_hours < b.gpu_hours or a.attainment > b.attainment)
    )


def frontier(pts: Iterable[Point]) -> list[Point]:
    """The non-dominated points, by GPU-hours (attainment then rises along the list)."""
    pts = list(pts)
    keep = [p for p in pts if not any(dominates(q, p) for q in pts)]
    return sorted(keep, key=lambda p: (p.gpu_hours, p.attainment))


def reach(pts: Iterable[Point], level: float, worst_seed: bool = False) -> Point | None:
    """The cheapest point whose mean (or, with ``worst_seed``, every seed's) attainment is >= ``level``."""
    ok = [p for p in pts if (p.worst if worst_seed else p.attainment) >= level]
    return min(ok, key=lambda p: (p.gpu_hours, -p.attainment)) if ok else None


def default_point(pts: Iterable[Point]) -> Point | None:
    """tidegate's configuration as the scenario is written."""
    return next((p for p in pts if p.policy == "tidegate" and p.config == ()), None)


def dominators(pts: Iterable[Point], default: Point) -> list[Point]:
    """Baseline points with mean attainment >= and mean GPU-hours <= ``default``'s (ties count)."""
    return sorted(
        (
            p
            for p in pts
            if p.policy in BASELINES and p.attainment >= default.attainment and p.gpu_hours <= default.gpu_hours
        ),
        key=lambda p: (p.gpu_hours, -p.attainment),
    )


def _by_policy(pts: list[Point]) -> Iterator[tuple[str, list[Point]]]:
    """Points by policy: tidegate, then the baselines in :data:`~.policies.POLICIES` order."""
    known = list(policies.POLICIES)
    order = sorted(
        dict.fromkeys(p.policy for p in pts),
        key=lambda name: (name not in known, known.index(name) if name in known else 0, name),
    )
    for policy in order:
        yield policy, [p for p in pts if p.policy == policy]


def _cell(mean: Point | None, worst: Point | None) -> str:
    def h(p: Point | None) -> str:
        return "never" if p is None else f"{p.gpu_hours:.2f}"

    return f"{h(mean)} / {h(worst)}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.2f}%"


def reach_table(name: str, pts: list[Point]) -> str:
    """Markdown: GPU-hours each policy needs to reach each level (mean / worst-seed criterion)."""
    levels = " | ".join(f"{100 * lv:g}%" for lv in LEVELS)
    lines = [
        f"| {name}: policy | configs | {levels} | best attainment (its GPU-h) |",
        "|---|---|" + "---|" * len(LEVELS) + "---|",
    ]
    rows = list(_by_policy(pts))
    default = default_point(pts)
    if default is not None:
        rows.insert(1 if rows and rows[0][0] == "tidegate" else 0, ("tidegate default", [default]))
    for label, group in rows:
        cells = " | ".join(_cell(reach(group, lv), reach(group, lv, worst_seed=True)) for lv in LEVELS)
        best = max(group, key=lambda p: (p.attainment, -p.gpu_hours))
        lines.append(f"| {label} | {len(group)} | {cells} | {_pct(best.attainment)} ({best.gpu_hours:.2f}) |")
    return "\n".join(lines)


def verdict(pts: list[Point]) -> str:
    """One line: tidegate's default point and whether a baseline configuration dominates it."""
    default = default_point(pts)
    if default is None:
        return "tidegate default: not run"
    head = (
        f"tidegate default: {_pct(default.attainment)} interactive SLO (worst seed {_pct(default.worst)}) "
        f"at {default.gpu_hours:.2f} GPU-h"
    )
    beaten = dominators(pts, default)
    if not beaten:
        return head + ": no baseline configuration dominates it"
    best = beaten[0]
    return (
        head + f": DOMINATED by {len(beaten)} baseline configuration(s), cheapest {best.label} "
        f"{_pct(best.attainment)} at {best.gpu_hours:.2f} GPU-h"
    )


def cheapest_configs(pts: list[Point]) -> str:
    """Markdown list: which configuration reaches each level cheapest, per policy (mean criterion)."""
    lines = []
    for policy, group in _by_policy(pts):
        parts = []
        for lv in LEVELS:
            p = reach(group, lv)
            parts.append(f"{100 * lv:g}%: " + ("never" if p is None else f"`{p.label}`"))
        lines.append(f"- {policy}: " + "; ".join(parts))
    return "\n".join(lines)


def points_table(pts: list[Point]) -> str:
    """Markdown: every point, frontier points marked."""
    lines = ["| configuration | mean attainment | worst seed | GPU-h | frontier |", "|---|---|---|---|---|"]
    for _, group in _by_policy(pts):
        front = set(frontier(group))
        for p in sorted(group, key=lambda p: p.gpu_hours):
            mark = "yes" if p in front else ""
            lines.append(f"| `{p.label}` | {_pct(p.attainment)} | {_pct(p.worst)} | {p.gpu_hours:.2f} | {mark} |")
    return "\n".join(lines)


def describe(all_points: dict[str, list[Point]], seeds: list[int], overrides: Overrides) -> str:
    """The whole Markdown report (every scenario's reach table, verdict, cheapest configurations)."""
    notes = [f"seeds {', '.join(map(str, seeds))}"]
    if overrides.decode_scale != 1.0:
        notes.append(f"decode rate x{overrides.decode_scale:g}")
    if overrides.cold_start_s is not None:
        notes.append(f"cold start {overrides.cold_start_s:g} s")
    parts = [
        "GPU-hours to reach each interactive SLO attainment level: `mean / worst seed` -- the cheapest "
        "configuration whose mean over the seeds reaches it / whose every seed does; `never` if none does. "
        f"({'; '.join(notes)})"
    ]
    for name, pts in all_points.items():
        parts += [f"### {name}", reach_table(name, pts), verdict(pts), cheapest_configs(pts)]
    return "\n\n".join(parts) + "\n"


def write(all_points: dict[str, list[Point]], out: Path, describe_md: str, plots: bool) -> list[Path]:
    """``frontier.md``, per scenario ``<name>.md`` and (with matplotlib) ``<name>.png``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "frontier.md"]
    paths[0].write_text(describe_md)
    for name, pts in all_points.items():
        path = out / f"{name}.md"
        path.write_text(
            "\n\n".join([f"# {name}", reach_table(name, pts), verdict(pts), cheapest_configs(pts), points_table(pts)])
            + "\n"
        )
        paths.append(path)
    if plots:
        from tidegate.sim.simulate import plots as plotting

        for name, pts in all_points.items():
            paths.append(plotting.frontier(name, pts, {p: frontier(g) for p, g in _by_policy(pts)}, out))
    return paths
