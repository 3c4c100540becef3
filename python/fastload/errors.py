"""Every exception fastload defines, and the rule that decides which one a caller sees.

- A problem with a store file (missing, unreadable, not a store, damaged, changed while open)
  is `StoreError`. Any other file or folder that is missing, not what it must be, or fails to
  be written is the OSError Python itself would raise (`FileNotFoundError`,
  `NotADirectoryError`, `FileExistsError` for an existing destination, a full disk's
  `OSError`), its message naming the file; a path the output rule refuses (a device, a FIFO,
  a folder) is a ValueError naming it and what it is (`fastload.files`).
- A wrong argument is `ValueError`, or `TypeError` when it is an object of the wrong kind
  altogether (a path that is neither str nor os.PathLike, a flag that is not True or False, a
  dtype, a source that yields no batches, an array of indices that are not integers); an index
  out of range is `IndexError`. A whole number (a count, size, seed, epoch or position) given as
  anything but an integer (2.0, True, "1") is a `ValueError`, as one out of its range is: one
  check and one message state the whole condition ("batch_size must be an integer >= 1, not
  2.0"), and NumPy integers pass where Python ints do. Using a store, writer or prefetcher after
  it was closed, committed or discarded is a `ValueError` too.
- A condition only fastload can name is its own class here. Each derives from `FastloadError`,
  so `except fastload.FastloadError` catches everything fastload raises on purpose, and also
  from the built-in class a caller would otherwise expect (`BadFilesError` is a ValueError,
  `MissingDependencyError` an ImportError), so existing handlers keep working.
- An allocation too large for the machine is `MemoryError`.
- `RuntimeError` is left for a broken internal invariant: a bug in fastload, to be reported.

The `fastload` command turns each of them into a message and exit status 1 (2 for a bad
command line).
"""

from __future__ import annotations

from typing import List, Tuple

from fastload._core import FastloadError, StoreError


class BadFilesError(FastloadError, ValueError):
    """`strict` packing found files that cannot become records; `files` lists (file, reason)."""

    def __init__(self, message: str, files: List[Tuple[str, str]]):
        super().__init__(message)
        self.files = files


class Diverged(FastloadError, ValueError):
    """A model's parameters are no longer finite: its run stops (fit raises it; fit_many stops
    only that run and reports it)."""


class MissingDependencyError(FastloadError, ImportError):
    """An optional package a feature needs is not installed; the message says how to install it."""


def __getattr__(name: str):
    # NotFittedError derives from scikit-learn's own when that is installed (its estimator
    # checks ask for exactly that class); made on first use so `import fastload` does not
    # import scikit-learn (about a second).
    if name == "NotFittedError":
        globals()[name] = not_fitted_error_class()
        return globals()[name]
    raise AttributeError(f"module 'fastload.errors' has no attribute {name!r}")


def not_fitted_error_class() -> type:
    """The NotFittedError class: scikit-learn's NotFittedError when it is installed, else a
    ValueError and AttributeError as that one is; a FastloadError either way."""
    try:
        from sklearn.exceptions import NotFittedError as base
    except ImportError:
        bases: tuple = (FastloadError, ValueError, AttributeError)
    else:
        bases = (FastloadError, base)

    class NotFittedError(*bases):
        """An estimator was used before `fit`."""

    NotFittedError.__module__ = "fastload"
    NotFittedError.__qualname__ = "NotFittedError"
    return NotFittedError


__all__ = [
    "FastloadError",
    "StoreError",
    "BadFilesError",
    "Diverged",
    "NotFittedError",  # noqa: F822 (made on first use by __getattr__)
    "MissingDependencyError",
]
