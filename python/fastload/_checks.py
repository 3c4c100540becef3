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


#: Units a size may be given in (`byte_size`): decimal as disks are sold, binary as RAM is.
SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def byte_size(value: Any, name: str) -> int:
    """``value`` as a positive number of bytes: an int, or a text such as "150GB", "2.5 GiB" or
    "800000" (units in `SIZE_UNITS`, any case); a ValueError naming ``name`` otherwise."""
    if is_int(value) and not isinstance(value, bool):
        number, unit = float(value), ""
    elif isinstance(value, str):
        text = value.strip().upper().replace(" ", "")
        digits = text.rstrip("KMGTIB")
        number, unit = _float_or_none(digits), text[len(digits) :]
    else:
        number, unit = None, ""
    if number is None or unit not in SIZE_UNITS or not 1 <= number * SIZE_UNITS[unit] < INT_STATE_LIMIT:
        raise ValueError(f"{name} must be a size such as 150GB, 2.5GiB or a number of bytes, not {value!r}")
    return int(number * SIZE_UNITS[unit])


def _float_or_none(text: str):
    try:
        number = float(text)
    except ValueError:
        return None
    return number if number == number and abs(number) != float("inf") else None


def import_optional(module: str, needed_for: str, install: str) -> ModuleType:
    """Imports an optional dependency, or raises MissingDependencyError saying what needs it and
    the command that installs it (e.g. ``pip install matplotlib``)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingDependencyError(
            f"{needed_for} needs {module.split('.')[0]}, which is not installed: {install}"
        ) from error
