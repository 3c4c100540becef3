"""The output rule (docs/RELIABILITY.md, python/fastload/files.py): every writer refuses a path
that is not a regular file, naming it and what it is, leaves that file as it was, writes through
a symbolic link (the link stays, its target is replaced), and gives the new file the umask's
mode or the mode of the file it replaces.

Each writer is tried against copies made here: a character device (a ``mknod`` copy of
/dev/null), a named pipe, a directory and a symbolic link to an existing output; against each
of those named like one of its temporary files, beside the file it writes (none blocks it, none
is removed or replaced); and against a name as long as a file name may be."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import types

import numpy as np
import pytest
import train_helpers
from train_helpers import FAST

from fastload import StoreWriter, _core, cli
from fastload.augment import Augment
from fastload.pack import pack
from fastload.preview import save_preview
from fastload.store import Store
from fastload.train import epoch_logger, fit

AS_ROOT = os.geteuid() == 0
store_path = train_helpers.store_path  # the 200-record store of tests/train_helpers.py, as a fixture here
ONE_STEP = dict(epochs=1, max_steps=1, **FAST)
IMG = np.zeros((2, 2, 3), np.uint8)

SPECIALS = ("character device", "named pipe", "directory")


def make_special(path, kind):
    """A character device (a copy of /dev/null's numbers), a FIFO or a folder at ``path``."""
    if kind == "character device":
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    elif kind == "named pipe":
        os.mkfifo(path)
    else:
        os.mkdir(path)


def identity(path):
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev


@pytest.fixture
def reader_of():
    """Opens the read end of a FIFO, so a writer that (wrongly) opens it does not block."""
    fds = []

    def open_reader(path):
        fds.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK))

    yield open_reader
    for fd in fds:
        os.close(fd)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    for name in ("cat", "dog"):
        (folder / name).mkdir()
        Image.new("RGB", (8, 8), (40, 80, 120)).save(folder / name / "0.png")
    return folder


@pytest.fixture(scope="module")
def estimator():
    sklearn = pytest.importorskip("sklearn")  # noqa: F841  (LatticeRegressor is scikit-learn style)
    from fastload.monotonic import LatticeRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (64, 2))
    return LatticeRegressor(features={"x0": "increasing", "x1": "decreasing"}, max_iter=2).fit(
        X, X[:, 0] - X[:, 1]
    )


def _cli(argv, capsys):
    try:
        status = cli.main([os.fspath(a) for a in argv])
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, err


class Env:
    """What the writers need, and a way to run each through the API or the command line."""

    def __init__(self, store, images, estimator, capsys):
        self.store, self.images, self.estimator, self.capsys = store, images, estimator, capsys

    def cli(self, *argv):
        status, err = _cli(argv, self.capsys)
        if status != 0:
            raise ValueError(err)


def _store_overwrite(env, path):
    with StoreWriter(path, (2, 2, 3), overwrite=True) as w:
        w.extend(np.stack([IMG] * 3), np.arange(3.0))


def _pack_overwrite(env, path):
    pack(env.images, path, size=4, overwrite=True, quiet=True)


def _checkpoint(env, path):
    fit(env.store, checkpoint=path, **ONE_STEP)


def _preview(env, path):
    save_preview(env.store, path, Augment.from_spec("flip"), records=2, epochs=2)


def _model(env, path):
    env.estimator.save(path)


def _plot(env, path):
    pytest.importorskip("matplotlib")
    from fastload.monotonic import plot_calibrators

    plot_calibrators(env.estimator, path)


def _json_log(env, path):
    epoch_logger(json_lines=True, json_log=path, stream=io.StringIO())({"epoch": 1})


def _bench_json(env, path):
    from fastload import bench

    bench.run(env.store, quick=True, only="memcpy", json_path=path, console=False)


def _cli_pack(env, path):
    env.cli("pack", env.images, path, "--size", "4", "--overwrite", "--quiet")


def _cli_checkpoint(env, path):
    env.cli("train", env.store, "--device", "cpu", "--threads", "1", "--epochs", "1", "--max-steps", "1",
            "--checkpoint", path)  # fmt: skip


def _cli_preview(env, path):
    env.cli("augment-preview", env.store, "-o", path, "--records", "2", "--epochs", "2")


def _cli_json_log(env, path):
    env.cli("train", env.store, "--device", "cpu", "--threads", "1", "--epochs", "1", "--json-log", path)


# (writer, how to call it, what it does to an existing file: "replace" or "append")
WRITERS = [
    ("StoreWriter(overwrite=True)", _store_overwrite, "replace"),
    ("pack(overwrite=True)", _pack_overwrite, "replace"),
    ("fit(checkpoint=)", _checkpoint, "replace"),
    ("save_preview", _preview, "replace"),
    ("LatticeRegressor.save", _model, "replace"),
    ("plot_calibrators", _plot, "replace"),
    ("epoch_logger(json_log=)", _json_log, "append"),
    ("bench.run(json_path=)", _bench_json, "replace"),
    ("fastload pack --overwrite", _cli_pack, "replace"),
    ("fastload train --checkpoint", _cli_checkpoint, "replace"),
    ("fastload augment-preview -o", _cli_preview, "replace"),
    ("fastload train --json-log", _cli_json_log, "append"),
]


@pytest.fixture
def env(store_path, images, estimator, capsys):
    return Env(store_path, images, estimator, capsys)


@pytest.mark.parametrize("kind", SPECIALS)
@pytest.mark.parametrize("write", [w[1] for w in WRITERS], ids=[w[0] for w in WRITERS])
def test_a_path_that_is_not_a_regular_file_is_refused_and_left_alone(env, tmp_path, reader_of, write, kind):
    path = tmp_path / "out"
    make_special(path, kind)
    if kind == "named pipe":
        reader_of(path)
    before = identity(path)
    with pytest.raises(ValueError) as refused:
        write(env, path)
    assert f"{path} is a {kind}, not a regular file" in str(refused.value)
    assert identity(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial left


@pytest.mark.parametrize("write,effect", [w[1:] for w in WRITERS], ids=[w[0] for w in WRITERS])
def test_a_symbolic_link_is_written_through_and_kept(env, tmp_path, write, effect):
    (tmp_path / "elsewhere").mkdir()
    real = tmp_path / "elsewhere" / "real"
    real.write_bytes(b"old\n")
    link = tmp_path / "out"
    link.symlink_to(real)
    write(env, link)
    assert link.is_symlink() and os.readlink(link) == os.fspath(real)
    data = real.read_bytes()
    if effect == "append":
        assert data.startswith(b"old\n") and len(data.splitlines()) >= 2
    else:
        assert data != b"old\n"
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["real"]  # no partial left


@pytest.mark.parametrize("write", [w[1] for w in WRITERS], ids=[w[0] for w in WRITERS])
def test_a_link_to_a_device_is_refused_and_the_device_left_alone(env, tmp_path, write):
    device = tmp_path / "null"
    make_special(device, "character device")
    (tmp_path / "out").symlink_to(device)
    with pytest.raises(ValueError, match="is a symbolic link to .*null, a character device, not a regular"):
        write(env, tmp_path / "out")
    assert stat.S_ISCHR(os.lstat(device).st_mode) and (tmp_path / "out").is_symlink()


#: Names of temporary files of ``out``: the current form (.NAME.PID.RANDOM), the Python writers'
#: former one (.NAME.RANDOM), and a name that is only like them.
PARTIAL_NAMES = (
    f".out.4242.0123456789abcdef{_core.PARTIAL_SUFFIX}",
    f".out.fedcba9876543210{_core.PARTIAL_SUFFIX}",
    f".out.deadbeef{_core.PARTIAL_SUFFIX}",
)
PARTIAL_KINDS = SPECIALS + ("symbolic link",)


def finishes(call, fifos=(), seconds=120):
    """Runs ``call()`` in a thread and fails the test if it has not returned in ``seconds``
    (then opening each FIFO's write end, which lets a reader blocked opening it go on)."""
    raised = []

    def run():
        try:
            call()
        except BaseException as exc:  # handed to the test's thread
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"still writing after {seconds} s: blocked")
    if raised:
        raise raised[0]


@pytest.mark.safety
@pytest.mark.parametrize("kind", PARTIAL_KINDS)
@pytest.mark.parametrize("write,effect", [w[1:] for w in WRITERS], ids=[w[0] for w in WRITERS])
def test_what_is_named_like_a_temporary_file_neither_blocks_a_writer_nor_is_removed(
    env, tmp_path, write, effect, kind
):
    path = tmp_path / "out"
    path.write_bytes(b"old\n")
    specials = [tmp_path / name for name in PARTIAL_NAMES]
    for special in specials:
        if kind == "symbolic link":
            special.symlink_to("out")
        else:
            make_special(special, kind)
    before = {special: identity(special) for special in specials}
    finishes(lambda: write(env, path), fifos=specials if kind == "named pipe" else ())
    assert {special: identity(special) for special in specials} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", *PARTIAL_NAMES])
    data = path.read_bytes()
    assert data.startswith(b"old\n") and len(data) > 4 if effect == "append" else data != b"old\n"


@pytest.mark.safety
def test_a_group_of_files_is_written_past_named_pipes_named_like_their_temporary_files(tmp_path):
    """write_together (a fit_many group's checkpoints) cleans up beside every file of the group."""
    from fastload.files import write_together

    paths = [tmp_path / "run0.ckpt", tmp_path / "run1.ckpt"]
    fifos = [tmp_path / f".{p.name}.0123456789abcdef{_core.PARTIAL_SUFFIX}" for p in paths]
    for fifo in fifos:
        os.mkfifo(fifo)
    for version in (b"one", b"two"):  # the first save, then one that moves the first aside
        files = [(os.fspath(p), lambda f, v=version: f.write(v)) for p in paths]
        finishes(lambda files=files: write_together(files, "checkpoint"), fifos)
        assert [p.read_bytes() for p in paths] == [version, version]
    assert all(stat.S_ISFIFO(os.lstat(fifo).st_mode) for fifo in fifos)
    assert len(list(tmp_path.iterdir())) == 4  # no partial, no .previous left


@pytest.mark.parametrize("write,effect", [w[1:] for w in WRITERS], ids=[w[0] for w in WRITERS])
def test_a_name_as_long_as_a_file_name_may_be_is_written(env, tmp_path, write, effect):
    """Its temporary file's name would be longer than a name may be: it is cut, and a hash of
    the whole name added, so a dead writer's is still found (rust/output.rs, ``temp_stem``)."""
    path = tmp_path / ("n" * 255)
    path.write_bytes(b"old\n")
    finishes(lambda: write(env, path))
    data = path.read_bytes()
    assert data.startswith(b"old\n") and len(data) > 4 if effect == "append" else data != b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no partial left


DIES_WRITING = "import os, sys; from fastload.files import PendingOutput; pending = PendingOutput(sys.argv[1]); os._exit(0)"


def test_a_dead_writers_temporary_file_of_a_long_name_is_removed_and_a_live_ones_kept(tmp_path):
    from fastload.files import PendingOutput, replace_atomically

    path = tmp_path / ("é" * 127)  # 254 bytes
    subprocess.run([sys.executable, "-c", DIES_WRITING, path], check=True, timeout=120)
    (dead,) = [p for p in tmp_path.iterdir() if p.name.endswith(_core.PARTIAL_SUFFIX)]
    live = PendingOutput(path, "preview")
    with replace_atomically(path, "preview") as f:
        f.write(b"new")
    assert path.read_bytes() == b"new" and not dead.exists()
    assert len(list(tmp_path.iterdir())) == 2  # the live writer's is kept
    live.discard()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_replaced_store_written_through_a_link_holds_the_new_records(tmp_path):
    real = tmp_path / "real.fastload"
    with StoreWriter(real, (2, 2, 3)) as w:
        w.append(IMG, 0.0)
    (tmp_path / "link.fastload").symlink_to(real)
    _store_overwrite(None, tmp_path / "link.fastload")
    with Store(real) as store:
        assert len(store) == 3


def test_outputs_get_the_umask_mode_or_keep_the_replaced_files_mode(store_path, tmp_path):
    old = os.umask(0o027)
    try:
        env = types.SimpleNamespace(store=store_path)
        fresh = tmp_path / "fresh.png"
        _preview(env, fresh)
        assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o640  # 0o666 & ~0o027; mkstemp gave 0o600
        kept = tmp_path / "kept.png"
        kept.write_bytes(b"")
        kept.chmod(0o604)
        _preview(env, kept)
        assert stat.S_IMODE(os.stat(kept).st_mode) == 0o604
        store = tmp_path / "kept.fastload"
        store.write_bytes(b"")
        store.chmod(0o604)
        _store_overwrite(None, store)
        assert stat.S_IMODE(os.stat(store).st_mode) == 0o604
    finally:
        os.umask(old)


def test_a_path_turned_into_a_pipe_while_written_is_not_replaced(tmp_path, reader_of):
    """Checked again just before the rename: in Python (PendingOutput) and in Rust (StoreWriter)."""
    from fastload.files import PendingOutput

    path = tmp_path / "out"
    path.write_bytes(b"old")
    pending = PendingOutput(path, "preview")
    pending.file.write(b"new")
    path.unlink()
    make_special(path, "named pipe")
    with pytest.raises(ValueError, match=f"preview {path} is a named pipe"):
        pending.commit()
    assert stat.S_ISFIFO(os.lstat(path).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    store = tmp_path / "s.fastload"
    store.write_bytes(b"old")
    writer = StoreWriter(store, (2, 2, 3), overwrite=True)
    writer.append(IMG, 1.0)
    store.unlink()
    make_special(store, "named pipe")
    with pytest.raises(ValueError, match=f"store {store} is a named pipe"):
        writer.commit()
    writer.discard()
    assert stat.S_ISFIFO(os.lstat(store).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "s.fastload"]


def test_a_link_retargeted_while_written_is_not_replaced(tmp_path):
    from fastload.files import replace_atomically

    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    link = tmp_path / "out"
    link.symlink_to("a")
    with (
        pytest.raises(ValueError, match="changed while it was written"),
        replace_atomically(link, "plot") as f,
    ):
        f.write(b"new")
        link.unlink()
        link.symlink_to("b")
    assert (tmp_path / "a").read_bytes() == b"a" and (tmp_path / "b").read_bytes() == b"b"


def _partial_of(folder) -> str:
    (partial,) = [p for p in os.listdir(folder) if p.endswith(".fastload-partial")]
    return os.path.join(folder, partial)


@pytest.mark.parametrize("overwrite", [True, False], ids=["replacing", "new"])
def test_a_temporary_file_replaced_by_a_link_while_written_is_not_installed(tmp_path, overwrite):
    """The rename (or link) would install whatever the temporary path names at commit: a
    symbolic link swapped in by another user of the folder became the output."""
    path, secret = tmp_path / "out", tmp_path / "secret"
    secret.write_bytes(b"someone else's")
    if overwrite:
        path.write_bytes(b"old")
    pending = _core.PendingFile(os.fspath(path), "checkpoint", overwrite)
    os.write(pending.fileno(), b"new")
    partial = _partial_of(tmp_path)
    os.unlink(partial)
    os.symlink(secret, partial)
    with pytest.raises(ValueError) as refused:
        pending.commit()
    assert str(refused.value) == (
        f"checkpoint {path}: its temporary file {partial} was replaced while it was written; nothing was replaced"
    )
    assert not os.path.islink(path) and (path.read_bytes() == b"old" if overwrite else not path.exists())
    assert secret.read_bytes() == b"someone else's"


def test_replacing_a_setuid_file_clears_setuid_and_setgid(tmp_path):
    from fastload.files import replace_atomically

    path = tmp_path / "tool"
    path.write_bytes(b"old")
    os.chmod(path, 0o6755)
    with replace_atomically(path, "output") as f:
        f.write(b"new")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755


def test_a_temporary_file_whose_folder_was_renamed_away_is_removed(tmp_path):
    from fastload.files import PendingOutput

    (tmp_path / "runs").mkdir()
    pending = PendingOutput(tmp_path / "runs" / "run.ckpt", "checkpoint")
    pending.file.write(b"new")
    os.rename(tmp_path / "runs", tmp_path / "moved")
    with pytest.raises(OSError) as failed:
        pending.commit()
    assert str(failed.value) == (
        f"cannot write the checkpoint {tmp_path / 'runs' / 'run.ckpt'}: its folder was moved or removed "
        "while it was written; nothing was replaced"
    )
    assert os.listdir(tmp_path / "moved") == []


def test_a_dangling_link_is_refused(tmp_path):
    from fastload.files import PendingOutput, append_text

    (tmp_path / "out").symlink_to("missing")
    with pytest.raises(ValueError, match="symbolic link to missing, which does not resolve"):
        PendingOutput(tmp_path / "out", "preview")
    with pytest.raises(ValueError, match="symbolic link to missing, which does not resolve"):
        append_text(tmp_path / "out", "x", "JSON log")
    assert not (tmp_path / "missing").exists()


# ---------------------------------------------------------------- failed writes name the file

FULL_LOG = textwrap.dedent(
    """
    import io, resource, signal, sys
    from fastload.train import epoch_logger
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    log = epoch_logger(json_lines=True, json_log=sys.argv[1], stream=io.StringIO())
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    log({"epoch": 1, "padding": "x" * 3000})
    log({"epoch": 2, "padding": "x" * 3000})
    """
)


def test_a_failed_json_log_write_names_the_file_and_leaves_whole_lines(tmp_path):
    log = tmp_path / "log.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", FULL_LOG, log], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert f"OSError: [Errno 27] cannot write the JSON log {log}: File too large" in result.stderr
    assert [json.loads(line)["epoch"] for line in log.read_text().splitlines()] == [1]


def test_a_failed_model_save_names_the_file_not_torch_internals(estimator, tmp_path, monkeypatch):
    import errno

    import torch

    real_save = torch.save

    def full_disk(obj, f):
        class Full(io.RawIOBase):
            def writable(self):
                return True

            def write(self, b):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        real_save(obj, Full())  # torch answers the OSError with a RuntimeError of its own

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match=f"cannot write the model file {tmp_path / 'm.pt'}: No space left"):
        estimator.save(tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []


def test_the_core_pending_file_commits_at_the_end_of_a_block_and_names_its_failures(tmp_path):
    """``_core.PendingFile``, the primitive under every Python writer: written through its
    descriptor, moved into place when the block ends (or never, on an exception), its OS
    failures OSErrors with their errno naming the file and what it is for."""
    path = tmp_path / "out"
    with _core.PendingFile(path, "preview") as pending:
        os.write(pending.fileno(), b"new")
        assert not path.exists()
    assert path.read_bytes() == b"new" and pending.target == os.fspath(path)
    with pytest.raises(ValueError, match="the preview is already committed or discarded"):
        pending.fileno()
    with pytest.raises(KeyError), _core.PendingFile(path, "preview") as pending:
        os.write(pending.fileno(), b"lost")
        raise KeyError
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["out"]
    missing = tmp_path / "no" / "out"
    with pytest.raises(OSError) as failed:
        _core.PendingFile(missing, "checkpoint")
    assert failed.value.errno == errno.ENOENT
    assert str(failed.value) == (
        f"[Errno 2] cannot create a file beside the checkpoint {missing}: No such file or directory"
    )
    with pytest.raises(OSError) as failed:
        _core.append_output(tmp_path / "out" / "log", b"x", "JSON log")
    assert failed.value.errno == errno.ENOTDIR and "cannot write the JSON log" in str(failed.value)
    assert _core.file_kind(os.lstat(tmp_path).st_mode) == "a directory"
