"""Layering rules of the house, checked with import-linter (contracts in pyproject.toml)."""

import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "import-linter is a test dependency: pip install -e '.[test]'"
    result = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_top_level_folder_is_imported_by_its_bare_name() -> None:
    bare = ("import api", "from api ", "import admission", "from admission ", "import scaler", "from scaler ")
    offenders = []
    for path in REPO.rglob("*.py"):
        if ".venv" in path.parts:
            continue
        for line in path.read_text().splitlines():
            if line.lstrip().startswith(bare):
                offenders.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert not offenders, offenders
