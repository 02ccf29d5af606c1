"""Scenarios: the built-ins load, bad files say what is wrong."""

import pytest
import yaml

from tests.unit.simulate.conftest import BASE
from tidegate.sim.simulate import scenario


def test_builtins_cover_the_issue() -> None:
    names = scenario.builtin_names()
    assert {"spike", "steady", "mixed", "noisy-tenant", "diurnal", "replica-lost"} <= set(names)
    spike = scenario.load("spike")
    assert sum(s.rate_per_s for s in spike.streams) * 60 == pytest.approx(300)
    assert spike.spikes[0].factor == 3
    assert spike.cluster.node_provisioning_s.mean == 110 and spike.cluster.model_load_s.mean == 80
    assert spike.slo_s("interactive") == 2.0


def test_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(scenario.ScenarioError, match="spike"):
        scenario.load("no-such-scenario")


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"streams": []}, "at least one stream"),
        ({"admission": {"tokenBudget": 0}}, "admission"),
        ({"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "scaling"),
        ({"streams": [{**BASE["streams"][0], "priority": "gold"}]}, "without an SLO"),
        ({"cluster": {"initial_replicas": 1, "node_provisioning_s": {"mean": 1, "typo": 2}}}, "node_provisioning_s"),
        ({"replica": {"decode_tokens_per_s": 0}}, "decode_tokens_per_s"),
    ],
)
def test_bad_fields_are_named(patch: dict, message: str) -> None:
    with pytest.raises(scenario.ScenarioError, match=message):
        scenario.parse({**BASE, **patch})


def test_a_file_loads_by_path(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in BASE.items() if k != "name"}))
    assert scenario.load(str(path)).name == "mine"
