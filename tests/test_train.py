"""`fastload.train.fit` and `fastload train`: metrics, learning, exact resume, bad input."""

from __future__ import annotations

import json
import math
import os
import sys
import time

import numpy as np
import pytest
import torch

import fastload
from fastload import cli
from fastload.monotonic import check_monotone
from fastload.store import Store, StoreWriter
from fastload.train import TrainConfig, Trainer, fit, prepare_images
from fastload.train.data import DataStream, open_data
from fastload.train.models import MonotonicClassifier, MonotonicRegressor, channels_last_convolutions

COUNT, SIDE = 200, 16
# One intra-op thread: the model is tiny, and on a busy 2-core machine every OpenMP region
# otherwise waits for a descheduled thread (tens of times slower).
FAST = dict(batch_size=16, lr=3e-2, device="cpu", threads=1)
STEPS_PER_EPOCH = math.ceil(180 / 16)  # 10% of the 200 records are held out for validation


def _images_and_labels(seed: int = 0, count: int = COUNT, side: int = SIDE):
    rng = np.random.default_rng(seed)
    gain = rng.uniform(0.1, 1.0, count)
    images = (rng.uniform(0, 255, (count, side, side, 3)) * gain[:, None, None, None]).astype(np.uint8)
    return images, images.reshape(count, -1).mean(1) / 255.0  # label: mean brightness


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("train") / "bright.fastload"
    images, labels = _images_and_labels()
    with StoreWriter(path, (SIDE, SIDE, 3)) as writer:
        writer.extend(images, labels)
    return path


@pytest.fixture(scope="module")
def exposure_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("inputs") / "exposure.npy"
    np.save(path, np.random.default_rng(1).uniform(0, 1, COUNT))
    return path


def test_fit_reports_finite_metrics_and_learns(store_path):
    logged = []
    result = fit(store_path, epochs=3, log=logged.append, **FAST)
    assert result.completed and len(result.history) == 3 and logged == result.history
    for metrics in result.history:
        for key in ("train_loss", "val_mae", "val_rmse", "images_per_s", "data_wait_fraction", "seconds"):
            assert math.isfinite(metrics[key]), key
        assert metrics["images_per_s"] > 0 and 0 <= metrics["data_wait_fraction"] <= 1
        assert metrics["device"] == "cpu" and "gpu_max_memory_bytes" not in metrics
    losses = [m["train_loss"] for m in result.history]
    assert losses[-1] < losses[0]
    assert result.history[-1]["val_rmse"] < result.baseline_rmse
    assert result.steps == 3 * STEPS_PER_EPOCH and len(result.val_indices) == 20


def test_output_range_starts_from_the_labels(store_path):
    result = fit(store_path, epochs=1, max_steps=1, **FAST)
    labels = np.asarray(Store(store_path).labels)
    low, high = result.config["output_range"]
    assert low < labels.min() and high > labels.max() and high - low < 2 * np.ptp(labels)


def _parameters(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def straight_run(store_path, exposure_path):
    return fit(store_path, epochs=2, monotone_inputs=exposure_path, deterministic=True, **FAST)


# Stopped in the middle of epoch 1, and after the last batch of epoch 0 but before its validation.
@pytest.mark.parametrize("stop_after", [STEPS_PER_EPOCH + STEPS_PER_EPOCH // 2, STEPS_PER_EPOCH])
def test_resume_gives_identical_parameters(stop_after, straight_run, store_path, exposure_path, tmp_path):
    options = dict(epochs=2, monotone_inputs=exposure_path, deterministic=True, **FAST)
    ckpt = tmp_path / "run.ckpt"
    stopped = fit(store_path, checkpoint=ckpt, max_steps=stop_after, **options)
    assert not stopped.completed and stopped.steps == stop_after
    assert len(stopped.history) == (stop_after - 1) // STEPS_PER_EPOCH  # epochs validated before the stop
    assert [p.name for p in tmp_path.iterdir()] == ["run.ckpt"]  # no partial files left behind
    # Disturb the global RNGs: resuming must restore them.
    torch.manual_seed(1234)
    np.random.seed(99)
    resumed = fit(store_path, resume=ckpt, checkpoint=ckpt, **options)
    assert resumed.completed and resumed.steps == straight_run.steps

    # CPU kernels are deterministic here, and the resumed run replays exactly the remaining
    # batches with the same optimizer, BatchNorm and RNG state: bitwise equality, no tolerance.
    a, b = _parameters(straight_run.model), _parameters(resumed.model)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert len(resumed.history) == len(straight_run.history) == 2
    for straight, again in zip(straight_run.history, resumed.history):
        assert [straight[k] for k in ("train_loss", "val_rmse", "val_mae")] == [
            again[k] for k in ("train_loss", "val_rmse", "val_mae")
        ]


def test_a_checkpoint_from_before_tasks_resumes_as_the_regression_it_was(
    straight_run, store_path, exposure_path, tmp_path
):
    """Checkpoints written before classification existed have no "task" in their config."""
    options = dict(epochs=2, monotone_inputs=exposure_path, deterministic=True, **FAST)
    ckpt = tmp_path / "old.ckpt"
    fit(store_path, checkpoint=ckpt, max_steps=STEPS_PER_EPOCH + 3, **options)
    old = torch.load(ckpt, weights_only=True)
    del old["config"]["task"]
    torch.save(old, ckpt)
    resumed = fit(store_path, resume=ckpt, checkpoint=ckpt, **options)
    assert resumed.task == "regression" and resumed.steps == straight_run.steps
    a, b = _parameters(straight_run.model), _parameters(resumed.model)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert torch.load(ckpt, weights_only=True)["config"]["task"] == "regression"


def test_worker_processes_train_the_same_model(store_path):
    # The epoch order depends on (seed, epoch) only, never on the number of workers.
    options = dict(epochs=1, deterministic=True, **FAST)
    rust_threads, processes = fit(store_path, **options), fit(store_path, workers=2, **options)
    a, b = _parameters(rust_threads.model), _parameters(processes.model)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_monotone_inputs_reach_a_monotone_model(store_path, exposure_path):
    result = fit(store_path, epochs=1, monotone_inputs=exposure_path, **FAST)
    assert result.model.num_monotone == 1
    images = torch.from_numpy(Store(store_path).gather(result.val_indices)[0])
    exposure = torch.from_numpy(np.load(exposure_path)[result.val_indices, None].astype(np.float32))
    assert check_monotone(result.model, prepare_images(images, result.config, "cpu"), exposure) <= 1e-6


def test_size_downscales_on_the_device_and_progress_draws_a_bar(store_path, capsys):
    result = fit(store_path, epochs=1, max_steps=1, size=8, progress=True, **FAST)
    batch = torch.zeros(2, SIDE, SIDE, 3, dtype=torch.uint8)
    assert prepare_images(batch, result.config, "cpu").shape == (2, 3, 8, 8)
    err = capsys.readouterr().err
    assert "epoch 1/1 " in err and f" 1/{STEPS_PER_EPOCH} steps [" in err and "loss " in err


class PausedBatches:
    """A training loader whose every batch takes `pause()` inside `next()`: a run the data
    stream holds back."""

    def __init__(self, loader, pause):
        self.loader, self.pause = loader, pause

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            self.pause()
            yield batch


def _data_bound(monkeypatch, pause, step):
    """Makes fit's training batches wait in `pause()` and its training step only call `step()`."""
    make_stream = DataStream.__init__

    def paused_stream(self, config, data):
        make_stream(self, config, data)
        self.train_batches.source = PausedBatches(self.train_batches.source, pause)

    monkeypatch.setattr(DataStream, "__init__", paused_stream)
    monkeypatch.setattr(Trainer, "train_step", lambda self, x, y, m, meter: step())


def test_a_run_that_waits_for_its_data_reports_a_data_wait_near_1(store_path, monkeypatch):
    """The figure that tells a user the loader is the bottleneck: a stream that sleeps in
    `next()` while the step does nothing. 12 batches of 0.1 s: the figure falls to 0.8 only if
    the rest of the epoch takes 0.3 s, where it takes milliseconds (no tight timing)."""
    _data_bound(monkeypatch, pause=lambda: time.sleep(0.1), step=lambda: None)
    result = fit(store_path, epochs=1, **FAST)
    assert result.history[-1]["data_wait_fraction"] > 0.8


class StoppedClock:
    """`time.perf_counter` that only moves when told (`advance`)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def test_data_wait_fraction_is_the_time_waited_for_batches_over_the_epochs_time(store_path, monkeypatch):
    """With a stubbed clock, each batch waits 0.75 s in `next()` and each step takes 0.25 s,
    nothing else takes time: the figure is exactly the wait over the epoch's seconds, epoch after
    epoch (dyadic numbers, so the sums are exact)."""
    clock = StoppedClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    steps = []

    def step():
        clock.advance(0.25)
        steps.append(clock.now)

    _data_bound(monkeypatch, pause=lambda: clock.advance(0.75), step=step)
    result = fit(store_path, epochs=2, batch_size=32, device="cpu", threads=1, progress=False)
    batches = math.ceil(180 / 32)
    assert len(steps) == 2 * batches
    for metrics in result.history:
        assert metrics["seconds"] == batches * (0.75 + 0.25)
        assert metrics["data_wait_fraction"] == batches * 0.75 / metrics["seconds"] == 0.75


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_with_bf16_reports_gpu_memory(store_path):
    result = fit(store_path, epochs=1, batch_size=16, device="cuda", amp="bf16")
    metrics = result.history[-1]
    assert metrics["device"].startswith("cuda") and metrics["gpu_max_memory_bytes"] > 0
    assert math.isfinite(metrics["val_rmse"]) and 0 <= metrics["data_wait_fraction"] <= 1


@pytest.mark.parametrize(
    "model", [MonotonicRegressor(), MonotonicClassifier(3)], ids=["regressor", "classifier"]
)
def test_the_cuda_layout_reorders_the_convolutions_only(model):
    # On CUDA the trainer stores its model channels_last. model.to(memory_format=channels_last)
    # refused the default model's 5-d lattice vertices (4 x 3 x 3 x 3 x 3), so every CUDA run,
    # `fastload train --runs 4 --device cuda` included, failed before its first step (#25).
    model.eval()
    x = torch.rand(4, 3, SIDE, SIDE)
    before = model(x)
    assert channels_last_convolutions(model) is model
    convolutions = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convolutions and all(w.is_contiguous(memory_format=torch.channels_last) for w in convolutions)
    others = [p for p in model.parameters() if all(p is not w for w in convolutions)]
    assert any(p.dim() == 5 for p in others) and all(p.is_contiguous() for p in others)
    torch.testing.assert_close(model(x), before)


# ---------------------------------------------------------------- bad input


def test_empty_validation_split_is_refused(store_path):
    with pytest.raises(ValueError, match="validation split .* is empty"):
        fit(store_path, val_fraction=0.001, **FAST)


def test_monotone_inputs_of_the_wrong_length_are_refused(store_path, tmp_path):
    short = tmp_path / "short.npy"
    np.save(short, np.zeros(COUNT - 1))
    with pytest.raises(ValueError, match=rf"short\.npy: {COUNT - 1} rows .* store of {COUNT} records"):
        fit(store_path, monotone_inputs=short, **FAST)


def test_cuda_without_cuda_is_refused(store_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        fit(store_path, **{**FAST, "device": "cuda"})


def test_resume_with_different_options_is_refused(store_path, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=ckpt, max_steps=1, **FAST)
    with pytest.raises(ValueError, match="differs in: batch_size"):
        fit(store_path, resume=ckpt, **{**FAST, "batch_size": 8})


def test_resnet18_without_torchvision_says_how_to_get_it(store_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    with pytest.raises(fastload.MissingDependencyError, match="needs torchvision.*pip install torchvision"):
        fit(store_path, backbone="resnet18", **FAST)


# ---------------------------------------------------------------- command line


def test_cli_prints_json_lines_and_writes_a_checkpoint(store_path, tmp_path, capsys):
    ckpt, log = tmp_path / "cli.ckpt", tmp_path / "log.jsonl"
    argv = ["train", os.fspath(store_path), "--epochs", "2", "--batch-size", "16", "--device", "cpu"]
    argv += ["--threads", "1", "--json", "--json-log", os.fspath(log), "--checkpoint", os.fspath(ckpt)]
    assert cli.main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [m["epoch"] for m in lines] == [1, 2]
    assert {"train_loss", "val_mae", "val_rmse", "images_per_s", "data_wait_fraction"} <= lines[0].keys()
    assert [json.loads(line) for line in log.read_text().splitlines()] == lines
    assert torch.load(ckpt, weights_only=True)["epoch"] == 2


@pytest.mark.parametrize("problem", ["float64 classified", "wrong length", "cuda"])
def test_cli_bad_input_exits_1_without_traceback(problem, store_path, tmp_path, capsys, monkeypatch):
    argv = ["train", os.fspath(store_path), "--device", "cpu"]
    if problem == "float64 classified":
        argv += ["--task", "classification"]
    elif problem == "wrong length":
        np.save(tmp_path / "m.npy", np.zeros(3))
        argv += ["--monotone-inputs", os.fspath(tmp_path / "m.npy")]
    else:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        argv[-1] = "cuda"
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("fastload train: error: ") and "Traceback" not in err


def test_augmented_training_is_deterministic_and_a_bad_spec_is_refused(tmp_path):
    """`augment` changes what the model sees in training (so the weights), the same way on
    every run with the same seeds; a bad spec is refused before any data is read."""
    path = tmp_path / "s.fl"
    rng = np.random.default_rng(0)
    with StoreWriter(path, (16, 16, 3)) as w:
        w.extend(rng.integers(0, 255, (40, 16, 16, 3), dtype=np.uint8), rng.random(40))
    common = dict(epochs=2, batch_size=8, device="cpu", progress=False, backbone="small-cnn", size=12)

    def weights(augment):
        result = fit(path, augment=augment, **common)
        return torch.cat([p.detach().flatten() for p in result.model.parameters()]), result

    plain, _ = weights("")
    first, result = weights("crop=0.5,flip,jitter")
    again, _ = weights("crop=0.5,flip,jitter")
    assert torch.equal(first, again) and not torch.equal(first, plain)
    assert result.config["augment"] == "crop=0.5,flip,jitter"
    with pytest.raises(ValueError, match="unknown augmentation 'spin'"):
        fit(tmp_path / "missing.fl", augment="spin", **common)
    with pytest.raises(SystemExit) as usage:
        cli.main(["train", str(path), "--augment", "spin"])
    assert usage.value.code == 2


# ---------------------------------------------------------------- a last batch of one record

# 81 training records in batches of 8 leave one record over, and 8x8 images leave the small CNN's
# last BatchNorm one value per channel: a batch of that record alone cannot be trained on.
LONE_COUNT, LONE_SIDE, LONE_STEPS = 90, 8, 10
LONE = dict(batch_size=8, device="cpu", threads=1, deterministic=True, progress=False)


@pytest.fixture(scope="module")
def lone_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("lone") / "lone.fastload"
    images, labels = _images_and_labels(3, LONE_COUNT, LONE_SIDE)
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
    a, b = _parameters(lone_straight_run.model), _parameters(resumed.model)
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
    images, labels = _images_and_labels(count=1)
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
    images, _ = _images_and_labels(count=20)
    with StoreWriter(unlabelled, (SIDE, SIDE, 3), label_dtype="int64", meta={"labels": "none"}) as writer:
        writer.extend(images, np.zeros(20, dtype=np.int64))
    assert not Store(unlabelled).labelled
    with pytest.raises(ValueError, match=r"unlabelled.fastload has no labels \(packed with --no-labels"):
        fit(unlabelled, **FAST)
    assert cli.main(["train", str(unlabelled), "--device", "cpu"]) == 1
    assert "has no labels" in capsys.readouterr().err
