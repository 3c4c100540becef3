"""The epoch loop (train/loop.py): the progress bar and data-wait figure of each epoch, save
points that never write a diverged model, and checkpoint files written whole or not at all."""

from __future__ import annotations

import errno
import fcntl
import math
import os
import subprocess
import sys
import time

import pytest
import torch
import train_helpers
from train_helpers import FAST, ONE_STEP, SIDE, STEPS_PER_EPOCH, digest

import fastload.train as train_mod
import fastload.train.config as train_config
from fastload.train import Trainer, fit, prepare_images
from fastload.train.data import DataStream

store_path = train_helpers.store_path  # the 200-record store of tests/train_helpers.py, as a fixture here


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
    monkeypatch.setattr(Trainer, "train_step", lambda self, x, y, m: step())


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


@pytest.mark.safety
def test_a_diverged_model_never_overwrites_a_checkpoint(store_path, tmp_path, monkeypatch):
    monkeypatch.setattr(train_config, "MAX_LR", 1e31)
    checkpoint = tmp_path / "run.ckpt"
    with pytest.raises(ValueError, match=r"step (\d+) ") as caught:
        fit(store_path, epochs=1, checkpoint=checkpoint, checkpoint_every=1, **{**FAST, "lr": 1e30})
    saved = torch.load(checkpoint, weights_only=True)  # the last save before the run stopped
    assert all(torch.isfinite(t).all() for t in saved["model"].values() if t.is_floating_point())
    assert saved["step"] < int(caught.value.args[0].split()[1])


@pytest.mark.safety
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
    with pytest.raises(ValueError, match=rf"step {train_helpers.STEPS_PER_EPOCH} .*non-finite parameters"):
        fit(store_path, epochs=1, log=logged.append, **FAST)
    assert logged == []


def _partials(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".fastload-partial"))


@pytest.mark.safety
def test_a_full_disk_names_the_checkpoint_and_leaves_no_partial(store_path, tmp_path, monkeypatch):
    checkpoint = tmp_path / "run.ckpt"
    fit(store_path, checkpoint=checkpoint, **ONE_STEP)
    before = digest(checkpoint)

    def full_disk(obj, f):
        f.write(b"\0" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match=rf"cannot write the checkpoint {checkpoint}: No space left") as caught:
        fit(store_path, checkpoint=checkpoint, **ONE_STEP)
    assert caught.value.errno == errno.ENOSPC and "partial" not in str(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == ["run.ckpt"] and digest(checkpoint) == before


@pytest.mark.safety
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
