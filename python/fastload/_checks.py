"""Small argument checks and the optional-dependency import, shared by every module (one copy
of each: a module that needs one imports it from here)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, Union

import numpy as np

from fastload.errors import MissingDependencyError

PathLike = Union[str, "os.PathLike[str]"]

#: Every count, seed and epoch a dataset keeps in its int64 state slots stays below this.
INT_STATE_LIMIT = 2**62


def fspath(path: Any, what: str = "path") -> str:
    """``path`` as a str; a TypeError naming ``what`` for anything but a str or os.PathLike."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a str or os.PathLike, not {type(path).__name__}")
    return os.fspath(path)


def is_int(value: Any) -> bool:
    """A Python or NumPy integer, and not a bool (True is not a count)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def int_in_range(value: Any, name: str, minimum: int = 1) -> int:
    """``value`` as an int in [minimum, INT_STATE_LIMIT); a ValueError naming ``name`` otherwise,
    a float or bool included (the rule in `fastload.errors`: a whole number of another type is
    a ValueError, as one out of range). (The command line's argparse type for counts is
    ``fastload.cli.args.positive_int``.)"""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, not {value!r}")
    if value >= INT_STATE_LIMIT:
        raise ValueError(f"{name} must be below 2**62, not {value!r}")
    return int(value)


def import_optional(module: str, needed_for: str, install: str) -> ModuleType:
    """Imports an optional dependency, or raises MissingDependencyError saying what needs it and
    the command that installs it (e.g. ``pip install matplotlib``)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingDependencyError(
            f"{needed_for} needs {module.split('.')[0]}, which is not installed: {install}"
        ) from error
