"""The rules for the files fastload writes and the small files it reads, in one place.

The output rule (every writer: checkpoints, previews, plots, model files, JSON logs, bench
results) is the Rust core's, ``rust/output.rs``, the one the store writer follows; this module
gives it to the Python writers (docs/RELIABILITY.md, "The output rule"):

- an existing path that is not a regular file (a directory, a character or block device, a
  named pipe, a socket) is refused with a ValueError naming the path and what it is: fastload
  never replaces ``/dev/null`` or a FIFO with a file of its own, nor blocks on one, nor on
  anything named like one of its temporary files;
- a symbolic link is written through: the file it leads to is replaced, the link stays; a
  link that leads nowhere is refused;
- a file is replaced atomically (:class:`PendingOutput` over ``_core.PendingFile``: a locked
  temporary file beside it, fsync, rename after checking the path again), and the new file
  gets the mode of the one it replaces, or ``0o666`` less the umask like any new file;
- a failed write names the file: ``cannot write the checkpoint P: No space left on device``;
- a group of files that must agree (the checkpoints of a ``fit_many`` group) changes together
  (:func:`write_together`): every new file is written before any is renamed, and the previous
  files stay beside them as ``NAME.previous`` until all are in place (docs/RELIABILITY.md,
  "Group checkpoints").

Inputs (a labels CSV, a runs file, a checkpoint resumed, monotone inputs) must be regular files
under a size limit (:func:`open_regular_file`, :func:`read_regular_file` to read one whole), so
``/dev/zero`` or a FIFO is refused rather than read forever or waited on.

Imports nothing of the package but ``_core``, so any module may use it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import BinaryIO, Callable, Iterator, List, Optional, Sequence, Tuple, Union

from fastload import _core

PathLike = Union[str, "os.PathLike[str]"]
Writer = Callable[[BinaryIO], None]  # writes a file's whole content into the open file

#: Suffix of a group's previous file, kept while a new set of files moves in.
PREVIOUS_SUFFIX = ".previous"


def output_target(path: PathLike, what: str = "output") -> str:
    """Where a write to ``path`` lands, by the output rule: ``path`` itself when nothing or a
    regular file is there; the file a symbolic link there leads to (so the link stays); a
    ValueError naming ``path`` (``what`` says what it is for: "checkpoint") and what stands
    there for anything else, and for a link that leads nowhere."""
    return _core.output_target(os.fspath(path), what)


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


class PendingOutput:
    """A new version of the output file ``path``, written through ``file`` into the locked
    temporary file of a ``_core.PendingFile`` (the output rule: made beside the file it will
    replace, the link's target for a symbolic link, checked when made and again just before
    :meth:`commit` renames it into place). Until then the old file is untouched;
    :meth:`discard` (or an exception in a ``with`` block) removes the temporary file. Errors
    name ``path`` as the ``what`` ("preview")."""

    def __init__(self, path: PathLike, what: str = "output"):
        self.path = os.fspath(path)
        self.what = what
        self.pending = _core.PendingFile(self.path, what, True)
        self.target: str = self.pending.target
        # A descriptor of its own (sharing the file's lock), so that this file, however late
        # it is closed, never writes to a number the PendingFile has closed.
        self.file: BinaryIO = os.fdopen(os.dup(self.pending.fileno()), "wb")
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
            self.file.close()  # flushes what is buffered
        except OSError as exc:
            self.discard()
            raise _named(exc, self.what, self.path) from None
        try:
            self.pending.commit()  # its errors name the path already
        finally:
            self.discard()
        self.committed = True

    def discard(self) -> None:
        """Removes the temporary file; the file at ``path`` stays as it was."""
        with contextlib.suppress(OSError):
            self.file.close()
        self.pending.discard()

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
    _core.PendingFile(os.fspath(path), what, True).discard()


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
    _core.append_output(os.fspath(path), text.encode("utf-8"), what)


def _over(limit: int, what: str) -> str:
    return f"over the {limit / 2**20:g} MiB limit for a {what}"


def open_regular_file(path: PathLike, limit: int, what: str) -> BinaryIO:
    """The input ``path`` (``what`` names it: "checkpoint") opened for reading, if it is a
    regular file of at most ``limit`` bytes, checked on the opened file: a named pipe is opened
    without waiting and refused, never read (``torch.load`` or ``np.load`` given the path
    would block on it forever). ValueError naming the path otherwise; a missing file is
    FileNotFoundError (and any other failure to open it its OSError) naming the ``what`` and
    the path. For readers that take a file; :func:`read_regular_file` reads it whole."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:  # named, without Python's "[Errno 2] ...: 'path'"
        raise type(exc)(f"{what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(
                f"{path}: not a regular file ({_core.file_kind(st.st_mode)}); the {what} must be a file"
            )
        if st.st_size > limit:
            raise ValueError(f"{path}: {st.st_size / 2**20:,.0f} MiB, {_over(limit, what)}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: PathLike, limit: int, what: str) -> bytes:
    """The bytes of the input ``path`` (``what`` names it: "labels CSV"), read only if it is a
    regular file of at most ``limit`` bytes (:func:`open_regular_file`), checked again while
    reading, so a file growing meanwhile stops at the limit. ValueError naming the path
    otherwise; a missing file is FileNotFoundError."""
    with open_regular_file(path, limit, what) as f:
        size = os.fstat(f.fileno()).st_size
        # Read the size it has (a read of the whole limit would allocate it for any file);
        # one that grew since fstat is read on, up to the limit.
        data = f.read(size + 1)
        if len(data) > size:
            data += f.read(limit + 1 - len(data))
    if len(data) > limit:
        raise ValueError(f"{os.fspath(path)}: grew while read, {_over(limit, what)}")
    return data
