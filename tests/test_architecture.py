"""The package's imports flow one way (cli -> API modules -> store -> _core): no cycle, and
nothing imports the command line. .ci/check_imports.py decides; these tests run it."""

import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parent.parent / ".ci" / "check_imports.py"


def check(root=None):
    args = [sys.executable, str(CHECK)] + ([str(root)] if root else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_the_package_has_no_import_cycle_and_nothing_imports_the_cli():
    done = check()
    assert done.returncode == 0, done.stderr


def write_package(root: Path, modules: dict) -> Path:
    for name, text in {"__init__": "", "cli": "", **modules}.items():
        path = root / "fastload" / f"{name.replace('.', '/')}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    "modules, cycle",
    [
        (
            {
                "__init__": "from fastload.store import Store\n",
                "store": "def f():\n    from fastload import __version__\n",
            },
            "fastload -> fastload.store -> fastload",  # through the package __init__, lazily
        ),
        (
            {"sub/__init__": "", "sub/a": "from . import b\n", "sub/b": "from .a import x\n"},
            "fastload.sub.a -> fastload.sub.b -> fastload.sub.a",  # relative imports
        ),
    ],
)
def test_an_import_cycle_is_found(tmp_path, modules, cycle):
    done = check(write_package(tmp_path, modules))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"import cycle: {cycle}"]


def test_importing_the_cli_from_a_module_is_found(tmp_path):
    root = write_package(
        tmp_path, {"bench": "from fastload.cli import _gb\n", "__main__": "import fastload.cli\n"}
    )
    done = check(root)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "fastload.bench imports fastload.cli: nothing may import the command line"
    ]
