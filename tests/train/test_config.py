"""`TrainConfig` (train/config.py): every option checked before any data is read, outputs that
would overwrite an input refused, the command line's usage errors, and `augment` parsed once."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil

import numpy as np
import pytest
import torch
import train_helpers
from train_helpers import FAST, ONE_STEP, SIDE, UNWRITABLE_DIR, digest, images_and_labels, run_cli, train_argv

import fastload.train as train_mod
from fastload import cli
from fastload.augment import Augment
from fastload.inspect import machine_memory
from fastload.store import Store, StoreWriter
from fastload.train import TrainConfig, fit

store_path = train_helpers.store_path  # the 200-record store of tests/train_helpers.py, as a fixture here


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


# ---------------------------------------------------------------- every option of `fastload train`

OPTIONS_SIDE, OPTIONS_COUNT = 12, 40  # 36 training records in batches of 8: 5 steps an epoch


@pytest.fixture(scope="module")
def option_files(tmp_path_factory):
    """A small store, a validation store, monotone inputs and a runs file for the option table."""
    folder = tmp_path_factory.mktemp("options")
    rng = np.random.default_rng(0)
    for name in ("store", "val"):
        images = rng.integers(0, 256, (OPTIONS_COUNT, OPTIONS_SIDE, OPTIONS_SIDE, 3), dtype=np.uint8)
        with StoreWriter(folder / f"{name}.fastload", (OPTIONS_SIDE, OPTIONS_SIDE, 3)) as writer:
            writer.extend(images, images.reshape(OPTIONS_COUNT, -1).mean(1) / 255.0)
    np.save(folder / "exposure.npy", rng.uniform(0, 1, OPTIONS_COUNT))
    (folder / "runs.json").write_text('[{"name": "bright", "lr": 0.01}]')
    return folder


def train_with(folder, extra, out_folder, capsys) -> dict:
    """`fastload train` of the option table's store for one epoch with ``extra`` flags, saving to
    ``out_folder``/run.ckpt (a folder of them with --runs or --runs-file): what it records."""
    checkpoint = out_folder / "run.ckpt"
    argv = ["train", os.fspath(folder / "store.fastload"), "--device", "cpu", "--threads", "1"]
    argv += ["--batch-size", "8", "--epochs", "1", "--checkpoint", os.fspath(checkpoint), *extra]
    status, err, out = run_cli(argv, capsys)
    saved = None
    if checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=True)
    return {"status": status, "err": err, "out": out, "checkpoint": saved, "folder": checkpoint}


def _options(record: dict) -> dict:
    return record["checkpoint"]["run"]["options"]


def _refused(status: int, *words):
    def check(record, default, folder):
        assert record["status"] == status and all(word in record["err"] for word in words), record["err"]

    return check


def _recorded(**expected):
    """The run's checkpoint records these options (and the default run other values)."""

    def check(record, default, folder):
        assert record["status"] == 0, record["err"]
        for name, value in expected.items():
            assert _options(record)[name] == value != _options(default)[name], name

    return check


def _in_config(**expected):
    """The model's config in the checkpoint (what a resume must match) holds these values."""

    def check(record, default, folder):
        assert record["status"] == 0, record["err"]
        for name, value in expected.items():
            assert record["checkpoint"]["config"][name] == value != default["checkpoint"]["config"][name], (
                name
            )

    return check


def _group_of(*names):
    def check(record, default, folder):
        assert record["status"] == 0, record["err"]
        assert sorted(p.name for p in record["folder"].iterdir()) == [f"{n}.ckpt" for n in names]
        for name in names:
            saved = torch.load(record["folder"] / f"{name}.ckpt", weights_only=True)
            assert saved["run"]["name"] == name

    return check


def _other_split(record, default, folder):
    """A data seed of its own: another validation split, so another baseline."""
    assert record["status"] == 0, record["err"]
    assert record["checkpoint"]["config"]["data_seed"] == 7 == _options(record)["data_seed"]
    assert (
        record["checkpoint"]["history"][0]["baseline_rmse"]
        != default["checkpoint"]["history"][0]["baseline_rmse"]
    )


def _steps(count: int):
    def check(record, default, folder):
        assert record["status"] == 0, record["err"]
        assert record["checkpoint"]["step"] == count != default["checkpoint"]["step"]

    return check


def _epochs(count: int):
    def check(record, default, folder):
        assert record["status"] == 0, record["err"]
        assert len(record["checkpoint"]["history"]) == count != len(default["checkpoint"]["history"])

    return check


def _continued(record, default, folder):
    """Resumed from the default run's checkpoint: its first epoch is the default run's."""
    assert record["status"] == 0, record["err"]
    history = record["checkpoint"]["history"]
    assert len(history) == 2 and history[0]["val_rmse"] == default["checkpoint"]["history"][0]["val_rmse"]


def _json_lines(record, default, folder):
    assert record["status"] == 0, record["err"]
    assert json.loads(record["out"].splitlines()[0])["epoch"] == 1 and default["out"][0] != "{"


def _logged(record, default, folder):
    assert record["status"] == 0, record["err"]
    assert json.loads((record["folder"].parent / "log.jsonl").read_text())["epoch"] == 1


def _written(record, default, folder):
    assert record["status"] == 0 and _options(record)["checkpoint"] == os.fspath(record["folder"])


def _backbone(record, default, folder):
    """resnet18 where torchvision is installed; refused naming it where it is not."""
    if record["status"] == 1:
        assert "torchvision" in record["err"]
    else:
        assert record["checkpoint"]["config"]["backbone"] == "resnet18"


def _val_recorded(record, default, folder):
    assert record["status"] == 0, record["err"]
    validation = record["checkpoint"]["stores"]["validation store"]
    assert (
        validation["path"] == os.fspath(folder / "val.fastload")
        and default["checkpoint"]["stores"]["validation store"] is None
    )


def _monotone_recorded(record, default, folder):
    assert record["status"] == 0, record["err"]
    assert _options(record)["monotone_inputs"] == os.fspath(folder / "exposure.npy")
    assert "monotone_input_keypoints" in record["checkpoint"]["config"]
    assert "monotone_input_keypoints" not in default["checkpoint"]["config"]


# flag -> (arguments, a function of (record, the default run's record, the files) that checks it
# changed what the run records, or was refused). {files} and {out} in the arguments are folders.
TRAIN_OPTIONS = {
    "--task": (["--task", "classification"], _refused(1, "classification")),
    "--val": (["--val", "{files}/val.fastload"], _val_recorded),
    "--val-fraction": (["--val-fraction", "0.5"], _steps(3)),
    "--runs": (["--runs", "2"], _group_of("run0", "run1")),
    "--runs-file": (["--runs-file", "{files}/runs.json"], _group_of("bright")),
    "--stack": (["--stack"], _refused(2, "--stack stacks the runs of a group: give --runs N")),
    "--data-seed": (["--data-seed", "7"], _other_split),
    "--augment": (["--augment", "flip"], _in_config(augment="flip")),
    "--patience": (["--patience", "1"], _recorded(patience=1)),
    "--epochs": (["--epochs", "2"], _epochs(2)),
    "--batch-size": (["--batch-size", "4"], _in_config(batch_size=4)),
    "--lr": (["--lr", "0.01"], _recorded(lr=0.01)),
    "--schedule": (["--schedule", "constant"], _recorded(schedule="constant")),
    "--weight-decay": (["--weight-decay", "0.1"], _recorded(weight_decay=0.1)),
    "--device": (["--device", "cuda:99"], _refused(1, "cuda:99")),
    "--amp": (["--amp", "bf16"], _recorded(amp="bf16")),
    "--workers": (["--workers", "1"], _recorded(workers=1)),
    "--on-device": (["--on-device"], _recorded(on_device=True)),
    "--threads": (["--threads", "2"], _recorded(threads=2)),
    "--seed": (["--seed", "3"], _in_config(seed=3)),
    "--checkpoint": ([], _written),
    "--checkpoint-every": (["--checkpoint-every", "2"], _recorded(checkpoint_every=2)),
    "--resume": (["--resume", "{files}/default.ckpt", "--epochs", "2"], _continued),
    "--max-steps": (["--max-steps", "2"], _steps(2)),
    "--monotone-inputs": (["--monotone-inputs", "{files}/exposure.npy"], _monotone_recorded),
    "--val-monotone-inputs": (
        ["--val-monotone-inputs", "{files}/exposure.npy"],
        _refused(1, "val_monotone_inputs are the inputs of a separate validation store"),
    ),
    "--backbone": (["--backbone", "resnet18"], _backbone),
    "--num-features": (["--num-features", "4"], _in_config(num_features=4)),
    "--lattice-size": (["--lattice-size", "2"], _in_config(lattice_size=2)),
    "--ordinal": (["--ordinal"], _refused(1, "ordinal=True orders the classes of a classification")),
    "--size": (["--size", "8"], _in_config(size=8)),
    "--json": (["--json"], _json_lines),
    "--json-log": (["--json-log", "{out}/log.jsonl"], _logged),
}


@pytest.fixture(scope="module")
def default_run(option_files):
    """The option table's run with no option of its own, its checkpoint kept as default.ckpt."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        argv = ["train", os.fspath(option_files / "store.fastload"), "--device", "cpu", "--threads", "1"]
        argv += [
            "--batch-size",
            "8",
            "--epochs",
            "1",
            "--checkpoint",
            os.fspath(option_files / "default.ckpt"),
        ]
        assert cli.main(argv) == 0, stderr.getvalue()
    return {
        "out": stdout.getvalue(),
        "checkpoint": torch.load(option_files / "default.ckpt", weights_only=True),
    }


@pytest.mark.parametrize("flag", list(TRAIN_OPTIONS))
def test_every_train_option_reaches_the_run_or_is_refused(flag, option_files, default_run, tmp_path, capsys):
    """Each flag of `fastload train --help` changes what the run records (its checkpoint, log or
    output), or is refused by name: none is dropped without a word (as --data-seed was on a
    single run, and --stack without --runs)."""
    arguments, check = TRAIN_OPTIONS[flag]
    arguments = [a.format(files=option_files, out=tmp_path) for a in arguments]
    check(train_with(option_files, arguments, tmp_path, capsys), default_run, option_files)


def test_the_option_table_covers_every_train_flag():
    commands = next(a for a in cli.build_parser()._actions if a.dest == "command")
    flags = {
        option
        for action in commands.choices["train"]._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }
    assert flags == set(TRAIN_OPTIONS)


def test_checkpoint_every_without_a_checkpoint_is_a_usage_error(option_files, capsys):
    argv = ["train", os.fspath(option_files / "store.fastload"), "--device", "cpu", "--checkpoint-every", "2"]
    status, err, out = run_cli(argv, capsys)
    assert status == 2 and "--checkpoint-every saves to --checkpoint: give --checkpoint PATH with it" in err
