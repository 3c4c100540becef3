"""`fastload.train.fit` and `fastload train` end to end: metrics, learning, the models they
build, augmentation, the command line and its answers to bad input."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
import train_helpers
from train_helpers import FAST, STEPS_PER_EPOCH, UNWRITABLE_DIR, parameter_copies, run_cli, train_argv

import fastload.train as train_mod
from fastload import cli
from fastload import inspect as inspect_mod
from fastload.augment import Augment
from fastload.monotonic import check_monotone
from fastload.store import Store, StoreWriter
from fastload.train import fit, prepare_images

store_path, exposure_path = train_helpers.store_path, train_helpers.exposure_path  # module fixtures


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


def test_worker_processes_train_the_same_model(store_path):
    # The epoch order depends on (seed, epoch) only, never on the number of workers.
    options = dict(epochs=1, deterministic=True, **FAST)
    rust_threads, processes = fit(store_path, **options), fit(store_path, workers=2, **options)
    a, b = parameter_copies(rust_threads.model), parameter_copies(processes.model)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_monotone_inputs_reach_a_monotone_model(store_path, exposure_path):
    result = fit(store_path, epochs=1, monotone_inputs=exposure_path, **FAST)
    assert result.model.num_monotone == 1
    images = torch.from_numpy(Store(store_path).gather(result.val_indices)[0])
    exposure = torch.from_numpy(np.load(exposure_path)[result.val_indices, None].astype(np.float32))
    assert check_monotone(result.model, prepare_images(images, result.config, "cpu"), exposure) <= 1e-6


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


def test_an_augment_from_a_spec_trains_as_the_spec(store_path):
    """fit takes the Augment that Augment.from_spec returns (as the command line has it, parsed)
    in place of its spec: the same model, the same config."""
    options = dict(epochs=1, max_steps=3, size=12, **FAST)
    by_spec = fit(store_path, augment="flip", **options)
    by_object = fit(store_path, augment=Augment.from_spec("flip"), **options)
    plain = fit(store_path, **options)
    a, b = parameter_copies(by_spec.model), parameter_copies(by_object.model)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert by_object.config == by_spec.config and by_object.config["augment"] == "flip"
    unflipped = parameter_copies(plain.model)
    assert not all(torch.equal(a[name], unflipped[name]) for name in a)


@pytest.mark.safety
def test_cli_answers_memory_error_with_a_message(store_path, monkeypatch, capsys):
    monkeypatch.setattr(inspect_mod, "info", lambda path: np.empty(2**62, np.uint8))
    status, err, out = run_cli(["info", os.fspath(store_path)], capsys)
    assert status == 1 and err.startswith("fastload info: error: out of memory: Unable to allocate")
    monkeypatch.setattr(train_mod, "fit", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    status, err, out = run_cli(train_argv(store_path), capsys)
    assert status == 1 and err == "fastload train: error: out of memory\n"


@pytest.mark.safety
@pytest.mark.skipif(not os.path.isdir(UNWRITABLE_DIR), reason="needs /sys")
def test_cli_unwritable_json_log_fails_before_the_first_epoch(store_path, capsys):
    log = os.path.join(UNWRITABLE_DIR, "log.jsonl")
    status, err, out = run_cli(train_argv(store_path, "--json-log", log), capsys)
    assert status == 1 and log in err and "epoch" not in out
