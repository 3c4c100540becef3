"""The package's imports flow one way, layer by layer (interface -> applications -> pipeline ->
store -> foundation, docs/ARCHITECTURE.md): no cycle, no import of a higher layer or of the
command line, no private name shared between modules. .ci/check_imports.py decides; these
tests run it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parent.parent / ".ci" / "check_imports.py"


def check(root=None):
    args = [sys.executable, str(CHECK)] + ([str(root)] if root else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_the_package_keeps_its_layers_has_no_cycle_and_nothing_imports_the_cli():
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
            {"dataset/__init__": "", "dataset/a": "from . import b\n", "dataset/b": "from .a import x\n"},
            "fastload.dataset.a -> fastload.dataset.b -> fastload.dataset.a",  # relative imports
        ),
    ],
)
def test_an_import_cycle_is_found(tmp_path, modules, cycle):
    done = check(write_package(tmp_path, modules))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == f"import cycle: {cycle}"


def test_importing_the_cli_from_a_module_is_found(tmp_path):
    root = write_package(
        tmp_path, {"bench": "from fastload.cli import gigabytes\n", "__main__": "import fastload.cli\n"}
    )
    done = check(root)
    assert done.returncode == 1
    assert (
        "fastload.bench imports fastload.cli: nothing may import the command line" in done.stderr.splitlines()
    )


@pytest.mark.parametrize(
    "modules, problem",
    [
        (
            {"store": "from fastload.dataset import plan\n", "dataset/__init__": "", "dataset/plan": ""},
            "fastload.store (store) imports fastload.dataset.plan (pipeline), a higher layer",
        ),
        (
            {"files": "def f():\n    import fastload.train\n", "train/__init__": ""},
            "fastload.files (foundation) imports fastload.train (applications), a higher layer",  # lazily
        ),
        (
            {"demo": "from fastload import pack\n", "pack": ""},  # the submodule, not the package
            None,
        ),
        (
            {"demo": "from fastload import Store\n"},  # the package __init__: the interface
            "fastload.demo (applications) imports fastload (interface), a higher layer",
        ),
        (
            {"scratch": ""},
            "fastload.scratch is in no layer of .ci/check_imports.py's LAYERS "
            "(place it there and in docs/ARCHITECTURE.md)",
        ),
    ],
)
def test_a_lower_layer_importing_a_higher_one_is_found(tmp_path, modules, problem):
    done = check(write_package(tmp_path, modules))
    assert done.stderr.splitlines() == ([problem] if problem else [])
    assert done.returncode == (1 if problem else 0)


@pytest.mark.parametrize(
    "modules, problem",
    [
        (
            {"store": "def _fspath(p):\n    return p\n", "pack": "from fastload.store import _fspath\n"},
            "fastload.pack imports the private name _fspath from fastload.store",
        ),
        (
            {"train/__init__": "", "train/a": "from .b import _helper\n", "train/b": "_helper = 1\n"},
            "fastload.train.a imports the private name _helper from fastload.train.b",
        ),
        ({"store": "from fastload import _core\n", "_core": ""}, None),  # a private module is the foundation
        ({"store": "from fastload._core import __version__\n", "_core": ""}, None),  # a dunder is public
    ],
)
def test_a_private_name_imported_from_another_module_is_found(tmp_path, modules, problem):
    done = check(write_package(tmp_path, modules))
    assert done.stderr.splitlines() == ([problem] if problem else [])
    assert done.returncode == (1 if problem else 0)


ROOT = CHECK.parent.parent
#: Most lines of a module a reader can hold (#26): Python modules, and Rust files without their
#: tests (a `#[cfg(test)]` module ends a Rust file or sits in a file of its own).
MAX_PYTHON_LINES, MAX_RUST_LINES = 600, 800


def code_lines(path: Path) -> int:
    """A module's lines; a Rust file's up to its inline test module (`#[cfg(test)]`, then
    `mod tests {`)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix == ".rs":
        for i, line in enumerate(lines[:-1]):
            if line.startswith("#[cfg(test)]") and re.match(r"mod \w+ \{", lines[i + 1]):
                return i
    return len(lines)


def test_no_module_is_longer_than_a_reader_can_hold():
    too_long = [
        f"{path.relative_to(ROOT)}: {code_lines(path)} lines"
        for path in sorted((ROOT / "python" / "fastload").rglob("*.py"))
        if code_lines(path) > MAX_PYTHON_LINES
    ] + [
        f"{path.relative_to(ROOT)}: {code_lines(path)} lines without tests"
        for path in sorted((ROOT / "rust").rglob("*.rs"))
        if not path.stem.endswith("tests") and code_lines(path) > MAX_RUST_LINES
    ]
    assert too_long == []


def orphan_test_problems(root: Path) -> list:
    """Test files in a folder of tests/ that name no module (docs/ARCHITECTURE.md, "Tests"):
    `tests/<pkg>/test_<mod>.py` must name `python/fastload/<pkg>/<mod>.py` or a subpackage
    `<mod>/`; `test_<pkg>.py` names the package itself, and `test_<mod>_<aspect>.py` (or
    `test_<pkg>_<aspect>.py`) a second file of one module. `tests/benches/test_<script>.py`
    names `benches/<script>.*` the same way. So a module renamed or removed without its tests
    leaves a test that fails here, not a file nobody can find from the code."""
    problems = []
    for test in sorted((root / "tests").glob("*/**/test_*.py")):
        folder = test.parent.relative_to(root / "tests")
        if folder.parts[0] == "benches":
            source = root / "benches"
            names = {p.name.split(".")[0] for p in source.iterdir() if p.is_file()}
        else:
            source = root / "python" / "fastload" / folder
            if not (source / "__init__.py").is_file():
                problems.append(f"tests/{folder}/: no package python/fastload/{folder}/")
                continue
            names = {p.stem for p in source.glob("*.py") if p.stem != "__init__"}
            names |= {p.name for p in source.iterdir() if (p / "__init__.py").is_file()}
            names.add(source.name)  # the package itself: its __init__.py
        tested = test.stem[len("test_") :]
        if not any(tested == name or tested.startswith(name + "_") for name in names):
            problems.append(f"tests/{folder}/{test.name}: no module {source.relative_to(root)}/{tested}")
    return problems


def test_every_test_file_in_a_folder_names_a_module_there():
    assert orphan_test_problems(ROOT) == []


@pytest.mark.parametrize(
    "test, problem",
    [
        ("tests/dataset/test_plan.py", None),
        ("tests/dataset/test_dataset_store.py", None),
        ("tests/dataset/test_dataset.py", None),
        (
            "tests/dataset/test_walks.py",
            "tests/dataset/test_walks.py: no module python/fastload/dataset/walks",
        ),
        ("tests/gone/test_plan.py", "tests/gone/: no package python/fastload/gone/"),
        ("tests/benches/test_scale.py", None),
        ("tests/benches/test_speed.py", "tests/benches/test_speed.py: no module benches/speed"),
    ],
)
def test_a_test_file_whose_module_was_renamed_is_found(tmp_path, test, problem):
    package = tmp_path / "python" / "fastload" / "dataset"
    package.mkdir(parents=True)
    for name in ("__init__.py", "plan.py", "dataset.py"):
        (package / name).write_text("")
    (tmp_path / "benches").mkdir()
    (tmp_path / "benches" / "scale.py").write_text("")
    (tmp_path / test).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / test).write_text("")
    assert orphan_test_problems(tmp_path) == ([problem] if problem else [])
