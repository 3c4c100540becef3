"""The rules for the files fastload writes and the small files it reads, in one place.

The output rule (every writer: checkpoints, previews, plots, model files, JSON logs, bench
results; stores follow the same rule in Rust, ``rust/writer.rs``):

- an existing path that is not a regular file (a directory, a character or block device, a
  named pipe, a socket) is refused with a ValueError naming the path and what it is: fastload
  never replaces ``/dev/null`` or a FIFO with a file of its own, nor blocks on one;
- a symbolic link is written through: the file it leads to is replaced, the link stays; a
  link that leads nowhere is refused;
- a file is replaced atomically (:class:`PendingOutput`: a locked temporary file beside it,
  fsync, rename), and the new file gets the mode of the one it replaces, or ``0o666`` less
  the umask like any new file;
- a failed write names the file: ``cannot write the checkpoint P: No space left on device``;
- a group of files that must agree (the checkpoints of a ``fit_many`` group) changes together
  (:func:`write_together`): every new file is written before any is renamed, and the previous
  files stay beside them as ``NAME.previous`` until all are in place (docs/RELIABILITY.md,
  "Group checkpoints").

Inputs read whole (a labels CSV, a runs file) must be regular files under a size limit
(:func:`read_regular_file`), so ``/dev/zero`` or a FIFO is refused rather than read forever.

Imports nothing of the package, so any module may use it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from typing import BinaryIO, Callable, Iterator, List, Optional, Sequence, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]
Writer = Callable[[BinaryIO], None]  # writes a file's whole content into the open file

#: Suffix of the temporary files writers leave only when killed (the store writer's too).
PARTIAL_SUFFIX = ".fastload-partial"
#: Suffix of a group's previous file, kept while a new set of files moves in.
PREVIOUS_SUFFIX = ".previous"

KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a character device")."""
    for test, kind in KINDS:
        if test(mode):
            return kind
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def _refusal(what: str, path: str, kind: str) -> ValueError:
    return ValueError(
        f"{what} {path} is {kind}, not a regular file: fastload only replaces regular files; "
        "choose another path"
    )


def output_target(path: PathLike, what: str = "output") -> str:
    """Where a write to ``path`` lands, by the output rule: ``path`` itself when nothing or a
    regular file is there; the file a symbolic link there leads to (so the link stays); a
    ValueError naming ``path`` (``what`` says what it is for: "checkpoint") and what stands
    there for anything else, and for a link that leads nowhere."""
    path = os.fspath(path)
    try:
        here = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write the {what} {path}: {exc.strerror}") from None
    if not stat.S_ISLNK(here.st_mode):
        if not stat.S_ISREG(here.st_mode):
            raise _refusal(what, path, file_kind(here.st_mode))
        return path
    target = os.path.realpath(path)
    try:
        there = os.stat(target)
    except OSError as exc:
        raise ValueError(
            f"{what} {path} is a symbolic link to {os.readlink(path)}, which does not resolve "
            f"({exc.strerror}); remove the link or write to a real path"
        ) from None
    if not stat.S_ISREG(there.st_mode):
        raise _refusal(what, path, f"a symbolic link to {target}, {file_kind(there.st_mode)}")
    return target


def _os_error_of(exc: BaseException) -> Optional[OSError]:
    """The OSError behind ``exc``: itself, or one it was raised while handling (torch.save
    answers a failed write with a RuntimeError of its own)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ if exc.__cause__ is not None or exc.__suppress_context__ else exc.__context__
    return None


def _named(error: OSError, what: str, path: str) -> OSError:
    return OSError(error.errno, f"cannot write the {what} {path}: {error.strerror or error}")


def _partial_prefix(target: str) -> Tuple[str, str]:
    directory, name = os.path.split(os.path.abspath(target))
    return directory, f".{name}."


def remove_stale_partials(target: str) -> None:
    """Removes the temporary files left beside ``target`` by writers that died while writing
    it: those whose lock nobody holds (a live writer holds its lock until it renames)."""
    directory, prefix = _partial_prefix(target)
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
            pass  # held by a live writer, or already gone
        finally:
            os.close(fd)


def _open_partial(target: str, what: str, path: str) -> Tuple[int, str]:
    """A new temporary file ``.NAME.<random>.fastload-partial`` beside ``target``, created with
    O_EXCL and mode 0o666 less the umask, and locked (flock) while the descriptor is open."""
    directory, prefix = _partial_prefix(target)
    while True:
        partial = os.path.join(directory, f"{prefix}{os.urandom(8).hex()}{PARTIAL_SUFFIX}")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot create a file beside the {what} {path}: {exc.strerror}"
            ) from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Another writer's cleanup may have removed it between creation and lock: start again.
        with contextlib.suppress(OSError):
            if os.stat(partial).st_ino == os.fstat(fd).st_ino:
                return fd, partial
        os.close(fd)


def _fsync_directory(path: str) -> None:
    with contextlib.suppress(OSError):  # the rename itself survives a power loss
        directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def rename_into_place(partial: str, target: str, path: PathLike, what: str = "output") -> None:
    """Renames the finished temporary file ``partial`` over ``target`` (what
    :func:`output_target` gave for ``path``), giving it the replaced file's mode, after checking
    ``path`` again: it must still pass the output rule and lead to ``target`` (ValueError
    otherwise, nothing replaced), so a FIFO or a link put there meanwhile is never replaced."""
    if output_target(path, what) != target:
        raise ValueError(
            f"{what} {os.fspath(path)} changed while it was written (it no longer leads to {target}); "
            "nothing was replaced"
        )
    with contextlib.suppress(FileNotFoundError):
        os.chmod(partial, stat.S_IMODE(os.stat(target).st_mode))
    os.replace(partial, target)


class PendingOutput:
    """A new version of the output file ``path``, written through ``file`` into a locked
    temporary file beside the file it will replace (the link's target for a symbolic link),
    checked by the output rule when made and again just before :meth:`commit` renames it into
    place. Until then the old file is untouched; :meth:`discard` (or an exception in a ``with``
    block) removes the temporary file. Errors name ``path`` as the ``what`` ("preview")."""

    def __init__(self, path: PathLike, what: str = "output"):
        self.path = os.fspath(path)
        self.what = what
        self.target = output_target(self.path, what)
        remove_stale_partials(self.target)
        fd, self.partial = _open_partial(self.target, what, self.path)
        self.file: BinaryIO = os.fdopen(fd, "wb")
        self.committed = False

    def write(self, writer: Writer) -> None:
        """Writes the whole new file with ``writer`` and makes it durable (fsync); a failed
        write raises OSError naming ``path``."""
        try:
            writer(self.file)
            self.file.flush()
            os.fsync(self.file.fileno())
        except Exception as exc:
            error = _os_error_of(exc)
            if error is None:
                raise
            raise _named(error, self.what, self.path) from None

    def commit(self) -> None:
        """fsync, then rename over the file at ``path`` (keeping its mode), unless the path no
        longer passes the output rule or now leads elsewhere (ValueError, nothing replaced)."""
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            rename_into_place(self.partial, self.target, self.path, self.what)
        except BaseException as exc:
            self.discard()
            error = _os_error_of(exc)
            if error is None:
                raise
            raise _named(error, self.what, self.path) from None
        self.partial, self.committed = None, True
        self.file.close()  # releases the lock, now that the file is in place
        _fsync_directory(self.target)

    def discard(self) -> None:
        """Removes the temporary file; the file at ``path`` stays as it was."""
        if self.partial is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.partial)
            self.partial = None
        with contextlib.suppress(OSError):
            self.file.close()

    def __enter__(self) -> BinaryIO:
        return self.file

    def __exit__(self, kind, exc, traceback) -> None:
        if exc is None:
            self.commit()
            return
        self.discard()
        error = _os_error_of(exc)
        if error is not None:
            raise _named(error, self.what, self.path) from None


@contextlib.contextmanager
def replace_atomically(path: PathLike, what: str = "output") -> Iterator[BinaryIO]:
    """``with replace_atomically(path, "preview") as f: f.write(...)``: the output rule's
    atomic replace of ``path`` (:class:`PendingOutput`), committed when the block ends."""
    with PendingOutput(path, what) as f:
        yield f


def check_writable(path: PathLike, what: str = "output") -> None:
    """Fails now, by the output rule or with an OSError naming ``path``, when ``path`` could not
    be written; removes the temporary files that dead writers left beside it."""
    PendingOutput(path, what).discard()


def previous_path(path: str) -> str:
    """Where a group's previous file for ``path`` waits while a new set is renamed into place."""
    return path + PREVIOUS_SUFFIX


def write_together(files: Sequence[Tuple[str, Writer]], what: str) -> None:
    """Writes several files as one change: every new file is written (into its temporary file)
    before any is renamed, so an error (a full disk) leaves all the previous files and removes
    every temporary one. Then each previous file becomes ``NAME.previous``, each new one takes
    its place, and the ``.previous`` files are removed: a process killed among the renames
    leaves, for every file, the previous version as ``NAME`` or ``NAME.previous`` (the reader
    picks the set that agrees: :func:`fastload.train.checkpoint.load_group`). One file is
    simply renamed over its destination."""
    pending: List[PendingOutput] = []
    try:
        for path, writer in files:
            pending.append(PendingOutput(path, what))
            pending[-1].write(writer)
        if len(pending) == 1:
            pending[0].commit()
        else:
            _commit_keeping_previous(pending)
    finally:
        for output in pending:
            output.discard()
    if len(pending) > 1:
        for output in pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(previous_path(output.target))


def _commit_keeping_previous(pending: Sequence[PendingOutput]) -> None:
    """Moves each destination aside to its ``.previous`` name, then renames each new file into
    place; on an error, puts the previous files back and removes the new files that had none
    (as far as the disk lets it), and raises."""
    moved: List[PendingOutput] = []
    try:
        for output in pending:
            try:
                os.replace(output.target, previous_path(output.target))
            except FileNotFoundError:
                continue  # no previous file: the group's first save
            except OSError as exc:
                raise _named(exc, output.what, output.path) from None
            moved.append(output)
        for output in pending:
            output.commit()
    except BaseException:
        for output in pending:
            with contextlib.suppress(OSError):
                if output in moved:
                    os.replace(previous_path(output.target), output.target)
                elif output.committed:
                    os.unlink(output.target)
        raise


def append_text(path: PathLike, text: str, what: str = "log") -> None:
    """Appends ``text`` to ``path`` (created, mode 0o666 less the umask, if missing), by the
    output rule: anything but a regular file, or a link to one, is refused (ValueError), a
    named pipe without waiting for a reader. A failed write raises OSError naming ``path``
    and leaves the file as it was (what was written of ``text`` is cut off again)."""
    path = os.fspath(path)
    target = output_target(path, what)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(target, flags, 0o666)
    except OSError as exc:
        raise _named(exc, what, path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced since output_target looked
            raise _refusal(what, path, file_kind(st.st_mode))
        data, start = text.encode("utf-8"), st.st_size
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise _named(exc, what, path) from None
    finally:
        os.close(fd)


def read_regular_file(path: PathLike, limit: int, what: str) -> bytes:
    """The bytes of the input ``path`` (``what`` names it: "labels CSV"), read only if it is a
    regular file of at most ``limit`` bytes: checked on the opened file (a named pipe is
    opened without waiting) and while reading, so a file growing meanwhile stops at the limit.
    ValueError naming the path otherwise; a missing file is FileNotFoundError."""
    path = os.fspath(path)
    over = f"over the {limit / 2**20:g} MiB limit for a {what}"
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(
                f"{path}: not a regular file ({file_kind(st.st_mode)}); the {what} must be a file"
            )
        if st.st_size > limit:
            raise ValueError(f"{path}: {st.st_size / 2**20:,.0f} MiB, {over}")
        with os.fdopen(os.dup(fd), "rb") as f:
            # Read the size it has (a read of the whole limit would allocate it for any file);
            # one that grew since fstat is read on, up to the limit.
            data = f.read(st.st_size + 1)
            if len(data) > st.st_size:
                data += f.read(limit + 1 - len(data))
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path}: grew while read, {over}")
    return data
