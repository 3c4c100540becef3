"""Files that fastload writes from Python (training checkpoints, estimator model files), written
whole or not at all: into a locked temporary file beside the destination, fsynced, then renamed
over it, so a crash leaves the previous file or the new one, never half of one. A group of files
that must agree (the checkpoints of a ``fit_many`` group) changes together: every new file is
written before any is renamed, and the previous files stay beside them as ``NAME.previous``
until all are in place (docs/RELIABILITY.md, "Group checkpoints")."""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import BinaryIO, Callable, List, Optional, Sequence, Tuple

PARTIAL_SUFFIX = ".fastload-partial"  # as the store writer's temporary files
PREVIOUS_SUFFIX = ".previous"  # a file of a group's last complete set, kept while a new set moves in

Writer = Callable[[BinaryIO], None]  # writes a file's whole content into the open file


def previous_path(path: str) -> str:
    """Where a group's previous file for ``path`` waits while a new set is renamed into place."""
    return path + PREVIOUS_SUFFIX


def _partial_prefix(path: str) -> Tuple[str, str]:
    directory, name = os.path.split(os.path.abspath(path))
    return directory, f".{name}."


def remove_stale_partials(path: str) -> None:
    """Removes the temporary files left beside ``path`` by processes that died while writing it:
    those whose lock nobody holds (a live write holds the lock until its file is renamed)."""
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
            pass  # held by a live write, or already gone
        finally:
            os.close(fd)


def _write_error(exc: BaseException) -> Optional[OSError]:
    """The OSError behind ``exc``: itself, or one it was raised from or while handling (torch.save
    answers a failed write with a RuntimeError raised while handling the OSError)."""
    while exc is not None:
        if isinstance(exc, OSError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class Partial:
    """A new temporary file ``.NAME.<random>.fastload-partial`` beside ``path``, created with
    O_EXCL and locked (flock) until it is renamed over ``path`` (:meth:`commit`) or removed
    (:meth:`discard`). Errors are OSErrors naming ``path`` as the ``what`` ("checkpoint")."""

    def __init__(self, path: str, what: str):
        self.path, self.what, self.committed = path, what, False
        remove_stale_partials(path)
        directory, prefix = _partial_prefix(path)
        while True:
            name = os.path.join(directory, f"{prefix}{os.urandom(8).hex()}{PARTIAL_SUFFIX}")
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            except OSError as exc:
                raise OSError(
                    exc.errno, f"cannot create a file beside the {what} {path}: {exc.strerror}"
                ) from None
            fcntl.flock(fd, fcntl.LOCK_EX)
            # Another process's cleanup may have removed it between creation and lock: start again.
            with contextlib.suppress(OSError):
                if os.stat(name).st_ino == os.fstat(fd).st_ino:
                    break
            os.close(fd)
        self.name, self.file = name, os.fdopen(fd, "wb")  # closing it releases the lock

    def error(self, exc: OSError) -> OSError:
        """``exc`` as "cannot write the checkpoint PATH: No space left on device"."""
        return OSError(exc.errno, f"cannot write the {self.what} {self.path}: {exc.strerror or exc}")

    def write(self, writer: Writer) -> None:
        """Writes the file's content with ``writer`` and makes it durable (fsync)."""
        try:
            writer(self.file)
            self.file.flush()
            os.fsync(self.file.fileno())
        except Exception as exc:
            failed = _write_error(exc)
            if failed is None:
                raise
            raise self.error(failed) from None

    def commit(self) -> None:
        """Renames the written file over ``path``."""
        try:
            os.replace(self.name, self.path)
        except OSError as exc:
            raise self.error(exc) from None
        self.committed = True
        self.file.close()

    def discard(self) -> None:
        """Removes the file unless it was committed, and lets its lock go."""
        if not self.committed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.name)
        with contextlib.suppress(OSError):  # a full disk can fail the flush of what is discarded
            self.file.close()


def check_writable(path: str, what: str) -> None:
    """Fails now (OSError naming ``path``) when no file can be created beside ``path``, and
    removes the temporary files that dead writers left there."""
    Partial(path, what).discard()


def _sync_folders(paths: Sequence[str]) -> None:
    """fsync of the folders of ``paths``, so the renames in them survive a power loss."""
    for folder in {os.path.dirname(os.path.abspath(path)) for path in paths}:
        with contextlib.suppress(OSError):
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def write_atomically(path: str, writer: Writer, what: str) -> None:
    """Writes ``path`` with ``writer`` into a temporary file beside it, fsync, then renames it
    over ``path``: a crash or an error (a full disk: OSError "cannot write the WHAT PATH: ...")
    leaves the previous file intact and no temporary file behind (a process killed while
    writing leaves its temporary file, which the next write to ``path`` removes)."""
    write_together([(path, writer)], what)


def write_together(files: Sequence[Tuple[str, Writer]], what: str) -> None:
    """Writes several files as one change: every new file is written (into its temporary file)
    before any is renamed, so an error (a full disk) leaves all the previous files and removes
    every temporary one. Then each previous file becomes ``NAME.previous``, each new one takes
    its place, and the ``.previous`` files are removed: a process killed among the renames
    leaves, for every file, the previous version as ``NAME`` or ``NAME.previous`` (the reader
    picks the set that agrees: :func:`fastload.train.checkpoint.load_group`). One file is
    simply renamed over its destination."""
    partials: List[Partial] = []
    try:
        for path, writer in files:
            partials.append(Partial(path, what))
            partials[-1].write(writer)
        if len(partials) == 1:
            partials[0].commit()
        else:
            _commit_keeping_previous(partials)
    finally:
        for partial in partials:
            partial.discard()
    _sync_folders([path for path, _ in files])
    if len(partials) > 1:
        for partial in partials:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(previous_path(partial.path))


def _commit_keeping_previous(partials: Sequence[Partial]) -> None:
    """Moves each destination aside to its ``.previous`` name, then renames each partial into
    place; on an error, puts the previous files back and removes the new files that had none
    (as far as the disk lets it), and raises."""
    moved: List[Partial] = []
    try:
        for partial in partials:
            try:
                os.replace(partial.path, previous_path(partial.path))
            except FileNotFoundError:
                continue  # no previous file: the group's first save
            except OSError as exc:
                raise partial.error(exc) from None
            moved.append(partial)
        for partial in partials:
            partial.commit()
    except BaseException:
        for partial in partials:
            with contextlib.suppress(OSError):
                if partial in moved:
                    os.replace(previous_path(partial.path), partial.path)
                elif partial.committed:
                    os.unlink(partial.path)
        raise
