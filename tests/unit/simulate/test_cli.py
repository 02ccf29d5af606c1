"""``tidegate simulate`` end to end on a small scenario file."""

import json

import yaml

from tests.unit.simulate.conftest import BASE
from tidegate.cli.main import main


def test_simulate_writes_tables_json_and_a_plot(tmp_path, capsys) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**BASE, "duration_s": 120}))
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", str(path), "--policy", "tidegate", "--seed", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| tiny | tidegate | interactive |" in printed
    summary = json.loads((out / "summary.json").read_text())[0]
    assert summary["policy"] == "tidegate" and summary["seed"] == 4
    assert (out / "tiny.png").read_bytes().startswith(b"\x89PNG")


def test_unknown_policy_is_exit_2(capsys) -> None:
    assert main(["simulate", "--scenario", "spike", "--policy", "magic"]) == 2
    assert "unknown policy 'magic'" in capsys.readouterr().err
