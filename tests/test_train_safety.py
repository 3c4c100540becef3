"""`fastload train` and `fit` never overwrite their inputs, refuse unbounded options before
reading data, report a full disk or an unwritable folder by the checkpoint's name, clean up
after killed runs, and refuse to resume on other records."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import test_train
import torch
from test_train import FAST, SIDE, _images_and_labels

import fastload.train as train_mod
import fastload.train.config as train_config
from fastload import cli
from fastload import inspect as inspect_mod
from fastload.inspect import machine_memory
from fastload.store import Store, StoreWriter
from fastload.train import fit

store_path = test_train.store_path  # the 200-record store of tests/test_train.py, as a fixture here
ONE_STEP = dict(epochs=1, max_steps=1, **FAST)
# A folder that takes no new file, even for root: sysfs refuses it (EACCES, or EROFS read-only).
UNWRITABLE_DIR = "/sys"


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _cli(argv, capsys):
    """(exit status, stderr, stdout) of `fastload` with ``argv``, usage errors (SystemExit) included."""
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, err, out


def _train_argv(store, *extra):
    return ["train", os.fspath(store), "--device", "cpu", "--threads", "1", "--batch-size", "16", *extra]


# ---------------------------------------------------------------- outputs that are inputs


def _spellings(store, tmp_path):
    """The store under other names: a relative detour, a symlink, a hard link, a linked folder."""
    (tmp_path / "sub").mkdir()
    os.symlink(store, tmp_path / "link.fastload")
    os.link(store, tmp_path / "hard.fastload")
    os.symlink(os.path.dirname(store), tmp_path / "folder")
    return {
        "same path": os.fspath(store),
        "detour": os.path.join(tmp_path, "sub", os.path.relpath(store, tmp_path / "sub")),
        "symlink": os.fspath(tmp_path / "link.fastload"),
        "hard link": os.fspath(tmp_path / "hard.fastload"),
        "linked folder": os.fspath(tmp_path / "folder" / os.path.basename(store)),
    }


@pytest.fixture
def own_store(tmp_path):
    """A store this test may lose if a protection fails (not the module's shared one)."""
    path = tmp_path / "own.fastload"
    images, labels = _images_and_labels()
    with StoreWriter(path, (SIDE, SIDE, 3)) as writer:
        writer.extend(images[:40], labels[:40])
    return path


@pytest.mark.parametrize("spelling", ["same path", "detour", "symlink", "hard link", "linked folder"])
def test_checkpoint_that_is_the_store_is_refused(spelling, own_store, tmp_path):
    before = _digest(own_store)
    checkpoint = _spellings(own_store, tmp_path)[spelling]
    with pytest.raises(
        ValueError, match=r"checkpoint .* is the store .*own\.fastload: training would overwrite it"
    ):
        fit(own_store, checkpoint=checkpoint, **ONE_STEP)
    assert _digest(own_store) == before


def test_checkpoint_that_is_the_validation_store_or_an_inputs_file_is_refused(own_store, tmp_path):
    val = tmp_path / "val.fastload"
    shutil.copy(own_store, val)
    with pytest.raises(ValueError, match="is the validation store"):
        fit(own_store, val=val, checkpoint=val, **ONE_STEP)
    inputs = tmp_path / "exposure.npy"
    np.save(inputs, np.zeros(40))
    with pytest.raises(ValueError, match="is the monotone inputs"):
        fit(own_store, monotone_inputs=inputs, checkpoint=inputs, **ONE_STEP)
    assert np.load(inputs).shape == (40,)


@pytest.mark.parametrize("clash", ["store", "--checkpoint", "--resume", "--monotone-inputs"])
def test_cli_json_log_that_is_an_input_or_the_checkpoint_is_refused(clash, own_store, tmp_path, capsys):
    ckpt, inputs = tmp_path / "run.ckpt", tmp_path / "m.npy"
    np.save(inputs, np.zeros(40))
    assert cli.main(_train_argv(own_store, "--max-steps", "1", "--checkpoint", os.fspath(ckpt))) == 0
    before = {p: _digest(p) for p in (own_store, ckpt, inputs)}
    target = {"store": own_store, "--checkpoint": ckpt, "--resume": ckpt, "--monotone-inputs": inputs}[clash]
    argv = _train_argv(own_store, "--json-log", os.fspath(target), "--max-steps", "2")
    argv += {
        "store": [],
        "--checkpoint": ["--checkpoint", os.fspath(ckpt)],
        "--resume": ["--resume", os.fspath(ckpt)],
        "--monotone-inputs": ["--monotone-inputs", os.fspath(inputs)],
    }[clash]
    status, err, out = _cli(argv, capsys)
    named = {"store": "the store", "--checkpoint": "the --checkpoint", "--resume": "the --resume checkpoint"}
    assert (
        status == 1 and "--json-log" in err and f"is {named.get(clash, 'the --monotone-inputs file')}" in err
    )
    assert {p: _digest(p) for p in before} == before


def test_cli_json_log_that_is_a_checkpoint_not_written_yet_is_refused(own_store, tmp_path, capsys):
    same = os.fspath(tmp_path / "out")
    status, err, out = _cli(_train_argv(own_store, "--checkpoint", same, "--json-log", same), capsys)
    assert status == 1 and "--json-log" in err and "is the --checkpoint" in err
    assert not os.path.exists(same)


def test_resuming_into_the_same_checkpoint_is_allowed(store_path, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=ckpt, **ONE_STEP)
    resumed = fit(store_path, resume=ckpt, checkpoint=ckpt, **{**ONE_STEP, "max_steps": 2})
    assert resumed.steps == 2 and torch.load(ckpt, weights_only=True)["step"] == 2


# ---------------------------------------------------------------- option bounds

CORES = len(os.sched_getaffinity(0))
BAD_OPTIONS = [
    ({"threads": 100000}, rf"threads must be between 1 and {min(4 * CORES, 256)} \(4 per core"),
    ({"threads": 0}, "threads must be between 1 and"),
    ({"workers": 500}, rf"workers must be between 0 and {min(4 * CORES, 64)} \(4 per core.*not 500"),
    ({"workers": -1}, "workers must be between 0 and"),
    ({"size": 100000}, "size must be between 8 and 4096"),
    ({"size": 4}, "size must be between 8 and 4096"),
    ({"lr": float("inf")}, "lr must be above 0 and at most 10, not inf"),
    ({"lr": float("nan")}, "lr must be above 0 and at most 10, not nan"),
    ({"lr": 0.0}, "lr must be above 0"),
    ({"lr": -1e-3}, "lr must be above 0"),
    ({"lr": 1e30}, "lr must be above 0 and at most 10"),
    ({"weight_decay": float("inf")}, "weight_decay must be a finite number"),
    ({"weight_decay": -1.0}, "weight_decay must be a finite number, at least 0"),
    ({"epochs": 0}, "epochs must be at least 1"),
    ({"epochs": 2.5}, "epochs must be an integer"),
    ({"epochs": True}, "epochs must be an integer"),
    ({"max_steps": 0}, "max_steps must be at least 1"),
    ({"checkpoint_every": 0}, "checkpoint_every must be at least 1"),
    ({"batch_size": 0}, "batch_size must be at least 1"),
    ({"val_fraction": 0.0}, r"val_fraction must be between 0 and 1 \(exclusive\)"),
    ({"val_fraction": 1.0}, "val_fraction must be between 0 and 1"),
    ({"val_fraction": float("nan")}, "val_fraction must be between 0 and 1"),
    ({"num_features": 100_000_000}, "num_features must be between 1 and 4096"),
    ({"lattice_size": 1000}, "lattice_size must be between 2 and 32"),
    ({"num_features": 4096, "lattice_size": 8}, "num_features 4096 with lattice_size 8: 2,048 lattices"),
]


@pytest.mark.parametrize("options,message", BAD_OPTIONS, ids=[str(o) for o, _ in BAD_OPTIONS])
def test_out_of_bounds_options_are_refused_before_the_store_is_opened(options, message, tmp_path):
    # A missing store: an option check that ran after opening it would raise StoreError instead.
    with pytest.raises(ValueError, match=message):
        fit(tmp_path / "missing.fastload", **{**FAST, **options})


@pytest.mark.parametrize("options,message", BAD_OPTIONS[:3], ids=[str(o) for o, _ in BAD_OPTIONS[:3]])
def test_a_changed_config_is_checked_again(options, message, tmp_path):
    # How a run derived from another (fit_many's per-model overrides) is made.
    config = train_mod.TrainConfig(tmp_path / "missing.fastload", **FAST)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(config, **options)


def test_an_unknown_option_is_refused(tmp_path):
    with pytest.raises(TypeError, match="learning_rate"):
        fit(tmp_path / "missing.fastload", learning_rate=0.1)


def test_a_batch_too_large_for_ram_is_refused_before_data_is_read(store_path, monkeypatch):
    def no_reads(*args):
        raise AssertionError("data was read")

    monkeypatch.setattr(Store, "labels", property(no_reads))
    monkeypatch.setattr(Store, "gather", no_reads)
    limit = machine_memory() // (8 * SIDE * SIDE * 3)
    with pytest.raises(ValueError, match=rf"batch_size must be between 1 and {limit:,} for 16x16x3 records"):
        fit(store_path, **{**FAST, "batch_size": limit + 1})


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--workers", "500", "argument --workers: must be between 0 and"),
        ("--threads", "100000", "argument --threads: must be between 1 and"),
        ("--size", "100000", "argument --size: must be between 8 and 4096"),
        ("--lr", "inf", "argument --lr: must be above 0 and at most 10, not inf"),
        ("--lr", "nan", "argument --lr: must be above 0"),
        ("--epochs", "0", "argument --epochs: must be at least 1"),
        ("--batch-size", "0", "argument --batch-size: must be at least 1"),
        ("--max-steps", "-3", "argument --max-steps: must be at least 1"),
        ("--checkpoint-every", "0", "argument --checkpoint-every: must be at least 1"),
        ("--val-fraction", "1.5", "argument --val-fraction: must be between 0 and 1"),
        ("--workers", "many", "argument --workers: invalid int value: 'many'"),
        ("--num-features", "100000000", "argument --num-features: must be between 1 and 4096"),
        ("--lattice-size", "1000", "argument --lattice-size: must be between 2 and 32"),
    ],
)
def test_cli_out_of_bounds_options_are_usage_errors(flag, value, message, store_path, capsys):
    status, err, out = _cli(["train", os.fspath(store_path), "--device", "cpu", flag, value], capsys)
    assert status == 2 and message in err


def test_cli_batch_too_large_for_ram_exits_1(store_path, capsys):
    status, err, out = _cli(_train_argv(store_path, "--batch-size", str(2**50)), capsys)
    assert status == 1 and "batch_size must be between 1 and" in err and "GB of RAM" in err


def test_a_diverging_run_says_so(store_path, monkeypatch):
    # Past the bound on lr (lifted here), the weights overflow and the lattice indexes with NaN.
    monkeypatch.setattr(train_config, "MAX_LR", 1e31)
    with pytest.raises(
        ValueError, match=r"step \d+ \(learning rate [^)]+\): non-finite parameters .*lower the"
    ):
        fit(store_path, epochs=1, **{**FAST, "lr": 1e30})


def test_a_diverged_model_never_overwrites_a_checkpoint(store_path, tmp_path, monkeypatch):
    monkeypatch.setattr(train_config, "MAX_LR", 1e31)
    checkpoint = tmp_path / "run.ckpt"
    with pytest.raises(ValueError, match=r"step (\d+) ") as caught:
        fit(store_path, epochs=1, checkpoint=checkpoint, checkpoint_every=1, **{**FAST, "lr": 1e30})
    saved = torch.load(checkpoint, weights_only=True)  # the last save before the run stopped
    assert all(torch.isfinite(t).all() for t in saved["model"].values() if t.is_floating_point())
    assert saved["step"] < int(caught.value.args[0].split()[1])


def test_a_model_diverged_without_an_error_stops_before_evaluation(store_path, monkeypatch):
    # NaN weights that raise nothing in the step (here: a step that sets them so) are caught
    # once per epoch, before the validation pass would report a NaN RMSE.
    step = train_mod.Trainer.train_step

    def poisoning_step(self, *args):
        step(self, *args)
        with torch.no_grad():
            next(self.model.parameters()).fill_(float("nan"))

    monkeypatch.setattr(train_mod.Trainer, "train_step", poisoning_step)
    logged = []
    with pytest.raises(ValueError, match=rf"step {test_train.STEPS_PER_EPOCH} .*non-finite parameters"):
        fit(store_path, epochs=1, log=logged.append, **FAST)
    assert logged == []


# ---------------------------------------------------------------- out of memory


def test_cli_answers_memory_error_with_a_message(store_path, monkeypatch, capsys):
    monkeypatch.setattr(inspect_mod, "info", lambda path: np.empty(2**62, np.uint8))
    status, err, out = _cli(["info", os.fspath(store_path)], capsys)
    assert status == 1 and err.startswith("fastload info: error: out of memory: Unable to allocate")
    monkeypatch.setattr(train_mod, "fit", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    status, err, out = _cli(_train_argv(store_path), capsys)
    assert status == 1 and err == "fastload train: error: out of memory\n"


# ---------------------------------------------------------------- checkpoint writing


def _partials(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".fastload-partial"))


@pytest.mark.skipif(not os.path.isdir(UNWRITABLE_DIR), reason="needs /sys")
def test_unwritable_checkpoint_folder_fails_before_the_first_epoch(store_path, capsys):
    checkpoint = os.path.join(UNWRITABLE_DIR, "run.ckpt")
    logged = []
    with pytest.raises(OSError, match=rf"checkpoint {checkpoint}: (Permission denied|Read-only)"):
        fit(store_path, checkpoint=checkpoint, log=logged.append, **FAST)
    assert logged == []
    status, err, out = _cli(_train_argv(store_path, "--checkpoint", checkpoint), capsys)
    assert status == 1 and checkpoint in err and "epoch" not in out


@pytest.mark.skipif(not os.path.isdir(UNWRITABLE_DIR), reason="needs /sys")
def test_cli_unwritable_json_log_fails_before_the_first_epoch(store_path, capsys):
    log = os.path.join(UNWRITABLE_DIR, "log.jsonl")
    status, err, out = _cli(_train_argv(store_path, "--json-log", log), capsys)
    assert status == 1 and log in err and "epoch" not in out


def test_checkpoint_in_a_path_under_a_file_is_refused(store_path, tmp_path):
    (tmp_path / "somefile").write_text("x")
    with pytest.raises(ValueError, match="somefile/run.ckpt: its directory does not exist"):
        fit(store_path, checkpoint=tmp_path / "somefile" / "run.ckpt", **FAST)


def test_a_full_disk_names_the_checkpoint_and_leaves_no_partial(store_path, tmp_path, monkeypatch):
    checkpoint = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=checkpoint, **ONE_STEP)
    before = _digest(checkpoint)

    def full_disk(obj, f):
        f.write(b"\0" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match=rf"cannot write the checkpoint {checkpoint}: No space left") as caught:
        fit(store_path, checkpoint=checkpoint, **ONE_STEP)
    assert caught.value.errno == errno.ENOSPC and "partial" not in str(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == ["run.ckpt"] and _digest(checkpoint) == before


def test_a_dead_runs_partial_is_removed_and_a_live_ones_kept(store_path, tmp_path):
    dead = tmp_path / ".run.ckpt.0123456789abcdef.fastload-partial"  # nobody holds its lock
    live = tmp_path / ".run.ckpt.fedcba9876543210.fastload-partial"
    other = tmp_path / ".other.ckpt.0123456789abcdef.fastload-partial"  # another destination's
    for path in (dead, live, other):
        path.write_bytes(b"half a checkpoint")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()",
            os.fspath(live),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        fit(store_path, checkpoint=tmp_path / "run.ckpt", **ONE_STEP)
        assert _partials(tmp_path) == sorted([live.name, other.name])
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    fd = os.open(live, os.O_RDONLY)  # its holder exited: the lock is free again
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


# ---------------------------------------------------------------- resuming on other records


def test_resume_on_a_store_with_other_records_is_refused(store_path, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=ckpt, **ONE_STEP)
    other = tmp_path / "other.fastload"
    images, labels = _images_and_labels(seed=1)
    with StoreWriter(other, (SIDE, SIDE, 3)) as writer:  # same shape, count and label dtype
        writer.extend(images, labels)
    message = rf"trained on the store {store_path}, and {other} holds different records"
    with pytest.raises(ValueError, match=message):
        fit(other, resume=ckpt, **{**ONE_STEP, "max_steps": 2})


def test_resume_on_a_copy_of_the_store_continues(store_path, tmp_path):
    ckpt, copy = tmp_path / "run.ckpt", tmp_path / "copy.fastload"
    fit(store_path, checkpoint=ckpt, **ONE_STEP)
    shutil.copy(store_path, copy)  # the fingerprint is of the records, not of the path
    assert fit(copy, resume=ckpt, **{**ONE_STEP, "max_steps": 2}).steps == 2


def test_resume_with_a_validation_store_the_run_did_not_have_is_refused(store_path, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=ckpt, **ONE_STEP)
    with pytest.raises(ValueError, match="written for a run without a validation store"):
        fit(store_path, val=store_path, resume=ckpt, **{**ONE_STEP, "max_steps": 2})
