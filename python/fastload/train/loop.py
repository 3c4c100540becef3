"""The epoch loop: :func:`train_many` feeds one :class:`~fastload.train.data.DataStream`'s
batches to every trainer of a run or a fit_many group, ends each epoch (one validation pass for
all, then their checkpoints, then their logs), writes the checkpoints due at each save point as
one group, and draws the progress bar; :func:`train` is the loop of a lone run.

Every epoch reports the **data-wait fraction**: the share of the training wall time spent blocked
in ``next()`` waiting for the next batch. Near 0 the loader keeps up and the model is the
bottleneck; well above 0 the loader (or the disk under it) is.
"""

from __future__ import annotations

import contextlib
import functools
from typing import List, Optional, Sequence, Tuple, Union

import torch

from fastload.progress import Progress
from fastload.train.checkpoint import save_group
from fastload.train.config import TrainConfig
from fastload.train.data import DataStream, EpochMeter
from fastload.train.stacked import StackedStep, step_units
from fastload.train.trainer import FitResult, Trainer


@contextlib.contextmanager
def torch_settings(config: TrainConfig):
    """torch's deterministic mode and CPU threads as ``config`` asks, for the run only."""
    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    previous_threads = torch.get_num_threads()
    if config.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous_deterministic)
        torch.set_num_threads(previous_threads)


def train(stream: DataStream, trainer: Trainer) -> FitResult:
    """Trains ``trainer``'s model on ``stream`` (:func:`train_many` with one trainer); a model
    that diverges raises :class:`Diverged`."""
    (result,) = train_many(stream, [trainer])
    if trainer.diverged is not None:
        raise trainer.diverged
    return result


def train_many(stream: DataStream, trainers: Sequence[Trainer], stack: bool = False) -> List[FitResult]:
    """Trains every trainer on the same batches of ``stream``, for the epochs their (shared)
    options ask, from where their checkpoints stopped (all at the same dataset position).

    Each device batch is fetched once and every running trainer takes its step on it, one after
    the other on the current device stream (the host queues the kernels of one model after
    another; the models do not wait for each other's results). A trainer that diverges or runs
    out of ``patience`` stops alone; the others go on. With ``stack``, the trainers whose models
    share an architecture (:func:`~fastload.train.stacked.stack_key`) take their forward and
    backward pass together as one vmapped model (:class:`StackedStep`), then each its own
    optimizer step."""
    options, device = trainers[0].options, stream.device
    for t in trainers:
        t.model.train()
    units = step_units(trainers, stack)
    for epoch in range(trainers[0].epoch, options.epochs):
        running = [t for t in trainers if t.running]
        if not running:
            break
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # the epoch's peak, not the process's
        position = [t.start_epoch(epoch) for t in running][0]  # all runs stand at one position
        meters = [t.meter for t in running]
        steps = meters[0].steps
        bar = Progress(
            options.progress, stream.steps_per_epoch, f"epoch {epoch + 1}/{options.epochs}", interval=0.2
        )
        figures = functools.partial(_progress_figures, meters[0])
        for x, y, m in stream.train_epoch(epoch, meters, position):
            steps += 1
            stepping = [t for t in running if t.running]
            for unit in units:
                if isinstance(unit, StackedStep):
                    unit.step(x, y, m)
                elif unit.running:
                    unit.guarded(unit.train_step, x, y, m)
            due = [t for t in stepping if t.stopped is None and t.checkpoint_due()]
            _save_checkpoints(epoch, [(t, stream.position(epoch, steps), t.meter) for t in due])
            bar.update(steps, figures)
            if not any(t.running for t in running):
                break
        else:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            bar.update(steps, figures, force=True)
            bar.close()
            _end_epoch(stream, epoch, [t for t in running if t.running])
            continue
        bar.close()
    for unit in units:
        if isinstance(unit, StackedStep):
            unit.unstack()
    return [t.result(completed=t.epoch == options.epochs) for t in trainers]


def _end_epoch(stream: DataStream, epoch: int, finished: List[Trainer]) -> None:
    """Validates every trainer that finished ``epoch`` on one pass over the validation batches,
    records its metrics (from its epoch's ``meter``) and saves it."""
    seconds = [t.meter.elapsed() for t in finished]
    for t in finished:
        t.guarded(t.check_finite)
    evaluated = [(t, s) for t, s in zip(finished, seconds) if t.stopped is None]
    sums: List[Union[int, torch.Tensor]] = [0 for _ in evaluated]  # tensors after the first batch
    count = 0
    for t, _ in evaluated:
        t.model.eval()
    try:
        for x, y, m in stream.validation():
            for i, (t, _) in enumerate(evaluated):
                sums[i] = sums[i] + t.errors(x, y, m)
            count += len(y)
    finally:
        for t, _ in evaluated:
            t.model.train()
    # In a group, each run trains on every batch: all runs together train on the sum.
    together = sum(t.meter.samples / s for t, s in zip(finished, seconds) if s > 0)
    metrics = [
        t.end_epoch(epoch, t.meter, s, total, count, together if t.name is not None else None)
        for total, (t, s) in zip(sums, evaluated)
    ]
    # The checkpoints first: a log that cannot be written (a full disk) must not lose the epoch.
    _save_checkpoints(epoch + 1, [(t, None, None) for t, _ in evaluated])
    for figures, (t, _) in zip(metrics, evaluated):
        t.report(figures)


def _save_checkpoints(
    epoch: int, due: Sequence[Tuple[Trainer, Optional[dict], Optional[EpochMeter]]]
) -> None:
    """Saves the checkpoints of the trainers in ``due`` (each with its dataset position and
    meter mid-epoch, None at the start of ``epoch``) as one group: all of them or none
    (:func:`~fastload.train.checkpoint.save_group`), so a group always resumes from one common
    step. A trainer whose parameters are no longer finite stops instead (a diverged model never
    overwrites a good checkpoint)."""
    group = []
    for t, position, meter in due:
        if t.options.checkpoint is None:
            continue
        t.guarded(t.check_finite)
        if t.stopped is None:
            state = functools.partial(t.checkpoint_state, epoch, position, meter)
            group.append((t.options.checkpoint, state))
    save_group(group)


def _progress_figures(meter: EpochMeter) -> str:
    """The progress bar's running loss, img/s and data-wait share (reading the loss waits for the device)."""
    elapsed = max(meter.elapsed(), 1e-9)
    loss = meter.loss_sum.item() / max(meter.samples, 1)
    return (
        f"loss {loss:.4g}, {meter.samples / elapsed:,.0f} img/s, data wait {100 * meter.wait / elapsed:.0f}%"
    )
