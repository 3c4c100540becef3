"""Training checkpoints: written atomically (a locked temporary file beside the checkpoint, fsync,
``os.replace``), read back, and tied to the stores they were trained on by a fingerprint; the
random generators' states they carry so a resumed run draws what the stopped run would have."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import random
import struct
from typing import Tuple

import numpy as np
import torch

from fastload.files import output_target, rename_into_place
from fastload.store import PathLike, Store, _fspath
from fastload.train.task import REGRESSION

CHECKPOINT_FORMAT = "fastload-train-checkpoint-1"
PARTIAL_SUFFIX = ".fastload-partial"  # as the store writer's temporary files
HEADER_SIZE = 4096  # docs/FORMAT.md: the header page, ending with its own checksum
CHECKSUM_SECTION_FIELD = 80  # docs/FORMAT.md: offset and length (u64 each) of the record checksums


def _partial_prefix(path: str) -> Tuple[str, str]:
    directory, name = os.path.split(os.path.abspath(path))
    return directory, f".{name}."


def _remove_stale_partials(path: str) -> None:
    """Removes the temporary files left beside ``path`` by runs that died while saving: those
    whose lock nobody holds (a live save holds the lock on its own until it is renamed)."""
    directory, prefix = _partial_prefix(path)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(PARTIAL_SUFFIX)):
            continue
        partial = os.path.join(directory, name)
        try:
            fd = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(partial)
        except OSError:
            pass  # held by a live save, or already gone
        finally:
            os.close(fd)


def _open_partial(path: str) -> Tuple[int, str]:
    """A new temporary file ``.NAME.<random>.fastload-partial`` beside ``path``, created with
    O_EXCL and locked (flock) for as long as the descriptor is open. Errors name ``path``."""
    directory, prefix = _partial_prefix(path)
    while True:
        partial = os.path.join(directory, f"{prefix}{os.urandom(8).hex()}{PARTIAL_SUFFIX}")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot create a file beside the checkpoint {path}: {exc.strerror}"
            ) from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Another run's cleanup may have removed it between creation and lock: start again.
        with contextlib.suppress(OSError):
            if os.stat(partial).st_ino == os.fstat(fd).st_ino:
                return fd, partial
        os.close(fd)


def check_checkpoint_path(path: str) -> None:
    """Before the first epoch: the checkpoint's folder exists and takes a new file, and the
    path passes the output rule (fastload.files)."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ValueError(f"checkpoint {path}: its directory does not exist")
    target = output_target(path, "checkpoint")
    _remove_stale_partials(target)
    fd, partial = _open_partial(target)
    os.unlink(partial)
    os.close(fd)


def save_atomically(obj: dict, path: str) -> None:
    """torch.save into a locked temporary file beside ``path``, fsync, then rename over it: a
    crash leaves either the previous checkpoint or the new one, never half of one, and the
    next save removes the temporary file of a run killed while saving. By the output rule
    (fastload.files), a symbolic link is written through and a device or FIFO is refused."""
    target = output_target(path, "checkpoint")
    _remove_stale_partials(target)
    fd, partial = _open_partial(target)
    try:
        with os.fdopen(fd, "wb") as f:  # closing it releases the lock, after the rename
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
            rename_into_place(partial, target, path, "checkpoint")
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"cannot write the checkpoint {path}: {exc.strerror or exc}") from None
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a power loss
        directory = os.open(os.path.dirname(os.path.abspath(target)), os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


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
