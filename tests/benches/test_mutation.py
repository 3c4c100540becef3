"""Mutation testing (benches/mutation.py) as a command the suite keeps working: its module list
names real files, and, behind the `slow` marker (minutes to an hour per module on two cores;
skipped where mutmut or cargo-mutants is not installed), each module's tests detect at least
90% of its mutants. Kill rates and every survivor's fate: benches/RESULTS.md."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benches" / "mutation.py"
spec = importlib.util.spec_from_file_location("mutation", SCRIPT)
mutation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutation)

TARGET_KILL_RATE = 0.9


def test_every_module_and_test_file_it_names_exists():
    for module, tests in mutation.MODULES.items():
        assert (ROOT / "python" / "fastload" / module).is_file(), module
        assert tests and all((ROOT / test).is_file() for test in tests), module
    assert all((ROOT / path).is_file() for path in mutation.RUST_FILES)
    assert "[tool.mutmut]\n" in (ROOT / "pyproject.toml").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("module", [*mutation.MODULES, *mutation.RUST_FILES])
def test_the_tests_detect_most_mutants(module, tmp_path):
    tool = "cargo-mutants" if module in mutation.RUST_FILES else "mutmut"
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    command = [sys.executable, str(SCRIPT), module, "--work", str(tmp_path)]
    subprocess.run(command, cwd=ROOT, check=True)
    (result,) = json.loads((tmp_path / "summary.json").read_text())
    assert result["mutants"] > 0, result["log"]
    assert result["kill_rate"] >= TARGET_KILL_RATE, result["survivors"]
