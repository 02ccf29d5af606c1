"""A scenario where each baseline is known to lose, and tidegate does not.

One tenant sends 10x its quota. Tidegate refuses the excess as *policy* (``tenant_rate``), which
never buys GPUs; every baseline sees the excess as demand (a queue, concurrency, a busy GPU) and
buys GPUs for it. The GPU-utilisation HPA also loses on plain steady load: NVML utilisation reads
~100% at any batch size, so it scales to the maximum.
"""

import pytest

from tests.unit.simulate.conftest import BASE
from tidegate.sim.simulate import core, policies, report, scenario

NOISY = {
    **BASE,
    "name": "tiny-noisy",
    "duration_s": 420,
    "faults": [],
    "load": {},
    "streams": [
        {**BASE["streams"][0], "tenant": "a", "rate_per_s": 1.0},
        {**BASE["streams"][1], "tenant": "b", "rate_per_s": 0.5},
        {**BASE["streams"][0], "tenant": "noisy", "rate_per_s": 1.0,
         "prompt": {"median": 4000, "sigma": 0.5, "max": 8000},
         "spikes": [{"start_s": 30, "end_s": 420, "factor": 10}]},
    ],
    "cluster": {**BASE["cluster"], "initial_replicas": 2},
    "admission": {**BASE["admission"],
                  "tenancy": {"tenants": [{"name": "noisy", "tokensPerSecond": 1200, "burstTokens": 12000}]}},
    "scaling": {**BASE["scaling"], "maxReplicas": 8},
    "baselines": {"queue_waiting_target": 5, "http_concurrency_target": 16, "gpu_util_target": 0.8},
}  # fmt: skip


@pytest.fixture(scope="module")
def noisy() -> dict[str, report.Summary]:
    sc = scenario.parse(NOISY)
    return {name: report.summarize(core.Simulator(sc, policies.make(name), seed=2).run()) for name in policies.POLICIES}


def test_tidegate_buys_no_gpu_for_a_tenant_over_quota(noisy: dict[str, report.Summary]) -> None:
    tidegate = noisy["tidegate"]
    assert tidegate.extra_gpus == 0
    assert tidegate.classes["interactive"].refusals.get("tenant_rate", 0) > 100


@pytest.mark.parametrize("baseline", ["queue", "http", "gie", "gpu"])
def test_each_baseline_buys_gpus_for_it(noisy: dict[str, report.Summary], baseline: str) -> None:
    assert noisy[baseline].extra_gpus > 0
    assert noisy[baseline].gpu_hours > noisy["tidegate"].gpu_hours


def test_gpu_utilisation_scaling_buys_the_maximum_on_steady_load() -> None:
    steady = scenario.parse({**BASE, "load": {}, "faults": [], "duration_s": 240})
    gpu = report.summarize(core.Simulator(steady, policies.make("gpu"), seed=1).run())
    tidegate = report.summarize(core.Simulator(steady, policies.make("tidegate"), seed=1).run())
    assert gpu.peak_gpus == steady.scaling.max_replicas
    assert gpu.gpu_hours > 2 * tidegate.gpu_hours
