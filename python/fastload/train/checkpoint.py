"""Training checkpoints: written atomically (a locked temporary file beside the checkpoint, fsync,
``os.replace``; a ``fit_many`` group's all together), read back, and tied to the
stores they were trained on by a fingerprint; the random generators' states they carry so a
resumed run draws what the stopped run would have."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import struct
import warnings
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from fastload.atomic import check_writable, previous_path, write_together
from fastload.store import PathLike, Store, _fspath
from fastload.train.task import REGRESSION

CHECKPOINT_FORMAT = "fastload-train-checkpoint-1"
HEADER_SIZE = 4096  # docs/FORMAT.md: the header page, ending with its own checksum
CHECKSUM_SECTION_FIELD = 80  # docs/FORMAT.md: offset and length (u64 each) of the record checksums


def check_checkpoint_path(path: str) -> None:
    """Before the first epoch: the checkpoint's folder exists and takes a new file."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ValueError(f"checkpoint {path}: its directory does not exist")
    if os.path.isdir(path):
        raise ValueError(f"checkpoint {path} is a directory")
    check_writable(path, "checkpoint")


def save_group(checkpoints: Sequence[Tuple[str, Callable[[], dict]]]) -> None:
    """Writes each checkpoint (its path, and a function making its contents) as one change
    (:func:`~fastload.atomic.write_together`): every file is written and fsynced before any
    is renamed, so a failed write (a full disk: OSError "cannot write the checkpoint PATH: No
    space left on device") leaves the previous set whole, and a crash among the renames leaves
    a set :func:`load_group` resumes from. One checkpoint is written atomically on its own."""
    if checkpoints:
        write_together(
            [(path, lambda f, make=make: torch.save(make(), f)) for path, make in checkpoints], "checkpoint"
        )


def store_fingerprint(store: Store) -> str:
    """SHA-256 of a store's header page (which ends with the header's own checksum) and of its
    record checksums: stores with the same fingerprint hold the same records and labels."""
    with open(store.path, "rb") as f:
        header = f.read(HEADER_SIZE)
        offset, length = struct.unpack_from("<QQ", header, CHECKSUM_SECTION_FIELD)
        digest = hashlib.sha256(header)
        f.seek(offset)
        while length > 0:
            chunk = f.read(min(length, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            length -= len(chunk)
    return digest.hexdigest()


def check_same_stores(resume: str, saved: dict, stores: dict) -> None:
    """Refuses to resume on stores other than the ones the checkpoint was trained on
    (checkpoints written before fingerprints were recorded are compared by config alone)."""
    for what, now in stores.items():
        then = saved.get("stores", stores)[what]
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


def load_checkpoint(path: PathLike) -> dict:
    """The checkpoint at ``path``, its config completed as a current one reads: a config without
    a ``task`` (written before classification existed, when every run was a regression) gets
    ``"task": "regression"``, so it resumes as the run it was."""
    path = _fspath(path, "resume")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ValueError(f"{path}: not a readable fastload training checkpoint ({exc})") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a fastload training checkpoint ({CHECKPOINT_FORMAT})")
    checkpoint["config"] = {"task": REGRESSION, **checkpoint["config"]}
    return checkpoint


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
