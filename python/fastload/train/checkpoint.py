"""Training checkpoints: written atomically (a locked temporary file beside the checkpoint, fsync,
``os.replace``; a ``fit_many`` group's all together), read back and checked, and tied to the
stores they were trained on by a fingerprint; the random generators' states they carry so a
resumed run draws what the stopped run would have."""

from __future__ import annotations

import errno
import math
import os
import pickle
import random
import warnings
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from fastload._checks import fspath
from fastload.files import check_writable, open_regular_file, previous_path, write_together
from fastload.options import MAX_CHECKPOINT_BYTES
from fastload.store import PathLike
from fastload.train.task import PATIENCE_FIGURES, REGRESSION

CHECKPOINT_FORMAT = "fastload-train-checkpoint-1"


def check_checkpoint_path(path: str) -> None:
    """Before the first epoch: the checkpoint's folder exists and takes a new file, and the
    path passes the output rule (fastload.files)."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ValueError(f"checkpoint {path}: its directory does not exist")
    check_writable(path, "checkpoint")


def save_group(checkpoints: Sequence[Tuple[str, Callable[[], dict]]]) -> None:
    """Writes each checkpoint (its path, and a function making its contents) as one change
    (:func:`~fastload.files.write_together`): every file is written and fsynced before any
    is renamed, so a failed write (a full disk: OSError "cannot write the checkpoint PATH: No
    space left on device") leaves the previous set whole, and a crash among the renames leaves
    a set :func:`load_group` resumes from. One checkpoint is written atomically on its own.
    By the output rule (fastload.files), a device or FIFO is refused and a link written through."""
    if checkpoints:
        write_together(
            [(path, lambda f, make=make: torch.save(make(), f)) for path, make in checkpoints], "checkpoint"
        )


def check_same_stores(resume: str, saved: dict, stores: dict) -> None:
    """Refuses to resume on stores other than the ones the checkpoint was trained on."""
    for what, now in stores.items():
        then = saved["stores"][what]
        if then is None and now is None:
            continue
        if then is None or now is None:
            with_or_without = "without" if then is None else "with"
            raise ValueError(f"{resume}: the checkpoint was written for a run {with_or_without} a {what}")
        if then["fingerprint"] != now["fingerprint"]:
            raise ValueError(
                f"{resume}: the checkpoint was trained on the {what} {then['path']}, and {now['path']} "
                "holds different records; resume with the store it was trained on"
            )


def invalid_checkpoint(path: str, what: str) -> ValueError:
    """The error for a checkpoint whose contents are not what fastload writes."""
    return ValueError(f"not a valid fastload checkpoint: {path}: {what}")


def load_checkpoint(path: PathLike) -> dict:
    """The checkpoint at ``path``, its structure checked (ValueError "not a valid fastload
    checkpoint: PATH: what is wrong"), its config completed as a current one reads: a config
    without a ``task`` (written before classification existed, when every run was a regression)
    gets ``"task": "regression"``, so it resumes as the run it was. What the checkpoint must
    match of the run resuming it (its model's parameters, its steps per epoch) the trainer checks."""
    path = fspath(path, "resume")
    with open_regular_file(
        path, MAX_CHECKPOINT_BYTES, "checkpoint"
    ) as file:  # a FIFO is refused, not waited on
        if os.fstat(file.fileno()).st_size == 0:
            raise ValueError(
                f"{path}: an empty file, not a fastload training checkpoint; resume from a file --checkpoint wrote"
            )
        try:
            checkpoint = torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            # Not torch's advice to load it with weights_only=False: that would run its code.
            raise ValueError(
                f"{path}: not a readable fastload training checkpoint (it holds more than tensors and "
                "plain values, or is no torch file); resume from a file --checkpoint wrote"
            ) from None
        except Exception as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(f"{path}: not a readable fastload training checkpoint ({reason})") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a fastload training checkpoint ({CHECKPOINT_FORMAT})")
    problem = _structure_problem(checkpoint)
    if problem is not None:
        raise invalid_checkpoint(path, problem)
    checkpoint["config"] = {"task": REGRESSION, **checkpoint["config"]}
    return checkpoint


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf


def _structure_problem(checkpoint: dict) -> Optional[str]:
    """What is wrong with the parts of a checkpoint that are read before the model is built
    (its types, counts and random states), or None."""
    for key, kind in (
        ("config", dict),
        ("model", dict),
        ("optimizer", dict),
        ("scaler", dict),
        ("history", list),
        ("rng", dict),
    ):
        if key not in checkpoint:
            return f"it has no {key}"
        if not isinstance(checkpoint[key], kind):
            return f"its {key} is a {type(checkpoint[key]).__name__}, not a {kind.__name__}"
    config, epoch, step = checkpoint["config"], checkpoint.get("epoch"), checkpoint.get("step")
    if not all(isinstance(name, str) for name in config):
        return "its config has keys that are not names"
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in checkpoint["model"].items()):
        return "its model holds something other than named tensors"
    for name, value in (("epoch", epoch), ("step", step)):
        if not _is_count(value):
            return f"{name} {value!r} is not a count (a whole number >= 0)"
    history = checkpoint["history"]
    if len(history) != epoch:
        return f"epoch {epoch} disagrees with its history of {len(history)} epochs"
    task = config.get("task", REGRESSION)
    if task not in PATIENCE_FIGURES:
        return f"its task {task!r} is none of {', '.join(PATIENCE_FIGURES)}"
    figure = PATIENCE_FIGURES[task][0]
    for i, metrics in enumerate(history):
        if not (isinstance(metrics, dict) and metrics.get("epoch") == i + 1 and figure in metrics):
            return f"history entry {i} is not the metrics of epoch {i + 1}"
    return (
        _run_problem(checkpoint)
        or _stores_problem(checkpoint)
        or _partial_problem(checkpoint)
        or _rng_problem(checkpoint["rng"])
    )


def _run_problem(checkpoint: dict) -> Optional[str]:
    """What is wrong with the record of the run that wrote a checkpoint (its name and options,
    compared by the trainer with the run resuming it), or None; checkpoints from before it
    existed have none."""
    run = checkpoint.get("run")
    if run is None:
        return None
    if not (
        isinstance(run, dict)
        and (run.get("name") is None or isinstance(run.get("name"), str))
        and isinstance(run.get("options"), dict)
        and all(isinstance(name, str) for name in run["options"])
    ):
        return "its run is not a name and named options"
    return None


def _stores_problem(checkpoint: dict) -> Optional[str]:
    """What is wrong with the fingerprints of the stores a checkpoint was trained on, or None."""
    if "stores" not in checkpoint:
        return "it has no stores"
    stores = checkpoint["stores"]

    def fingerprinted(store: Any) -> bool:
        return isinstance(store, dict) and all(isinstance(store.get(k), str) for k in ("path", "fingerprint"))

    if not isinstance(stores, dict) or set(stores) != {"store", "validation store"}:
        return "its stores are not the store and the validation store"
    if not fingerprinted(stores["store"]) or not (
        stores["validation store"] is None or fingerprinted(stores["validation store"])
    ):
        return "its stores are not a path and a fingerprint each"
    return None


def _partial_problem(checkpoint: dict) -> Optional[str]:
    """What is wrong with the position of a checkpoint written mid-epoch, or None."""
    if "partial" not in checkpoint:
        return "it has no partial"
    partial = checkpoint["partial"]
    if partial is None:
        return None  # written at the end of an epoch
    if (
        not isinstance(partial, dict)
        or not isinstance(partial.get("dataset"), dict)
        or not isinstance(partial.get("meter"), dict)
    ):
        return "its partial epoch is not a dataset position and a meter"
    dataset, meter = partial["dataset"], partial["meter"]
    if not all(_is_count(dataset.get(key)) for key in ("seed", "epoch", "position")):
        return f"its dataset position {dataset!r} is not three counts (seed, epoch, position)"
    counts = all(_is_count(meter.get(key)) for key in ("samples", "steps"))
    times = all(_is_seconds(meter.get(key)) for key in ("wait", "seconds"))
    if not (counts and times and isinstance(meter.get("loss_sum"), float)):
        return f"its partial epoch's meter {meter!r} is not counts, a loss sum and times"
    if dataset["epoch"] != checkpoint["epoch"] or dataset["position"] != meter["steps"]:
        return (
            f"its partial epoch (epoch {dataset['epoch']}, batch {dataset['position']}, {meter['steps']} steps) "
            f"is not the epoch after its {checkpoint['epoch']} finished ones"
        )
    data_seed = checkpoint["config"].get("data_seed", dataset["seed"])
    if dataset["seed"] != data_seed:
        return f"its dataset position has seed {dataset['seed']}, its config data_seed {data_seed}"
    return None


def _rng_problem(state: dict) -> Optional[str]:
    """What is wrong with the random generators' states (as :func:`rng_state` writes them), or None."""
    torch_state = state.get("torch")
    expected = torch.get_rng_state()
    if not (
        isinstance(torch_state, torch.Tensor)
        and torch_state.dtype == torch.uint8
        and torch_state.shape == expected.shape
    ):
        return f"its torch random state is not {expected.numel()} bytes"
    cuda = state.get("cuda")
    if not (
        isinstance(cuda, list) and all(isinstance(s, torch.Tensor) and s.dtype == torch.uint8 for s in cuda)
    ):
        return "its CUDA random states are not a list of byte tensors"
    numpy_state = state.get("numpy")
    if not (
        isinstance(numpy_state, list)
        and len(numpy_state) == 5
        and numpy_state[0] == "MT19937"
        and isinstance(numpy_state[1], torch.Tensor)
        and numpy_state[1].shape == (624,)
        and isinstance(numpy_state[2], int)
        and 0 <= numpy_state[2] <= 624
        and isinstance(numpy_state[3], int)
        and isinstance(numpy_state[4], float)
    ):
        return "its NumPy random state is not an MT19937 state"
    python_state = state.get("python")
    if not (
        isinstance(python_state, list)
        and len(python_state) == 626
        and all(isinstance(w, int) and 0 <= w < 2**32 for w in python_state[:625])
        and python_state[624] <= 624
        and (python_state[625] is None or isinstance(python_state[625], float))
    ):
        return "its Python random state is not a Mersenne Twister state"
    return None


def position(checkpoint: dict) -> tuple:
    """Where a checkpoint stopped (epoch, step and dataset position): a group's runs resume
    together only from one position."""
    partial = checkpoint["partial"]
    return checkpoint["epoch"], checkpoint["step"], str(partial and partial["dataset"])


def _load_if_present(path: str) -> Optional[dict]:
    try:
        return load_checkpoint(path)
    except FileNotFoundError:
        return None


def load_group(
    folder: str, paths: Sequence[str], names: Sequence[str], repair: bool
) -> List[Tuple[str, dict]]:
    """The checkpoints a ``fit_many`` group resumes from, one (path, checkpoint) per run, all at
    one position: the runs' files when they agree. After a group save that stopped among its
    renames (:func:`save_group`), some runs hold the new position and their ``.previous`` file
    the old one: then every run resumes from the latest position all of them hold (a warning
    says so) and, with ``repair`` (the folder is also the run's checkpoint folder), those
    ``.previous`` files are renamed back into place. ValueError naming each run's step when the
    runs share no position; FileNotFoundError when none has a checkpoint."""
    current = [_load_if_present(path) for path in paths]
    if all(c is not None for c in current) and len({position(c) for c in current}) == 1:
        return list(zip(paths, current))
    options = []
    for path, checkpoint in zip(paths, current):
        previous = _load_if_present(previous_path(path))
        found = [(path, checkpoint)] if checkpoint is not None else []
        options.append(found + ([(previous_path(path), previous)] if previous is not None else []))
    if not any(options):
        raise FileNotFoundError(
            errno.ENOENT,
            f"resume {folder}: no checkpoint of these runs ({', '.join(os.path.basename(p) for p in paths)})",
        )
    common = set.intersection(*({position(c) for _, c in found} for found in options))
    if not common:
        where = ", ".join(
            f"{name}: " + (" or ".join(f"step {c['step']}" for _, c in found) or "no checkpoint")
            for name, found in zip(names, options)
        )
        raise ValueError(
            f"resume {folder}: the runs' checkpoints stopped at different places ({where}); "
            "resume the runs that stopped together"
        )
    latest = max(common, key=lambda p: p[:2])
    chosen = [next((path, c) for path, c in found if position(c) == latest) for found in options]
    warnings.warn(
        f"resume {folder}: the group's last save was interrupted before every run's checkpoint was "
        f"in place; every run resumes from step {latest[1]}, the last step all of them saved",
        stacklevel=3,
    )
    if repair:
        for i, ((path, checkpoint), run_path) in enumerate(zip(chosen, paths)):
            if path != run_path:
                try:
                    os.replace(path, run_path)
                    chosen[i] = (run_path, checkpoint)
                except OSError:
                    pass  # resumed from the .previous file all the same
    return chosen


def rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": list(random.getstate()[1]) + [random.getstate()[2]],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    *words, gauss = state["python"]
    random.setstate((3, tuple(words), gauss))
