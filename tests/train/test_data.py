"""The training data (train/data.py): the split, its checks, and the batches of each epoch
(never a training batch of one record, which BatchNorm cannot train on)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import train_helpers
from monotone_helpers import step_piece
from train_helpers import COUNT, FAST, SIDE, images_and_labels, parameter_copies

from fastload import cli
from fastload.augment import Augment
from fastload.device import DeviceLoader
from fastload.store import Store, StoreWriter
from fastload.train import TrainConfig, build_model, fit
from fastload.train import data as train_data
from fastload.train.checkpoint import load_checkpoint
from fastload.train.data import DataStream, open_data
from fastload.train.models import NUM_KEYPOINTS

store_path = train_helpers.store_path  # the 200-record store of tests/train_helpers.py, as a fixture here


# 81 training records in batches of 8 leave one record over, and 8x8 images leave the small CNN's
# last BatchNorm one value per channel: a batch of that record alone cannot be trained on.
LONE_COUNT, LONE_SIDE, LONE_STEPS = 90, 8, 10


LONE = dict(batch_size=8, device="cpu", threads=1, deterministic=True, progress=False)


@pytest.fixture(scope="module")
def lone_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("lone") / "lone.fastload"
    images, labels = images_and_labels(3, LONE_COUNT, LONE_SIDE)
    with StoreWriter(path, images.shape[1:]) as writer:
        writer.extend(images, labels)
    return path


def _epoch_records(path, epochs):
    """The records of each training batch of each epoch, as fit's stream cuts them."""
    config = TrainConfig(path, **LONE)
    data = open_data(config, None)
    stream = DataStream(config, data)
    epochs_seen = []
    for epoch in range(epochs):
        stream.train_ds.set_epoch(epoch)
        epochs_seen.append([indices.tolist() for _, _, indices in stream.train_ds])
    return data.train_indices, epochs_seen


def test_a_lone_last_record_stays_out_of_its_epoch_another_one_each_epoch(lone_path):
    train_indices, epochs = _epoch_records(lone_path, 3)
    left_out = []
    for batches in epochs:
        assert [len(b) for b in batches] == [8] * LONE_STEPS
        seen = sum(batches, [])
        (missing,) = set(train_indices.tolist()) - set(seen)
        left_out.append(missing)
    assert len(set(left_out)) > 1  # the epoch's order decides which one
    assert _epoch_records(lone_path, 3)[1] == epochs  # and it is the same on every run


@pytest.fixture(scope="module")
def lone_straight_run(lone_path):
    return fit(lone_path, epochs=2, **LONE)


def test_fit_trains_a_store_whose_last_batch_would_hold_one_record(lone_straight_run):
    assert lone_straight_run.completed and lone_straight_run.steps == 2 * LONE_STEPS
    assert all(math.isfinite(m["val_rmse"]) for m in lone_straight_run.history)


# In the middle of epoch 2, and after epoch 1's last batch but before its validation.
@pytest.mark.parametrize("stop_after", [LONE_STEPS + 4, LONE_STEPS])
def test_resume_past_a_dropped_record_gives_identical_parameters(
    lone_straight_run, lone_path, tmp_path, stop_after
):
    ckpt = tmp_path / "run.ckpt"
    fit(lone_path, epochs=2, checkpoint=ckpt, max_steps=stop_after, **LONE)
    resumed = fit(lone_path, epochs=2, resume=ckpt, **LONE)
    assert resumed.steps == lone_straight_run.steps
    a, b = parameter_copies(lone_straight_run.model), parameter_copies(resumed.model)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_cli_trains_a_store_whose_last_batch_would_hold_one_record(lone_path, capsys):
    argv = ["train", os.fspath(lone_path), "--epochs", "1", "--batch-size", "8", "--device", "cpu"]
    assert cli.main(argv + ["--threads", "1", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["step"] == LONE_STEPS


def test_a_training_split_of_one_record_is_refused(lone_path):
    with pytest.raises(ValueError, match="1 training record.* batches of one record"):
        fit(lone_path, **{**LONE, "val_fraction": (LONE_COUNT - 1) / LONE_COUNT})


def test_a_store_of_one_record_says_two_are_needed(tmp_path, capsys):
    path = tmp_path / "one.fastload"
    images, labels = images_and_labels(count=1)
    with StoreWriter(path, (SIDE, SIDE, 3)) as writer:
        writer.extend(images, labels)
    with pytest.raises(
        ValueError, match=r"has 1 record\(s\); training with a validation split needs at least 2"
    ):
        fit(path, **FAST)
    assert cli.main(["train", str(path), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "needs at least 2" in err and "raise val_fraction" not in err


def test_a_store_packed_without_labels_is_refused(tmp_path, capsys):
    unlabelled = tmp_path / "unlabelled.fastload"
    images, _ = images_and_labels(count=20)
    with StoreWriter(unlabelled, (SIDE, SIDE, 3), label_dtype="int64", meta={"labels": "none"}) as writer:
        writer.extend(images, np.zeros(20, dtype=np.int64))
    assert not Store(unlabelled).labelled
    with pytest.raises(ValueError, match=r"unlabelled.fastload has no labels \(packed with --no-labels"):
        fit(unlabelled, **FAST)
    assert cli.main(["train", str(unlabelled), "--device", "cpu"]) == 1
    assert "has no labels" in capsys.readouterr().err


def test_empty_validation_split_is_refused(store_path):
    with pytest.raises(ValueError, match="validation split .* is empty"):
        fit(store_path, val_fraction=0.001, **FAST)


def test_monotone_inputs_of_the_wrong_length_are_refused(store_path, tmp_path):
    short = tmp_path / "short.npy"
    np.save(short, np.zeros(COUNT - 1))
    with pytest.raises(ValueError, match=rf"short\.npy: {COUNT - 1} rows .* store of {COUNT} records"):
        fit(store_path, monotone_inputs=short, **FAST)


@pytest.mark.safety
def test_monotone_inputs_that_are_a_named_pipe_are_refused_without_blocking(store_path, tmp_path):
    fifo = tmp_path / "exposure.npy"
    os.mkfifo(fifo)
    argv = ["train", os.fspath(store_path), "--device", "cpu", "--monotone-inputs", os.fspath(fifo)]
    child = subprocess.run(
        [sys.executable, "-m", "fastload", *argv], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 1
    assert child.stderr == (
        f"fastload train: error: {fifo}: not a regular file (a named pipe); the monotone inputs file must be a file\n"
    )


@pytest.mark.safety
def test_monotone_inputs_whose_header_claims_more_than_the_file_holds_are_refused(store_path, tmp_path):
    """np.load allocates the shape a header declares (here 2**40 float64 values, 8 TB)
    before it reads a byte of them."""
    lying = tmp_path / "lying.npy"
    with open(lying, "wb") as f:
        header = {"descr": "<f8", "fortran_order": False, "shape": (2**40,)}
        np.lib.format.write_array_header_1_0(f, header)
        f.write(np.zeros(COUNT).tobytes())
    with pytest.raises(ValueError) as refused:
        fit(store_path, monotone_inputs=lying, **FAST)
    assert str(refused.value) == (
        f"{lying}: its header declares (1099511627776,) values of float64 (8,796,093,022,208 bytes), "
        f"but the file holds {8 * COUNT:,} bytes of values; write it again with np.save"
    )


@pytest.mark.safety
def test_monotone_inputs_holding_python_objects_are_refused_as_such(store_path, tmp_path):
    pickled = tmp_path / "objects.npy"
    np.save(pickled, np.array([object()] * COUNT, dtype=object), allow_pickle=True)
    with pytest.raises(ValueError) as refused:
        fit(store_path, monotone_inputs=pickled, **FAST)
    assert (
        str(refused.value)
        == f"{pickled}: it holds Python objects (a pickle), not numbers; save an array of numbers"
    )


def test_the_stream_augments_at_the_runs_size_and_data_seed(store_path, monkeypatch):
    """The config's Augment, parsed once, is bound to the run's size and data seed: the same
    augmentation as one parsed with them, for the training batches only."""
    given = []

    def recording_loader(source, device, augment=None, **normalized):
        given.append(augment)
        return DeviceLoader(source, device, augment=augment, **normalized)

    monkeypatch.setattr(train_data, "DeviceLoader", recording_loader)
    config = TrainConfig(store_path, augment="crop=0.5, flip", size=12, data_seed=7, **FAST)
    DataStream(config, open_data(config, None))
    training, validation = given
    assert vars(training) == vars(Augment.from_spec("crop=0.5, flip", size=12, seed=7)) and validation is None
    assert config.augment.size is None and config.augment.seed == 0  # the config's is left as it was


# ---------------------------------------------------------------- monotone-input keypoints


# Labels that step by 2 where the monotone input passes STEP_AT, whatever the (noise) images:
# 540 training records give place_keypoints 16 bins along the input.
STEP_AT, STEP_COUNT, STEP_SIDE = 0.37, 600, 4
STEP = dict(batch_size=32, lr=3e-2, device="cpu", threads=1, progress=False)


@pytest.fixture(scope="module")
def step_store(tmp_path_factory):
    """(store, its monotone inputs' .npy) of labels with a step in the monotone input."""
    folder = tmp_path_factory.mktemp("step")
    rng = np.random.default_rng(0)
    inputs = rng.uniform(0, 1, STEP_COUNT).astype(np.float32)
    labels = 2.0 * (inputs > STEP_AT) + rng.normal(0, 0.05, STEP_COUNT)
    images = rng.integers(0, 256, (STEP_COUNT, STEP_SIDE, STEP_SIDE, 3), dtype=np.uint8)
    with StoreWriter(folder / "step.fastload", (STEP_SIDE, STEP_SIDE, 3)) as writer:
        writer.extend(images, labels)
    np.save(folder / "m.npy", inputs)
    return folder / "step.fastload", folder / "m.npy"


def even_keypoints(columns, target, counts, seed):
    """What the image models had before keypoints were placed: even ones over each range."""
    return [np.linspace(c.min(), c.max(), n).tolist() for c, n in zip(columns, counts)]


def input_keypoints(model):
    return [c.keypoints.tolist() for c in model.input_calibrators]


def test_keypoints_bracket_a_step_in_the_labels_and_the_checkpoint_rebuilds_them(step_store, tmp_path):
    store, inputs = step_store
    result = fit(store, monotone_inputs=inputs, epochs=1, checkpoint=tmp_path / "run.ckpt", **STEP)
    (placed,) = result.config["monotone_input_keypoints"]
    assert len(placed) == NUM_KEYPOINTS and step_piece(placed, STEP_AT) < 0.04
    ((low, high),) = result.config["monotone_input_range"]
    assert step_piece(np.linspace(low, high, NUM_KEYPOINTS), STEP_AT) > 0.1  # even keypoints: a ninth
    saved = load_checkpoint(tmp_path / "run.ckpt")["config"]
    assert saved["monotone_input_keypoints"] == [placed]
    assert input_keypoints(build_model(saved)) == input_keypoints(result.model) == [placed]


def test_a_checkpoint_from_before_placed_keypoints_builds_and_resumes_on_even_ones(step_store, tmp_path):
    store, inputs = step_store
    fit(store, monotone_inputs=inputs, epochs=1, max_steps=3, checkpoint=tmp_path / "run.ckpt", **STEP)
    older = torch.load(tmp_path / "run.ckpt", weights_only=True)
    older["config"].pop("monotone_input_keypoints")
    torch.save(older, tmp_path / "older.ckpt")
    ((low, high),) = older["config"]["monotone_input_range"]
    even = [torch.linspace(low, high, NUM_KEYPOINTS).tolist()]
    assert input_keypoints(build_model(older["config"])) == even
    resumed = fit(store, monotone_inputs=inputs, epochs=1, resume=tmp_path / "older.ckpt", **STEP)
    assert resumed.completed and "monotone_input_keypoints" not in resumed.config
    assert input_keypoints(resumed.model) == even


def test_placed_keypoints_learn_a_step_better_than_even_ones(step_store, monkeypatch):
    """Six epochs, one seed for both: measured over seeds 0-9, placed keypoints ended with 0.52
    to 0.74 times the even ones' validation RMSE (0.63 for seed 0)."""
    store, inputs = step_store
    placed = fit(store, monotone_inputs=inputs, epochs=6, **STEP)
    monkeypatch.setattr(train_data, "place_keypoints", even_keypoints)
    even = fit(store, monotone_inputs=inputs, epochs=6, **STEP)
    assert step_piece(even.config["monotone_input_keypoints"][0], STEP_AT) > 0.1
    assert placed.history[-1]["val_rmse"] < 0.8 * even.history[-1]["val_rmse"]
