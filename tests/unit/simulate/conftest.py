"""Small scenarios for simulator tests: minutes of virtual time, a second or two of wall time each."""

import pytest

from tidegate.sim.simulate import scenario

BASE = {
    "name": "tiny",
    "duration_s": 300,
    "streams": [
        {"tenant": "a", "priority": "interactive", "rate_per_s": 2.0, "max_tokens": 512,
         "prompt": {"median": 1500, "sigma": 0.8, "max": 8000}, "output": {"median": 120, "sigma": 0.7}},
        {"tenant": "b", "priority": "batch", "rate_per_s": 1.0, "max_tokens": 512,
         "prompt": {"median": 1500, "sigma": 0.8, "max": 8000}, "output": {"median": 200, "sigma": 0.7}},
    ],
    "load": {"spikes": [{"start_s": 100, "end_s": 200, "factor": 3}]},
    "cluster": {"initial_replicas": 1, "node_provisioning_s": {"mean": 60, "sd": 10, "min": 30},
                "model_load_s": {"mean": 30}},
    "client_timeout_s": {"interactive": 30, "batch": 120},
    "model": {"name": "m", "maxContextTokens": 16384},
    "admission": {"tokenBudget": 32768, "maxConcurrency": 32, "adaptiveBudget": {"enabled": False}},  # fixed: the spike refuses
    "faults": [{"at_s": 150, "kind": "lose_replica", "count": 1}],
    "scaling": {"minReplicas": 1, "maxReplicas": 6, "pollingIntervalSeconds": 15,
                "scaleDownCooldownSeconds": 60},
    "warm_pool": 1,
    "drain_limit_s": 200,
}  # fmt: skip


@pytest.fixture
def tiny() -> scenario.Scenario:
    """Spike, a lost replica, one replica to start with: every outcome occurs."""
    return scenario.parse(BASE)
