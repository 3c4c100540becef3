"""The runs of a :func:`~fastload.train.fit_many` group, in each form they are given: a list of
dicts, a JSON runs file (``fastload train --runs-file``), or a number of runs whose per-run
options are lists of values (``fastload train --runs 2 --lr 1e-3,3e-3``); and what a group's
results come to: the runs side by side (:func:`runs_table`) and the status ``fastload train``
exits with (:func:`exit_status`). The command line and Python users go through the same
functions, so a runs file or a list of learning rates means the same in both."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from fastload._checks import fspath, is_int
from fastload.files import read_regular_file
from fastload.options import MAX_RUNS_FILE_BYTES
from fastload.store import PathLike
from fastload.train.config import option_problem

# What may differ between the runs of a fit_many group: the model and its optimization. The
# rest shapes the shared data stream (or is the group's, like epochs and the device).
RUN_OPTIONS = ("name", "lr", "schedule", "weight_decay", "seed", "backbone", "num_features", "lattice_size")
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def read_runs_file(path: PathLike) -> List[dict]:
    """The runs a JSON file lists for :func:`fit_many` (a non-empty list of objects, one per
    run). Like a labels CSV, it must be a regular file, of at most ``MAX_RUNS_FILE_BYTES``
    (``/dev/zero`` or a FIFO is refused, not read until memory runs out); JSON nested too deep
    for the parser is refused too, each with a ValueError naming the file."""
    path = fspath(path, "runs file")
    data = read_regular_file(path, MAX_RUNS_FILE_BYTES, "runs file")
    try:
        runs = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"runs file {path}: not JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"runs file {path}: nested too deeply to be a list of runs") from None
    if not isinstance(runs, list) or not runs or not all(isinstance(run, dict) for run in runs):
        raise ValueError(f"runs file {path}: expected a non-empty JSON list of objects, one per run")
    return runs


def split_values(
    values: Mapping[str, Sequence], count: Optional[int] = None, *, spell: Callable[[str], str] = str
) -> Tuple[dict, dict]:
    """Per-run options given as lists of values, split into ``(shared, varying)``: an option
    with one value gives it to every run (``shared`` holds the value), one with ``count`` values
    gives each run its own (``varying`` holds the list). Any other length is a ValueError naming
    the option as ``spell`` writes it (the command line passes its flags: ``--lr``). Without
    ``count`` (one run, or runs listed elsewhere) every option takes one value."""
    for name, given in values.items():
        if len(given) not in (1, count or 1):
            need = (
                f"{spell('runs')} {count}: give 1 or {count}"
                if count
                else f"one run: give 1 (or use {spell('runs')})"
            )
            raise ValueError(f"{spell(name)} gives {len(given)} values for {need}")
    shared = {name: given[0] for name, given in values.items() if len(given) == 1}
    varying = {name: list(given) for name, given in values.items() if len(given) > 1}
    return shared, varying


def runs_from_values(varying: Mapping[str, Sequence], count: int) -> List[dict]:
    """``count`` runs, the i-th taking the i-th value of each option of ``varying`` (the
    options that differ, as :func:`split_values` returns them; a run without one takes the
    group's value)."""
    return [{name: values[i] for name, values in varying.items()} for i in range(count)]


def resolve_runs(
    runs: Union[int, PathLike, Sequence[Mapping]], shared: Mapping[str, Any]
) -> Tuple[List[dict], dict]:
    """:func:`fit_many`'s ``runs`` and ``shared`` options, as ``(runs, shared)``: a list of one
    dict per run, and options that are the same for every run.

    ``runs`` is a list of dicts (taken as it is), the path of a JSON runs file
    (:func:`read_runs_file`), or a number N of runs, whose per-run options (``RUN_OPTIONS``) in
    ``shared`` may then be lists (or tuples) of N values, one per run, as ``fastload train
    --runs N`` takes comma lists; a list of one value, or a single value, applies to every run.
    Refused: no runs, or lists of values for runs given another way (ValueError); ``runs`` of
    another type (TypeError).
    """
    if isinstance(runs, (str, os.PathLike)):
        runs = read_runs_file(runs)
    lists = {name: shared[name] for name in RUN_OPTIONS if isinstance(shared.get(name), (list, tuple))}
    rest = {name: value for name, value in shared.items() if name not in lists}
    if is_int(runs):
        _check_run_count(runs)
        one, varying = split_values(lists, int(runs))
        return runs_from_values(varying, int(runs)), {**rest, **one}
    if isinstance(runs, (bool, float, Mapping)) or not isinstance(runs, Iterable):
        raise TypeError(
            f"runs must be a list of dicts (one per run), a runs file or a number of runs, not {type(runs).__name__}"
        )
    runs = list(runs)
    if not runs:
        raise ValueError("runs is empty: give one dict of options per run")
    _check_run_count(len(runs))
    for name, values in lists.items():
        if len(values) != 1:
            raise ValueError(
                f"{name} is a list of {len(values)} values, one per run: give runs as a number of runs "
                "to take values from lists, or put each run's value in its dict"
            )
    return runs, {**rest, **{name: values[0] for name, values in lists.items()}}


def _check_run_count(count: int) -> None:
    """Refuses a group of more runs than ``MAX_RUNS`` before any is built (ValueError, one line)."""
    problem = option_problem("runs", count)
    if problem:
        raise ValueError(f"runs {problem}")


def named_run(index: int, run: Mapping, taken: Sequence[str]) -> Tuple[str, dict]:
    """The name (default ``run<index>``) and options of a group's run, refused with a
    ValueError when it sets an option that cannot differ between runs, or when its name is
    unsafe as a file name or already ``taken``."""
    run = dict(run)
    name = str(run.pop("name", f"run{index}"))
    unknown = sorted(set(run) - set(RUN_OPTIONS))
    if unknown:
        raise ValueError(
            f"run {name}: {', '.join(unknown)} cannot differ between runs (per run: {', '.join(RUN_OPTIONS)})"
        )
    if not RUN_NAME.fullmatch(name) or name in taken:
        raise ValueError(f"run name {name!r} must be unique, 1-64 letters, digits, '.', '_' or '-'")
    return name, run


def runs_table(results: list, runs: list) -> str:
    """fit_many's ``results`` for its ``runs`` (the per-run options shown) side by side, best last epoch first (runs without one last): lowest validation
    RMSE (ties: lowest MAE), or highest validation accuracy when classifying (ties: lowest
    validation loss); with the memory each holds for its parameters and optimizer state."""
    classifying = results[0].task == "classification"  # the group's
    # (sort key, column, column) of a last epoch's figures
    if classifying:
        header = ("run", "options", "val loss", "val accuracy", "steps", "state MB", "status")

        def figures(last: dict) -> tuple:
            key = (-last["val_accuracy"], last["val_loss"])
            return (key, f"{last['val_loss']:.4g}", f"{100 * last['val_accuracy']:.1f}%")
    else:
        header = ("run", "options", "val MAE", "val RMSE", "steps", "state MB", "status")

        def figures(last: dict) -> tuple:
            return ((last["val_rmse"], last["val_mae"]), f"{last['val_mae']:.4g}", f"{last['val_rmse']:.4g}")

    rows = []
    for result, run in zip(results, runs):
        last = result.history[-1] if result.history else None
        key, first, second = figures(last) if last else ((float("inf"),), "-", "-")
        status = "done" if result.completed else (result.stopped or "max-steps").split(":")[0]
        rows.append(
            (
                key,
                result.name,
                " ".join(f"{k}={v}" for k, v in run.items() if k != "name") or "-",
                first,
                second,
                str(result.steps),
                f"{result.state_bytes / 1e6:.2f}",
                status,
            )
        )
    rows.sort(key=lambda row: row[0])
    cells = [header] + [row[1:] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in cells)


def exit_status(results: list) -> int:
    """The status ``fastload train`` exits with after its runs: 1 when every run diverged
    (nothing worth keeping was trained), else 0 (a run stopped by ``max_steps`` or
    ``patience``, or diverged beside another that did not, is a result)."""
    diverged = [r for r in results if r.stopped is not None and r.stopped.startswith("diverged")]
    return 1 if len(diverged) == len(results) else 0
