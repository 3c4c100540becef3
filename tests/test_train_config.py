"""`TrainConfig` (train/config.py): every option checked before any data is read, outputs that
would overwrite an input refused, the command line's usage errors, and `augment` parsed once."""

from __future__ import annotations

import dataclasses
import os
import shutil

import numpy as np
import pytest
import test_train
import torch
from test_train import FAST, ONE_STEP, SIDE, UNWRITABLE_DIR, digest, images_and_labels, run_cli, train_argv

import fastload.train as train_mod
from fastload import cli
from fastload.augment import Augment
from fastload.inspect import machine_memory
from fastload.store import Store, StoreWriter
from fastload.train import TrainConfig, fit

store_path = test_train.store_path  # the 200-record store of tests/test_train.py, as a fixture here


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
    images, labels = images_and_labels()
    with StoreWriter(path, (SIDE, SIDE, 3)) as writer:
        writer.extend(images[:40], labels[:40])
    return path


@pytest.mark.safety
@pytest.mark.parametrize("spelling", ["same path", "detour", "symlink", "hard link", "linked folder"])
def test_checkpoint_that_is_the_store_is_refused(spelling, own_store, tmp_path):
    before = digest(own_store)
    checkpoint = _spellings(own_store, tmp_path)[spelling]
    with pytest.raises(
        ValueError, match=r"checkpoint .* is the store .*own\.fastload: training would overwrite it"
    ):
        fit(own_store, checkpoint=checkpoint, **ONE_STEP)
    assert digest(own_store) == before


@pytest.mark.safety
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


@pytest.mark.safety
@pytest.mark.parametrize("clash", ["store", "--checkpoint", "--resume", "--monotone-inputs"])
def test_cli_json_log_that_is_an_input_or_the_checkpoint_is_refused(clash, own_store, tmp_path, capsys):
    ckpt, inputs = tmp_path / "run.ckpt", tmp_path / "m.npy"
    np.save(inputs, np.zeros(40))
    assert cli.main(train_argv(own_store, "--max-steps", "1", "--checkpoint", os.fspath(ckpt))) == 0
    before = {p: digest(p) for p in (own_store, ckpt, inputs)}
    target = {"store": own_store, "--checkpoint": ckpt, "--resume": ckpt, "--monotone-inputs": inputs}[clash]
    argv = train_argv(own_store, "--json-log", os.fspath(target), "--max-steps", "2")
    argv += {
        "store": [],
        "--checkpoint": ["--checkpoint", os.fspath(ckpt)],
        "--resume": ["--resume", os.fspath(ckpt)],
        "--monotone-inputs": ["--monotone-inputs", os.fspath(inputs)],
    }[clash]
    status, err, out = run_cli(argv, capsys)
    named = {"store": "the store", "--checkpoint": "the --checkpoint", "--resume": "the --resume checkpoint"}
    assert (
        status == 1 and "--json-log" in err and f"is {named.get(clash, 'the --monotone-inputs file')}" in err
    )
    assert {p: digest(p) for p in before} == before


@pytest.mark.safety
def test_cli_json_log_that_is_a_checkpoint_not_written_yet_is_refused(own_store, tmp_path, capsys):
    same = os.fspath(tmp_path / "out")
    status, err, out = run_cli(train_argv(own_store, "--checkpoint", same, "--json-log", same), capsys)
    assert status == 1 and "--json-log" in err and "is the --checkpoint" in err
    assert not os.path.exists(same)


@pytest.mark.safety
@pytest.mark.parametrize("options,message", BAD_OPTIONS, ids=[str(o) for o, _ in BAD_OPTIONS])
def test_out_of_bounds_options_are_refused_before_the_store_is_opened(options, message, tmp_path):
    # A missing store: an option check that ran after opening it would raise StoreError instead.
    with pytest.raises(ValueError, match=message):
        fit(tmp_path / "missing.fastload", **{**FAST, **options})


@pytest.mark.safety
@pytest.mark.parametrize("options,message", BAD_OPTIONS[:3], ids=[str(o) for o, _ in BAD_OPTIONS[:3]])
def test_a_changed_config_is_checked_again(options, message, tmp_path):
    # How a run derived from another (fit_many's per-model overrides) is made.
    config = train_mod.TrainConfig(tmp_path / "missing.fastload", **FAST)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(config, **options)


@pytest.mark.safety
def test_an_unknown_option_is_refused(tmp_path):
    with pytest.raises(TypeError, match="learning_rate"):
        fit(tmp_path / "missing.fastload", learning_rate=0.1)


@pytest.mark.safety
def test_a_batch_too_large_for_ram_is_refused_before_data_is_read(store_path, monkeypatch):
    def no_reads(*args):
        raise AssertionError("data was read")

    monkeypatch.setattr(Store, "labels", property(no_reads))
    monkeypatch.setattr(Store, "gather", no_reads)
    limit = machine_memory() // (8 * SIDE * SIDE * 3)
    with pytest.raises(ValueError, match=rf"batch_size must be between 1 and {limit:,} for 16x16x3 records"):
        fit(store_path, **{**FAST, "batch_size": limit + 1})


@pytest.mark.safety
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
    status, err, out = run_cli(["train", os.fspath(store_path), "--device", "cpu", flag, value], capsys)
    assert status == 2 and message in err


@pytest.mark.safety
def test_cli_batch_too_large_for_ram_exits_1(store_path, capsys):
    status, err, out = run_cli(train_argv(store_path, "--batch-size", str(2**50)), capsys)
    assert status == 1 and "batch_size must be between 1 and" in err and "GB of RAM" in err


@pytest.mark.safety
@pytest.mark.skipif(not os.path.isdir(UNWRITABLE_DIR), reason="needs /sys")
def test_unwritable_checkpoint_folder_fails_before_the_first_epoch(store_path, capsys):
    checkpoint = os.path.join(UNWRITABLE_DIR, "run.ckpt")
    logged = []
    with pytest.raises(OSError, match=rf"checkpoint {checkpoint}: (Permission denied|Read-only)"):
        fit(store_path, checkpoint=checkpoint, log=logged.append, **FAST)
    assert logged == []
    status, err, out = run_cli(train_argv(store_path, "--checkpoint", checkpoint), capsys)
    assert status == 1 and checkpoint in err and "epoch" not in out


@pytest.mark.safety
def test_checkpoint_in_a_path_under_a_file_is_refused(store_path, tmp_path):
    (tmp_path / "somefile").write_text("x")
    with pytest.raises(ValueError, match="somefile/run.ckpt: its directory does not exist"):
        fit(store_path, checkpoint=tmp_path / "somefile" / "run.ckpt", **FAST)


@pytest.mark.safety
def test_a_checkpoint_path_that_is_a_named_pipe_is_refused_when_the_config_is_made(store_path, tmp_path):
    """Before any data is read, and named as the checkpoint (the save would only fail after an epoch)."""
    fifo = tmp_path / "run.ckpt"
    os.mkfifo(fifo)
    with pytest.raises(ValueError) as err:
        TrainConfig(store_path, checkpoint=fifo, **FAST)
    assert str(err.value).startswith(f"checkpoint {fifo} is a named pipe, not a regular file")


def test_cuda_without_cuda_is_refused(store_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        fit(store_path, **{**FAST, "device": "cuda"})


def test_a_runs_augment_spec_is_parsed_once(store_path, monkeypatch):
    parsed = []
    from_spec = Augment.from_spec.__func__

    def counted(cls, spec, *args, **kwargs):
        parsed.append(spec)
        return from_spec(cls, spec, *args, **kwargs)

    monkeypatch.setattr(Augment, "from_spec", classmethod(counted))
    config = TrainConfig(store_path, augment="crop,flip", **FAST)
    assert isinstance(config.augment, Augment) and config.augment.spec == "crop,flip"
    assert dataclasses.replace(config, lr=1e-3).augment is config.augment  # as fit_many's runs
    fit(store_path, augment="crop,flip", epochs=1, max_steps=1, **FAST)
    assert parsed == ["crop,flip", "crop,flip"]  # the config above, then fit's


def test_an_augment_that_is_no_spec_is_refused(tmp_path):
    missing = tmp_path / "missing.fastload"
    with pytest.raises(
        TypeError, match="augment must be a spec string such as 'crop,flip' or an Augment, not int"
    ):
        TrainConfig(missing, augment=3, **FAST)
    # A checkpoint records the spec: an Augment made without one has nothing to record.
    with pytest.raises(ValueError, match=r"augment Augment\(hflip=0.5\): give a spec string"):
        TrainConfig(missing, augment=Augment(hflip=0.5), **FAST)
    with pytest.raises(ValueError, match="its size and seed are the run's size and data_seed"):
        TrainConfig(missing, augment=Augment.from_spec("flip", size=12), **FAST)
    with pytest.raises(ValueError, match="its size and seed are the run's size and data_seed"):
        TrainConfig(missing, augment=Augment.from_spec("flip", seed=1), **FAST)
