"""One error family (fastload.errors): every exception fastload defines derives from
FastloadError and from the built-in class a caller would otherwise catch, is exported from
`fastload`, and a missing optional dependency is one error type with an install hint."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fastload
from fastload import errors
from fastload._checks import import_optional

OWN_ERRORS = ["StoreError", "BadFilesError", "Diverged", "NotFittedError", "MissingDependencyError"]


@pytest.mark.parametrize("name", OWN_ERRORS)
def test_every_error_is_a_fastload_error_exported_from_the_package(name):
    error = getattr(errors, name)
    assert issubclass(error, fastload.FastloadError)
    assert getattr(fastload, name) is error
    assert name in fastload.__all__ and name in errors.__all__


@pytest.mark.parametrize(
    "name, builtin",
    [
        ("BadFilesError", ValueError),
        ("Diverged", ValueError),
        ("NotFittedError", ValueError),
        ("NotFittedError", AttributeError),
        ("MissingDependencyError", ImportError),
    ],
)
def test_each_error_is_also_the_builtin_a_caller_expects(name, builtin):
    assert issubclass(getattr(fastload, name), builtin)


def test_not_fitted_error_is_scikit_learns_when_it_is_installed():
    sklearn_exceptions = pytest.importorskip("sklearn.exceptions")
    assert issubclass(fastload.NotFittedError, sklearn_exceptions.NotFittedError)


def test_importing_fastload_does_not_import_scikit_learn():
    code = "import sys, fastload, fastload.errors; print('sklearn' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_a_damaged_store_is_caught_as_a_fastload_error(tmp_path):
    path = tmp_path / "not-a-store.bin"
    path.write_bytes(b"x" * 5000)
    with pytest.raises(fastload.FastloadError, match="not-a-store.bin"):
        fastload.Store(path)


def test_a_missing_optional_dependency_names_the_feature_and_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # imported already by another test
    with pytest.raises(fastload.MissingDependencyError) as caught:
        import_optional("matplotlib.pyplot", "--plot", "pip install matplotlib")
    assert str(caught.value) == "--plot needs matplotlib, which is not installed: pip install matplotlib"
    assert isinstance(caught.value, ImportError)


def test_an_installed_optional_dependency_is_the_module():
    assert import_optional("json", "nothing", "pip install nothing") is sys.modules["json"]


@pytest.mark.parametrize(
    "call",
    [
        lambda path: fastload.FastLoadDataset(path, 2.0),
        lambda path: fastload.FastLoadDataset(path, True),
        lambda path: fastload.FastLoadDataset(path, 2, seed=1.5),
        lambda path: fastload.FastLoadDataset(path, 2).set_epoch("1"),
        lambda path: fastload.FastLoadDataset(path, 2).load_state_dict(
            {"seed": 0, "epoch": 0, "position": 0.0}
        ),
        lambda path: fastload.DeviceLoader([], "cpu", depth=1.5),
        lambda path: fastload.Augment(seed=True),
    ],
)
def test_a_whole_number_of_another_type_is_a_value_error_as_the_rule_says(store_path, call):
    """errors.py's rule: a count, seed, epoch or position that is not an integer is refused
    as one out of range is, a ValueError stating the whole condition."""
    with pytest.raises(ValueError, match="must be a"):
        call(store_path)


@pytest.mark.parametrize(
    "call",
    [
        lambda path: fastload.FastLoadDataset(None, 2),
        lambda path: fastload.FastLoadDataset(path, 2, indices=[1.0]),
        lambda path: fastload.DeviceLoader(3, "cpu"),
        lambda path: fastload.DeviceLoader([], "cpu", timing=1),
        lambda path: fastload.to_device(fastload.Store(path).gather([0])[0], "cpu"),
    ],
)
def test_an_argument_of_the_wrong_kind_is_a_type_error_as_the_rule_says(store_path, call):
    with pytest.raises(TypeError):
        call(store_path)
