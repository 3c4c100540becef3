"""Checkpoints that survive a full disk, a crash and a hostile file: a fit_many group saved all
or nothing and resumed from its last common step, the checkpoint written before the epoch's log,
a full disk named with the file, and every part of a loaded checkpoint checked."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from train_helpers import disk_full_at

import fastload
from fastload import cli
from fastload.files import PendingOutput
from fastload.store import StoreWriter
from fastload.train import fit
from fastload.train.checkpoint import check_same_stores, load_checkpoint, load_group

pytestmark = pytest.mark.safety  # full disks, crashes and hostile files, every test here
COUNT, SIDE = 40, 8
# 36 training records in batches of 8: 5 steps an epoch.
SHARED = dict(epochs=2, batch_size=8, device="cpu", threads=1, deterministic=True)
RUNS = [dict(name="run0", lr=1e-3, seed=0), dict(name="run1", lr=3e-2, seed=1)]
EVERY_2 = dict(SHARED, checkpoint_every=2)  # saves at steps 2 and 4 of a run stopped at step 4


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("checkpoints") / "bright.fastload"
    images = np.random.default_rng(0).integers(0, 256, (COUNT, SIDE, SIDE, 3), dtype=np.uint8)
    with StoreWriter(path, (SIDE, SIDE, 3)) as writer:
        writer.extend(images, images.reshape(COUNT, -1).mean(1) / 255.0)
    return path


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _assert_same_parameters(a, b):
    a, b = a.state_dict(), b.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def _steps(folder) -> dict:
    return {p.name: load_checkpoint(p)["step"] for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------- a group saved all or nothing


def test_a_group_save_that_fails_for_one_run_keeps_the_last_common_step(store_path, tmp_path, monkeypatch):
    # Saves at steps 2 and 4 write run0 then run1: the 4th file, run1's at step 4, fills the disk.
    disk_full_at(monkeypatch, 4)
    with pytest.raises(Exception) as caught:
        fastload.fit_many(store_path, RUNS, checkpoint=tmp_path, max_steps=4, **EVERY_2)
    monkeypatch.undo()
    left = _steps(tmp_path)
    # Today's main refuses this resume forever: "stopped at different places (run0: step 4, run1: step 2)".
    resumed = fastload.fit_many(
        store_path, RUNS, resume=tmp_path, checkpoint=tmp_path, max_steps=4, **EVERY_2
    )
    assert left == {"run0.ckpt": 2, "run1.ckpt": 2}  # nothing else: no partial, no .previous
    straight = fastload.fit_many(store_path, RUNS, max_steps=4, **EVERY_2)
    for a, b in zip(straight, resumed):
        assert a.steps == b.steps == 4
        _assert_same_parameters(a.model, b.model)
    assert _steps(tmp_path) == {"run0.ckpt": 4, "run1.ckpt": 4}
    assert isinstance(caught.value, OSError) and caught.value.errno == errno.ENOSPC
    assert (
        str(caught.value)
        == f"[Errno 28] cannot write the checkpoint {tmp_path / 'run1.ckpt'}: No space left on device"
    )


def test_a_failed_rename_puts_the_previous_set_back(store_path, tmp_path, monkeypatch):
    real, commits = PendingOutput.commit, []

    def commit(self):
        commits.append(self.path)
        if len(commits) == 4:  # run1's new file at step 4, after run0's is in place
            self.discard()
            raise OSError(errno.EIO, f"cannot write the checkpoint {self.path}: {os.strerror(errno.EIO)}")
        real(self)

    monkeypatch.setattr(PendingOutput, "commit", commit)
    with pytest.raises(OSError, match=rf"cannot write the checkpoint {tmp_path / 'run1.ckpt'}: Input/output"):
        fastload.fit_many(store_path, RUNS, checkpoint=tmp_path, max_steps=4, **EVERY_2)
    monkeypatch.undo()
    assert _steps(tmp_path) == {"run0.ckpt": 2, "run1.ckpt": 2}


CRASH = """
import os, sys
import fastload

from fastload.files import PendingOutput

real, commits = PendingOutput.commit, []


def commit(self):
    commits.append(self.path)
    if len(commits) == int(sys.argv[3]):
        os._exit(9)  # killed among the renames of the save at step 4
    real(self)


PendingOutput.commit = commit
fastload.fit_many(sys.argv[1], {runs!r}, checkpoint=sys.argv[2], max_steps=4, **{options!r})
"""


@pytest.mark.parametrize("killed_at", [3, 4], ids=["before-any-new-file", "between-the-runs"])
def test_a_group_killed_among_its_renames_resumes_from_the_last_common_step(store_path, tmp_path, killed_at):
    script = CRASH.format(runs=RUNS, options=EVERY_2)
    child = subprocess.run(
        [sys.executable, "-c", script, os.fspath(store_path), os.fspath(tmp_path), str(killed_at)]
    )
    assert child.returncode == 9
    with pytest.warns(
        UserWarning, match="every run resumes from step 2, the last step all of them saved"
    ) as warned:
        resumed = fastload.fit_many(
            store_path, RUNS, resume=tmp_path, checkpoint=tmp_path, max_steps=4, **EVERY_2
        )
    assert warned[0].filename == __file__  # the warning points at the caller's line
    straight = fastload.fit_many(store_path, RUNS, max_steps=4, **EVERY_2)
    for a, b in zip(straight, resumed):
        assert a.steps == b.steps == 4
        _assert_same_parameters(a.model, b.model)
    assert _steps(tmp_path) == {"run0.ckpt": 4, "run1.ckpt": 4}  # the killed run's partial is gone too


# ---------------------------------------------------------------- the checkpoint before the log


def test_a_log_that_cannot_be_written_loses_no_checkpoint(store_path, tmp_path):
    def full_disk_log(metrics):
        raise OSError(errno.ENOSPC, "cannot write the JSON log: No space left on device")

    checkpoint = tmp_path / "run.ckpt"
    with pytest.raises(OSError, match="No space left"):
        fit(store_path, checkpoint=checkpoint, log=full_disk_log, **{**SHARED, "epochs": 1})
    saved = load_checkpoint(checkpoint)
    assert saved["epoch"] == 1 and saved["step"] == 5 and len(saved["history"]) == 1


# ---------------------------------------------------------------- a full disk, named


def test_a_full_disk_during_torch_save_names_the_checkpoint(store_path, tmp_path, monkeypatch, capsys):
    checkpoint = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=checkpoint, max_steps=1, **SHARED)
    before = _digest(checkpoint)
    disk_full_at(monkeypatch, 1)
    argv = ["train", os.fspath(store_path), "--device", "cpu", "--threads", "1", "--batch-size", "8"]
    status = cli.main([*argv, "--max-steps", "2", "--checkpoint", os.fspath(checkpoint)])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err and "enforce fail" not in err
    assert (
        err.strip()
        == f"fastload train: error: [Errno 28] cannot write the checkpoint {checkpoint}: No space left on device"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["run.ckpt"] and _digest(checkpoint) == before


# ---------------------------------------------------------------- hostile checkpoints


@pytest.fixture(scope="module")
def saved_mid_epoch(store_path, tmp_path_factory):
    """A real checkpoint two steps into epoch 2 (epoch 1, step 7, a partial epoch)."""
    path = tmp_path_factory.mktemp("hostile") / "real.ckpt"
    fit(store_path, checkpoint=path, max_steps=7, **SHARED)
    return path


def _set(key, value):
    return lambda c: c.__setitem__(key, value)


def _first_model_key(c):
    return next(iter(c["model"]))


HOSTILE = {
    "no config": (lambda c: c.pop("config"), "it has no config"),
    "config not a dict": (_set("config", [1, 2]), "its config is a list, not a dict"),
    "no model": (lambda c: c.pop("model"), "it has no model"),
    "a model key missing": (lambda c: c["model"].pop(_first_model_key(c)), "model: it has no "),
    "a model key too many": (lambda c: c["model"].update(extra=torch.zeros(1)), "model: extra is no part"),
    "a parameter of another shape": (
        lambda c: c["model"].update({_first_model_key(c): torch.zeros(3)}),
        r"model: .* has shape \(3,\), the model's",
    ),
    "epoch 10**30": (_set("epoch", 10**30), "epoch 10{30} disagrees with its history of 1 epochs"),
    "epoch -1": (_set("epoch", -1), "epoch -1 is not a count"),
    "step -100": (_set("step", -100), "step -100 is not a count"),
    "step 1000": (_set("step", 1000), "step 1000 is not where 1 epochs of 5 steps and 2 more end"),
    "step a string": (_set("step", "7"), "step '7' is not a count"),
    "history of another epoch": (lambda c: c["history"][0].update(epoch=5), "history entry 0 is not"),
    "history without the validation figure": (
        lambda c: c["history"][0].pop("val_rmse"),
        "history entry 0 is not",
    ),
    "partial epoch moved": (
        lambda c: c["partial"]["dataset"].update(position=4),
        "its partial epoch .* is not the epoch after",
    ),
    "partial epoch of another seed": (
        lambda c: c["partial"]["dataset"].update(seed=99),
        "its dataset position has seed 99, its config data_seed 0",
    ),
    "partial meter not numbers": (
        lambda c: c["partial"]["meter"].update(samples="x"),
        "its partial epoch's meter .* is not counts",
    ),
    "torch random state of another size": (
        lambda c: c["rng"].update(torch=torch.zeros(10, dtype=torch.uint8)),
        "its torch random state is not 5056 bytes",
    ),
    "NumPy random state cut": (
        lambda c: c["rng"]["numpy"].__setitem__(1, torch.zeros(3, dtype=torch.int64)),
        "its NumPy random state is not",
    ),
    "Python random state cut": (lambda c: c["rng"].update(python=[0] * 10), "its Python random state is not"),
    "no random states": (lambda c: c.pop("rng"), "it has no rng"),
    "optimizer moment of another shape": (
        lambda c: c["optimizer"]["state"][0].update(exp_avg=torch.zeros(2)),
        r"optimizer: exp_avg has shape \(2,\)",
    ),
    "optimizer without its groups": (lambda c: c["optimizer"].pop("param_groups"), "optimizer: "),
    "scaler not a dict": (_set("scaler", []), "its scaler is a list"),
    "no stores": (lambda c: c.pop("stores"), "it has no stores"),
    "run not a dict": (_set("run", [1]), "its run is not a name and named options"),
    "run options not named": (
        lambda c: c["run"].update(options={1: 2}),
        "its run is not a name and named options",
    ),
    "stores without fingerprints": (
        lambda c: c["stores"].update(store={"path": 1}),
        "its stores are not a path and a fingerprint",
    ),
}


def edited(checkpoint_path, edit, path):
    """A copy at `path` of the checkpoint at `checkpoint_path`, changed by `edit`."""
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    edit(checkpoint)
    torch.save(checkpoint, path)
    return path


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_checkpoint_is_refused_naming_what_is_wrong(case, store_path, saved_mid_epoch, tmp_path):
    edit, message = HOSTILE[case]
    hostile = edited(saved_mid_epoch, edit, tmp_path / "hostile.ckpt")
    with pytest.raises(ValueError, match=rf"^not a valid fastload checkpoint: {hostile}: {message}"):
        fit(store_path, resume=hostile, max_steps=9, **SHARED)


def test_the_unedited_checkpoint_resumes(store_path, saved_mid_epoch):
    assert fit(store_path, resume=saved_mid_epoch, max_steps=9, **SHARED).steps == 9


def test_cli_names_a_hostile_checkpoint_without_a_traceback(store_path, saved_mid_epoch, tmp_path, capsys):
    checkpoint = torch.load(saved_mid_epoch, weights_only=True)
    checkpoint.pop("config")
    hostile = tmp_path / "hostile.ckpt"
    torch.save(checkpoint, hostile)
    argv = [
        "train",
        os.fspath(store_path),
        "--device",
        "cpu",
        "--batch-size",
        "8",
        "--resume",
        os.fspath(hostile),
    ]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert (
        err.strip() == f"fastload train: error: not a valid fastload checkpoint: {hostile}: it has no config"
    )


def test_resuming_a_run_past_its_epochs_is_refused(store_path, tmp_path):
    checkpoint = tmp_path / "done.ckpt"
    fit(store_path, checkpoint=checkpoint, **SHARED)  # 2 epochs finished
    with pytest.raises(ValueError, match="has finished 2 epochs, more than the 1 of this run"):
        fit(store_path, resume=checkpoint, **{**SHARED, "epochs": 1})


SAME_SEED_RUNS = [dict(name="run0", lr=1e-3), dict(name="run1", lr=2e-3)]  # differing only in lr


@pytest.mark.parametrize("runs", [SAME_SEED_RUNS, [dict(name="run0"), dict(name="run1")]], ids=["lr", "name"])
def test_a_group_resume_refuses_swapped_checkpoints_naming_both_runs(runs, store_path, tmp_path):
    """Swapped, each run would continue the other's weights and optimizer state, and the table
    would credit the results to the wrong learning rate; runs alike but for their name too."""
    fastload.fit_many(store_path, runs, checkpoint=tmp_path, max_steps=2, **SHARED)
    run0, run1 = tmp_path / "run0.ckpt", tmp_path / "run1.ckpt"
    os.rename(run0, tmp_path / "swap")
    os.rename(run1, run0)
    os.rename(tmp_path / "swap", run1)
    lr = " (lr 0.002)" if runs is SAME_SEED_RUNS else ""
    with pytest.raises(ValueError) as refused:
        fastload.fit_many(store_path, runs, resume=tmp_path, max_steps=4, **SHARED)
    assert str(refused.value) == (
        f"resume {run0}: the checkpoint was written by run run1{lr}, not by this run run0"
        f"{lr and ' (lr 0.001)'}; resume each run from its own checkpoint"
    )


def test_a_checkpoint_records_its_run_and_every_option(store_path, tmp_path):
    fastload.fit_many(store_path, SAME_SEED_RUNS, checkpoint=tmp_path, max_steps=2, **SHARED)
    run = torch.load(tmp_path / "run1.ckpt", weights_only=True)["run"]
    assert run["name"] == "run1"
    assert run["options"]["lr"] == 2e-3 and run["options"]["seed"] == 0 and run["options"]["max_steps"] == 2
    assert run["options"]["checkpoint"] == os.fspath(tmp_path / "run1.ckpt")


# ---------------------------------------------------------------- load_group on its own


@pytest.fixture(scope="module")
def steps_2_and_4(store_path, tmp_path_factory):
    """Checkpoints of one run stopped at steps 2 and 4 (both in epoch 1), as bytes."""
    folder = tmp_path_factory.mktemp("group")
    for steps in (2, 4):
        fit(store_path, checkpoint=folder / f"{steps}.ckpt", max_steps=steps, **SHARED)
    return {steps: (folder / f"{steps}.ckpt").read_bytes() for steps in (2, 4)}


def _group(folder, files: dict, steps_2_and_4) -> list:
    """Writes `files` ({name: step}) into `folder`; the paths of run0 and run1."""
    for name, step in files.items():
        (folder / name).write_bytes(steps_2_and_4[step])
    return [os.fspath(folder / "run0.ckpt"), os.fspath(folder / "run1.ckpt")]


def _steps_of(chosen) -> list:
    return [(os.path.basename(path), checkpoint["step"]) for path, checkpoint in chosen]


def test_load_group_takes_the_runs_files_when_they_agree(tmp_path, steps_2_and_4):
    paths = _group(tmp_path, {"run0.ckpt": 4, "run1.ckpt": 4, "run1.ckpt.previous": 2}, steps_2_and_4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing was interrupted
        chosen = load_group(os.fspath(tmp_path), paths, ["run0", "run1"], repair=True)
    assert _steps_of(chosen) == [("run0.ckpt", 4), ("run1.ckpt", 4)]


@pytest.mark.parametrize("repair", [False, True])
def test_load_group_resumes_an_interrupted_save_from_the_last_common_step(tmp_path, steps_2_and_4, repair):
    # The save at step 4 renamed run0's new file into place, and stopped before run1's.
    files = {"run0.ckpt": 4, "run0.ckpt.previous": 2, "run1.ckpt": 2}
    paths = _group(tmp_path, files, steps_2_and_4)
    with pytest.warns(UserWarning) as caught:
        chosen = load_group(os.fspath(tmp_path), paths, ["run0", "run1"], repair=repair)
    assert str(caught[0].message) == (
        f"resume {tmp_path}: the group's last save was interrupted before every run's checkpoint was in "
        "place; every run resumes from step 2, the last step all of them saved"
    )
    if repair:  # run0's previous file is back in place
        assert _steps_of(chosen) == [("run0.ckpt", 2), ("run1.ckpt", 2)]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run0.ckpt", "run1.ckpt"]
        assert load_checkpoint(tmp_path / "run0.ckpt")["step"] == 2
    else:
        assert _steps_of(chosen) == [("run0.ckpt.previous", 2), ("run1.ckpt", 2)]
        assert load_checkpoint(tmp_path / "run0.ckpt")["step"] == 4


def test_load_group_takes_the_latest_step_all_runs_hold(tmp_path, steps_2_and_4):
    files = {"run0.ckpt": 4, "run0.ckpt.previous": 2, "run1.ckpt": 2, "run1.ckpt.previous": 4}
    paths = _group(tmp_path, files, steps_2_and_4)
    with pytest.warns(UserWarning, match="every run resumes from step 4"):
        chosen = load_group(os.fspath(tmp_path), paths, ["run0", "run1"], repair=False)
    assert _steps_of(chosen) == [("run0.ckpt", 4), ("run1.ckpt.previous", 4)]


def test_load_group_refuses_runs_that_stopped_apart_naming_each(tmp_path, steps_2_and_4):
    paths = _group(tmp_path, {"run0.ckpt": 4, "run1.ckpt": 2}, steps_2_and_4)
    with pytest.raises(ValueError) as err:
        load_group(os.fspath(tmp_path), paths, ["run0", "run1"], repair=True)
    assert str(err.value) == (
        f"resume {tmp_path}: the runs' checkpoints stopped at different places (run0: step 4, run1: step 2); "
        "resume the runs that stopped together"
    )
    (tmp_path / "run0.ckpt").unlink()
    (tmp_path / "run1.ckpt.previous").write_bytes(steps_2_and_4[4])
    with pytest.raises(ValueError, match=r"\(run0: no checkpoint, run1: step 2 or step 4\)"):
        load_group(os.fspath(tmp_path), paths, ["run0", "run1"], repair=True)
    for name in ("run1.ckpt", "run1.ckpt.previous"):
        (tmp_path / name).unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_group(os.fspath(tmp_path), paths, ["run0", "run1"], repair=True)
    assert err.value.errno == errno.ENOENT
    assert err.value.strerror == f"resume {tmp_path}: no checkpoint of these runs (run0.ckpt, run1.ckpt)"


def test_load_group_refuses_one_step_in_two_data_orders(tmp_path, steps_2_and_4):
    """Runs of a group share one data stream: the same step with another data seed is another place."""
    paths = _group(tmp_path, {"run0.ckpt": 4, "run1.ckpt": 4}, steps_2_and_4)
    other = torch.load(paths[1], weights_only=True)
    other["partial"]["dataset"]["seed"] = 7
    other["config"]["data_seed"] = 7
    torch.save(other, paths[1])
    with pytest.raises(ValueError, match=r"stopped at different places \(run0: step 4, run1: step 4\)"):
        load_group(os.fspath(tmp_path), paths, ["run0", "run1"], repair=True)


# ---------------------------------------------------------------- load_checkpoint's checks on their own

LOADED_HOSTILE = {
    "meter wait a bool": (
        lambda c: c["partial"]["meter"].update(wait=True),
        "its partial epoch's meter .* is not counts",
    ),
    "meter wait a string": (
        lambda c: c["partial"]["meter"].update(wait="x"),
        "its partial epoch's meter .* is not counts",
    ),
    "meter seconds infinite": (
        lambda c: c["partial"]["meter"].update(seconds=float("inf")),
        "its partial epoch's meter .* is not counts",
    ),
    "meter wait negative": (
        lambda c: c["partial"]["meter"].update(wait=-0.5),
        "its partial epoch's meter .* is not counts",
    ),
    "no partial": (lambda c: c.pop("partial"), "it has no partial$"),
    "partial not a dict": (_set("partial", "x"), "its partial epoch is not a dataset position and a meter$"),
    "partial meter not a dict": (
        lambda c: c["partial"].update(meter="x"),
        "its partial epoch is not a dataset position and a meter$",
    ),
    "NumPy position past its keys": (
        lambda c: c["rng"]["numpy"].__setitem__(2, 625),
        "its NumPy random state is not an MT19937 state$",
    ),
    "Python word negative": (
        lambda c: c["rng"]["python"].__setitem__(0, -1),
        "its Python random state is not a Mersenne Twister state$",
    ),
    "Python word of 33 bits": (
        lambda c: c["rng"]["python"].__setitem__(0, 2**32),
        "its Python random state is not a Mersenne Twister state$",
    ),
    "Python position past its words": (
        lambda c: c["rng"]["python"].__setitem__(624, 625),
        "its Python random state is not a Mersenne Twister state$",
    ),
    "CUDA states a tuple": (
        lambda c: c["rng"].update(cuda=()),
        "its CUDA random states are not a list of byte tensors",
    ),
    "CUDA state of floats": (
        lambda c: c["rng"].update(cuda=[torch.zeros(16)]),
        "its CUDA random states are not a list of byte tensors",
    ),
    "config key not a name": (
        lambda c: c["config"].update({1: 2}),
        "its config has keys that are not names$",
    ),
    "model value not a tensor": (
        lambda c: c["model"].update(extra=[1.0]),
        "its model holds something other than named tensors$",
    ),
    "task unknown": (
        lambda c: c["config"].update(task="ranking"),
        "its task 'ranking' is none of regression, classification$",
    ),
    "history entry of another epoch, word for word": (
        lambda c: c["history"][0].update(epoch=5),
        "history entry 0 is not the metrics of epoch 1$",
    ),
    "stores without the validation store": (
        lambda c: c["stores"].pop("validation store"),
        "its stores are not the store and the validation store$",
    ),
    "validation store without a fingerprint": (
        lambda c: c["stores"].update({"validation store": {"path": "val.fastload"}}),
        "its stores are not a path and a fingerprint each$",
    ),
}


@pytest.mark.parametrize("case", list(LOADED_HOSTILE))
def test_load_checkpoint_refuses_a_hostile_part(case, saved_mid_epoch, tmp_path):
    edit, message = LOADED_HOSTILE[case]
    hostile = edited(saved_mid_epoch, edit, tmp_path / "hostile.ckpt")
    with pytest.raises(ValueError, match=rf"^not a valid fastload checkpoint: {hostile}: {message}"):
        load_checkpoint(hostile)


def _edge_states(c):
    c["rng"]["numpy"][2] = 624  # every key drawn
    c["rng"]["python"][0] = 0
    c["rng"]["python"][1] = 2**32 - 1
    c["rng"]["python"][624] = 624


@pytest.mark.parametrize("edit", [lambda c: c["rng"]["numpy"].__setitem__(2, 0), _edge_states])
def test_load_checkpoint_takes_random_states_at_their_edges(saved_mid_epoch, tmp_path, edit):
    assert load_checkpoint(edited(saved_mid_epoch, edit, tmp_path / "edges.ckpt"))["step"] == 7


def test_load_checkpoint_takes_a_meter_that_never_waited(saved_mid_epoch, tmp_path):
    idle = edited(
        saved_mid_epoch, lambda c: c["partial"]["meter"].update(wait=0, seconds=0.0), tmp_path / "i.ckpt"
    )
    assert load_checkpoint(idle)["partial"]["meter"]["wait"] == 0


def test_load_checkpoint_takes_a_fingerprinted_validation_store_and_a_config_without_data_seed(
    saved_mid_epoch, tmp_path
):
    """A run with a validation store records its fingerprint; a checkpoint written before
    ``data_seed`` existed resumes with the seed its position records."""

    def edit(c):
        c["stores"]["validation store"] = {"path": "val.fastload", "fingerprint": "abc"}
        c["config"].pop("data_seed")

    loaded = load_checkpoint(edited(saved_mid_epoch, edit, tmp_path / "older.ckpt"))
    assert loaded["stores"]["validation store"]["fingerprint"] == "abc" and loaded["step"] == 7


def test_a_file_that_is_no_checkpoint_is_named_with_what_it_is(saved_mid_epoch, tmp_path):
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=rf"^{garbage}: not a readable fastload training checkpoint \(."):
        load_checkpoint(garbage)
    for name, contents in (("list.ckpt", [1, 2]), ("other.ckpt", {"format": "another-format"})):
        torch.save(contents, tmp_path / name)
        with pytest.raises(ValueError) as err:
            load_checkpoint(tmp_path / name)
        assert str(err.value) == (
            f"{tmp_path / name}: not a fastload training checkpoint (fastload-train-checkpoint-1)"
        )


def _train_in_a_child(argv: list, seconds: int = 120) -> subprocess.CompletedProcess:
    """`fastload ARGV` in a child process, killed past ``seconds``: a read that blocks on a
    named pipe fails the test instead of hanging the suite."""
    return subprocess.run(
        [sys.executable, "-m", "fastload", *argv], capture_output=True, text=True, timeout=seconds
    )


def test_a_resume_that_is_a_named_pipe_is_refused_without_blocking(store_path, tmp_path):
    fifo = tmp_path / "run.ckpt"
    os.mkfifo(fifo)
    child = _train_in_a_child(
        ["train", os.fspath(store_path), "--device", "cpu", "--resume", os.fspath(fifo)]
    )
    assert child.returncode == 1
    assert child.stderr == (
        f"fastload train: error: {fifo}: not a regular file (a named pipe); the checkpoint must be a file\n"
    )


GROUP_WITH_A_PIPE = """
import os, sys, fastload
folder = sys.argv[2]
fastload.fit_many(sys.argv[1], {runs!r}, checkpoint=folder, max_steps=2, **{options!r})
os.replace(os.path.join(folder, "run1.ckpt"), os.path.join(folder, "run1.ckpt.keep"))
fastload.fit_many(sys.argv[1], {runs!r}, checkpoint=folder, max_steps=4, **{options!r})
os.replace(os.path.join(folder, "run1.ckpt.keep"), os.path.join(folder, "run1.ckpt"))
os.mkfifo(os.path.join(folder, "run0.ckpt.previous"))  # run0 at step 4, run1 at 2: .previous is read
try:
    fastload.fit_many(sys.argv[1], {runs!r}, resume=folder, max_steps=6, **{options!r})
except ValueError as exc:
    print(exc)
"""


def test_a_groups_previous_checkpoint_that_is_a_named_pipe_is_refused_without_blocking(store_path, tmp_path):
    script = GROUP_WITH_A_PIPE.format(runs=RUNS, options=EVERY_2)
    child = subprocess.run(
        [sys.executable, "-c", script, os.fspath(store_path), os.fspath(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    previous = tmp_path / "run0.ckpt.previous"
    assert child.stdout == f"{previous}: not a regular file (a named pipe); the checkpoint must be a file\n"


def test_an_empty_checkpoint_is_named_as_empty(store_path, tmp_path, capsys):
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    argv = ["train", os.fspath(store_path), "--device", "cpu", "--resume", os.fspath(empty)]
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == (
        f"fastload train: error: {empty}: an empty file, not a fastload training checkpoint; "
        "resume from a file --checkpoint wrote\n"
    )


class _MakesAFolder:
    """Unpickled by a full pickle load, it creates a folder: code a checkpoint must not run."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_checkpoint_carrying_code_is_refused_without_running_it(tmp_path):
    ran = tmp_path / "ran"
    hostile = tmp_path / "code.ckpt"
    torch.save({"format": "fastload-train-checkpoint-1", "payload": _MakesAFolder(os.fspath(ran))}, hostile)
    with pytest.raises(ValueError) as refused:
        load_checkpoint(hostile)
    assert not ran.exists()
    # One line, and not torch's advice to load it with weights_only=False (which runs the code).
    assert str(refused.value) == (
        f"{hostile}: not a readable fastload training checkpoint (it holds more than tensors and plain "
        "values, or is no torch file); resume from a file --checkpoint wrote"
    )


def test_a_checkpoint_written_on_a_gpu_loads_onto_the_cpu(saved_mid_epoch, tmp_path):
    """Its tensors are tagged "cuda:0" (as a GPU run saves them): they load onto the CPU, on a
    machine with or without CUDA."""
    buffer = io.BytesIO()
    torch.save(torch.load(saved_mid_epoch, weights_only=True), buffer, _use_new_zipfile_serialization=False)
    on_cpu = buffer.getvalue()
    tag = b"X\x03\x00\x00\x00cpu"  # the storages' location (and the config's device), as pickled
    assert tag in on_cpu
    from_gpu = tmp_path / "gpu.ckpt"
    from_gpu.write_bytes(on_cpu.replace(tag, b"X\x06\x00\x00\x00cuda:0"))
    loaded = load_checkpoint(from_gpu)
    assert loaded["step"] == 7 and all(t.device.type == "cpu" for t in loaded["model"].values())


def test_a_resume_that_is_no_path_is_named(store_path):
    with pytest.raises(TypeError) as err:
        fit(store_path, resume=123, **SHARED)
    assert str(err.value) == "resume must be a str or os.PathLike, not int"


STORE_A = {"path": "a.fastload", "fingerprint": "1"}
STORE_B = {"path": "b.fastload", "fingerprint": "2"}


def test_check_same_stores_compares_each_store_and_says_which_is_missing():
    both = {"store": STORE_A, "validation store": STORE_B}
    check_same_stores("r.ckpt", {"stores": both}, dict(both))
    with pytest.raises(ValueError) as err:
        check_same_stores("r.ckpt", {"stores": both}, {"store": STORE_A, "validation store": None})
    assert str(err.value) == "r.ckpt: the checkpoint was written for a run with a validation store"
    with pytest.raises(ValueError) as err:
        check_same_stores("r.ckpt", {"stores": {"store": STORE_A, "validation store": None}}, both)
    assert str(err.value) == "r.ckpt: the checkpoint was written for a run without a validation store"
    with pytest.raises(ValueError) as err:  # one store absent from both sides: the next is still compared
        check_same_stores("r.ckpt", {"stores": {"x": None, "y": STORE_A}}, {"x": None, "y": STORE_B})
    assert str(err.value) == (
        "r.ckpt: the checkpoint was trained on the y a.fastload, and b.fastload holds different records; "
        "resume with the store it was trained on"
    )
