"""One model's `Trainer` (train/trainer.py): a checkpoint holds what resumes the run exactly,
a resume is checked against the run, mixed precision, and a model that stops being finite."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch
import train_helpers
from train_helpers import FAST, ONE_STEP, SIDE, STEPS_PER_EPOCH, images_and_labels, parameter_copies

import fastload.train.config as train_config
from fastload.augment import Augment
from fastload.store import StoreWriter
from fastload.train import fit

store_path = train_helpers.store_path  # the 200-record store of tests/train_helpers.py, as a fixture here
exposure_path = train_helpers.exposure_path


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
    a, b = parameter_copies(straight_run.model), parameter_copies(resumed.model)
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
    a, b = parameter_copies(straight_run.model), parameter_copies(resumed.model)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert torch.load(ckpt, weights_only=True)["config"]["task"] == "regression"


def test_resume_with_different_options_is_refused(store_path, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=ckpt, max_steps=1, **FAST)
    with pytest.raises(ValueError, match="differs in: batch_size"):
        fit(store_path, resume=ckpt, **{**FAST, "batch_size": 8})


def test_a_checkpoint_records_the_augment_spec_and_a_resume_with_another_is_refused(store_path, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=ckpt, augment="flip", **ONE_STEP)
    assert torch.load(ckpt, weights_only=True)["config"]["augment"] == "flip"
    two_steps = {**ONE_STEP, "max_steps": 2}
    resumed = fit(store_path, resume=ckpt, checkpoint=ckpt, augment=Augment.from_spec("flip"), **two_steps)
    assert resumed.steps == 2 and resumed.config["augment"] == "flip"
    with pytest.raises(ValueError, match="differs in: augment"):
        fit(store_path, resume=ckpt, augment="crop", **{**ONE_STEP, "max_steps": 3})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_with_bf16_reports_gpu_memory(store_path):
    result = fit(store_path, epochs=1, batch_size=16, device="cuda", amp="bf16")
    metrics = result.history[-1]
    assert metrics["device"].startswith("cuda") and metrics["gpu_max_memory_bytes"] > 0
    assert math.isfinite(metrics["val_rmse"]) and 0 <= metrics["data_wait_fraction"] <= 1


@pytest.mark.safety
def test_resuming_into_the_same_checkpoint_is_allowed(store_path, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=ckpt, **ONE_STEP)
    resumed = fit(store_path, resume=ckpt, checkpoint=ckpt, **{**ONE_STEP, "max_steps": 2})
    assert resumed.steps == 2 and torch.load(ckpt, weights_only=True)["step"] == 2


@pytest.mark.safety
def test_a_diverging_run_says_so(store_path, monkeypatch):
    # Past the bound on lr (lifted here), the weights overflow and the lattice indexes with NaN.
    monkeypatch.setattr(train_config, "MAX_LR", 1e31)
    with pytest.raises(
        ValueError, match=r"step \d+ \(learning rate [^)]+\): non-finite parameters .*lower the"
    ):
        fit(store_path, epochs=1, **{**FAST, "lr": 1e30})


@pytest.mark.safety
def test_resume_on_a_store_with_other_records_is_refused(store_path, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=ckpt, **ONE_STEP)
    other = tmp_path / "other.fastload"
    images, labels = images_and_labels(seed=1)
    with StoreWriter(other, (SIDE, SIDE, 3)) as writer:  # same shape, count and label dtype
        writer.extend(images, labels)
    message = rf"trained on the store {store_path}, and {other} holds different records"
    with pytest.raises(ValueError, match=message):
        fit(other, resume=ckpt, **{**ONE_STEP, "max_steps": 2})


@pytest.mark.safety
def test_resume_on_a_copy_of_the_store_continues(store_path, tmp_path):
    ckpt, copy = tmp_path / "run.ckpt", tmp_path / "copy.fastload"
    fit(store_path, checkpoint=ckpt, **ONE_STEP)
    shutil.copy(store_path, copy)  # the fingerprint is of the records, not of the path
    assert fit(copy, resume=ckpt, **{**ONE_STEP, "max_steps": 2}).steps == 2


@pytest.mark.safety
def test_resume_with_a_validation_store_the_run_did_not_have_is_refused(store_path, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=ckpt, **ONE_STEP)
    with pytest.raises(ValueError, match="written for a run without a validation store"):
        fit(store_path, val=store_path, resume=ckpt, **{**ONE_STEP, "max_steps": 2})
