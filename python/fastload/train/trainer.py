"""One model's training (:class:`Trainer`: model, optimizer, schedule, mixed precision, a step,
evaluation, checkpoints) and the loop that feeds it a :class:`~fastload.train.data.DataStream`
(:func:`train`).

Every epoch reports the **data-wait fraction**: the share of the training wall time spent blocked
in ``next()`` waiting for the next batch. Near 0 the loader keeps up and the model is the
bottleneck; well above 0 the loader (or the disk under it) is.

Checkpoints hold the model, optimizer, gradient scaler and dataset position, the epoch and step,
the partial epoch's metrics, the RNG states and a fingerprint of the stores trained on. Resuming
continues with exactly the batches the stopped run had not yet trained on, so a run stopped
mid-epoch and resumed ends with the same parameters as one that never stopped. A model whose
parameters are no longer finite stops the run (ValueError naming the step) before it is
evaluated or saved, so a diverged model never overwrites a good checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fastload.errors import Diverged
from fastload.monotonic import check_finite_parameters
from fastload.progress import Progress
from fastload.train.checkpoint import (
    CHECKPOINT_FORMAT,
    invalid_checkpoint,
    rng_state,
    save_group,
    set_rng_state,
)
from fastload.train.config import TrainConfig
from fastload.train.data import DataStream, EpochMeter, TrainingData
from fastload.train.models import build_model, channels_last_convolutions, model_state_bytes
from fastload.train.task import (
    CLASSIFICATION,
    PATIENCE_FIGURES,
    REGRESSION,
    loss,
    validation_metrics,
    validation_sums,
)

AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}
WARMUP_SHARE = 0.05  # cosine schedule: linear warm-up over this share of the steps

Batches = Iterator[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]


@dataclass
class FitResult:
    """What :func:`fit` returns. ``history`` holds one metrics dict per epoch finished in this call
    (and the epochs before it when resumed): the same dicts the JSON log lines carry."""

    model: nn.Module
    history: List[dict]
    steps: int
    completed: bool  # False when max_steps stopped the run before the last epoch ended
    baseline_rmse: Optional[float]  # validation RMSE of always predicting the labels' mean (regression)
    device: str
    config: dict  # how to rebuild the model (build_model) and prepare its images (prepare_images)
    val_indices: np.ndarray  # the validation records (of the validation store when one was given)
    name: Optional[str] = None  # the run's name in a fit_many group
    stopped: Optional[str] = None  # why the run stopped before its last epoch: divergence or patience
    state_bytes: int = 0  # parameters, gradients and optimizer state the run holds
    task: str = REGRESSION  # or "classification": history has val_loss, val_accuracy, per-class counts
    baseline_accuracy: Optional[float] = None  # of always answering the commonest class (classification)


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


class Trainer:
    """One model trained on a run's data: built from ``config`` (its model options, seed,
    optimizer, schedule, precision, checkpoint) and ``data`` (the statistics it is built from),
    resumed from ``saved`` when given. The loop (:func:`train`) hands it device batches."""

    def __init__(
        self,
        config: TrainConfig,
        data: TrainingData,
        steps_per_epoch: int,
        saved: Optional[dict],
        name: Optional[str] = None,
    ):
        self.options, self.data, self.device, self.name = config, data, config.torch_device, name
        backbone = config.backbone
        self.config = self.model_config(config, data)
        self.task = data.task
        saved_task = None if saved is None else saved["config"]["task"]
        if saved_task not in (None, self.task):
            raise ValueError(
                f"{config.resume}: the checkpoint was written by a {saved_task} run, this run is "
                f"{self.task}; resume with task {saved_task}"
            )
        if saved is not None and saved["config"] != self.config:
            differing = sorted(k for k in self.config if saved["config"].get(k) != self.config[k])
            raise ValueError(
                f"{config.resume}: the checkpoint was written for a different run (differs in: "
                f"{', '.join(differing)}); resume with the same store, split, monotone inputs and options"
            )
        torch.manual_seed(config.seed)
        self.model = build_model(self.config, backbone).to(self.device)
        if self.device.type == "cuda":
            channels_last_convolutions(self.model)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.amp == "fp16")
        self.amp_dtype = AMP_DTYPES[config.amp]
        self.total_steps = config.epochs * steps_per_epoch
        self.epoch, self.step, self.history, self.partial = 0, 0, [], None
        self.rate = config.lr
        self.stopped: Optional[str] = None  # why the run stopped early
        self.diverged: Optional[Diverged] = None
        self.state_bytes = model_state_bytes(self.model)
        if saved is not None:
            self._resume(saved, steps_per_epoch)
        if self.epoch < config.epochs:
            self.stopped = self._patience_stop()

    def _resume(self, saved: dict, steps_per_epoch: int) -> None:
        """Continues from the checkpoint ``saved`` (its structure checked by load_checkpoint),
        after checking it against this run: its parameters against the model's, its optimizer
        state against the parameters, its step against its epochs of ``steps_per_epoch`` steps."""
        path = self.options.resume
        problem = _state_problem(self.model.state_dict(), saved["model"])
        if problem is not None:
            raise invalid_checkpoint(path, f"model: {problem}")
        within = saved["partial"]["meter"]["steps"] if saved["partial"] else 0
        if saved["step"] != saved["epoch"] * steps_per_epoch + within:
            raise invalid_checkpoint(
                path,
                f"step {saved['step']} is not where {saved['epoch']} epochs of {steps_per_epoch} steps "
                f"and {within} more end",
            )
        if saved["epoch"] > self.options.epochs:
            raise ValueError(
                f"resume {path}: the checkpoint has finished {saved['epoch']} epochs, more than the "
                f"{self.options.epochs} of this run; resume with epochs {saved['epoch']} or more"
            )
        self.model.load_state_dict(saved["model"])
        for part, target in (("optimizer", self.optimizer), ("scaler", self.scaler)):
            try:
                target.load_state_dict(saved[part])
            except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as exc:
                raise invalid_checkpoint(path, f"{part}: {exc}") from None
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                for name, value in self.optimizer.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor) and value.dim() and value.shape != p.shape:
                        shapes = f"{tuple(value.shape)}, its parameter {tuple(p.shape)}"
                        raise invalid_checkpoint(path, f"optimizer: {name} has shape {shapes}")
        self.epoch, self.step, self.partial = saved["epoch"], saved["step"], saved["partial"]
        self.history = list(saved["history"])
        set_rng_state(saved["rng"])

    @staticmethod
    def model_config(config: TrainConfig, data: TrainingData) -> dict:
        """What rebuilds the model (build_model) and prepares its images: FitResult.config, and
        what a checkpoint must match to be resumed."""
        backbone = config.backbone
        return {
            "backbone": backbone if isinstance(backbone, str) else "custom",
            "num_features": config.num_features,
            "lattice_size": config.lattice_size,
            **data.statistics,
            "size": config.size,
            "seed": config.seed,
            "data_seed": config.data_seed,
            "batch_size": config.batch_size,
            "augment": config.augment,
        }

    @property
    def done(self) -> bool:
        """Whether ``max_steps`` steps have been taken."""
        return self.options.max_steps is not None and self.step >= self.options.max_steps

    @property
    def running(self) -> bool:
        return self.stopped is None and not self.done

    def _patience_stop(self) -> Optional[str]:
        """Why ``patience`` stops the run after its history (read from the history alone, so a
        resumed run stops where the straight one would), or None."""
        patience = self.options.patience
        if patience is None or not self.history:
            return None
        key, figure = PATIENCE_FIGURES[self.task]
        values = [m[key] for m in self.history]
        since_best = len(values) - 1 - values.index(min(values))
        if since_best < patience:
            return None
        return f"no better {figure} for {since_best} epochs (patience {patience})"

    def stop(self, why: str) -> None:
        """Stops this run only, reporting why to its log when it is one of a fit_many group
        (a lone run reports it in its result, or raises :class:`Diverged`)."""
        self.stopped = why
        if self.options.log is not None and self.name is not None:
            self.options.log({**self._label(), "step": self.step, "stopped": why})

    def _label(self) -> dict:
        return {} if self.name is None else {"run": self.name}

    def start_epoch(self, epoch: int) -> Tuple[EpochMeter, Optional[dict]]:
        """The meter of ``epoch`` and, when it resumes a stopped epoch, the dataset position to
        continue from."""
        partial, self.partial = self.partial, None
        meter = EpochMeter(self.device, partial["meter"] if partial else None)
        return meter, partial["dataset"] if partial else None

    def train_step(
        self, x: torch.Tensor, y: torch.Tensor, m: Optional[torch.Tensor], meter: EpochMeter
    ) -> None:
        """One optimizer step on a device batch, at the schedule's learning rate."""
        try:
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                pred = self.model(x, m)
            step_loss = loss(self.task, pred, y)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(step_loss).backward()
            self.apply_gradients(step_loss, len(y), meter)
        except (IndexError, RuntimeError):
            # A NaN weight makes the lattice look up a cell at index -2**63.
            self.check_finite(self.step + 1)
            raise

    def apply_gradients(self, loss: torch.Tensor, count: int, meter: EpochMeter) -> None:
        """The optimizer step on the gradients in the parameters' ``.grad``, at the schedule's
        learning rate, and the step's figures in ``meter``."""
        o = self.options
        self.rate = learning_rate(o.schedule, o.lr, self.step, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = self.rate
        self.scaler.step(self.optimizer)
        self.scaler.update()
        meter.loss_sum += loss.detach().double() * count
        meter.samples += count
        meter.steps += 1
        self.step += 1

    def check_finite(self, step: Optional[int] = None) -> None:
        """Stops the run (ValueError naming the step and learning rate) when a parameter is NaN
        or infinite: training on would only spread it, and saving it would lose the last good
        checkpoint. Waits for the device."""
        try:
            check_finite_parameters(self.model)
        except ValueError as exc:
            step = self.step if step is None else step
            raise Diverged(f"step {step} (learning rate {self.rate:g}): {exc}") from None

    def checkpoint_due(self) -> bool:
        every = self.options.checkpoint_every
        return self.done or bool(every and self.step % every == 0)

    def checkpoint_state(
        self, epoch: int, position: Optional[dict] = None, meter: Optional[EpochMeter] = None
    ) -> dict:
        """What the run's checkpoint holds: mid-epoch (with the dataset ``position`` and the
        ``meter``) or at the start of ``epoch``."""
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.config,
            "stores": self.data.stores,
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},  # not a stack's storage
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": epoch,
            "step": self.step,
            "history": self.history,
            "partial": None if meter is None else {"dataset": position, "meter": meter.state()},
            "rng": rng_state(),
        }

    @torch.no_grad()
    def errors(self, x: torch.Tensor, y: torch.Tensor, m: Optional[torch.Tensor]) -> torch.Tensor:
        """The model's validation sums on one batch (:func:`~fastload.train.task.validation_sums`:
        for regression, the sums of absolute and of squared errors), float64."""
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            pred = self.model(x, m)
        return validation_sums(self.task, pred, y)

    def end_epoch(
        self,
        epoch: int,
        meter: EpochMeter,
        seconds: float,
        sums: torch.Tensor,
        count: int,
        group_images_per_s: Optional[float] = None,
    ) -> dict:
        """Records the metrics of a finished epoch, from the sums of :meth:`errors` over its
        ``count`` validation records (:meth:`report` logs them, once the checkpoint is saved). In
        a fit_many group, ``group_images_per_s`` is the images all its runs trained on per second
        (each run trains on every batch)."""
        metrics = {
            **self._label(),
            "epoch": epoch + 1,
            "epochs": self.options.epochs,
            "step": self.step,
            "train_loss": meter.loss_sum.item() / max(meter.samples, 1),
            **validation_metrics(self.task, sums, count),
            **({"class_names": self.config["class_names"]} if self.task == CLASSIFICATION else {}),
            **self.data.baseline,
            "images_per_s": meter.samples / seconds if seconds > 0 else 0.0,
            **({"images_per_s_all_runs": group_images_per_s} if group_images_per_s is not None else {}),
            "data_wait_fraction": meter.wait / seconds if seconds > 0 else 0.0,
            "seconds": seconds,
            "device": str(self.device),
            **_gpu_metrics(self.device),
        }
        self.history.append(metrics)
        self.epoch = epoch + 1
        return metrics

    def report(self, metrics: dict) -> None:
        """Logs a finished epoch's metrics, and stops the run when ``patience`` says so."""
        if self.options.log is not None:
            self.options.log(metrics)
        patience = self._patience_stop()
        if patience is not None and self.epoch < self.options.epochs:
            self.stop(patience)

    def result(self, completed: bool) -> FitResult:
        return FitResult(
            self.model,
            self.history,
            self.step,
            completed,
            self.data.baseline.get("baseline_rmse"),
            str(self.device),
            self.config,
            self.data.val_indices,
            self.name,
            self.stopped,
            self.state_bytes,
            self.task,
            self.data.baseline.get("baseline_accuracy"),
        )


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
    share an architecture (:func:`stack_key`) take their forward and backward pass together as
    one vmapped model (:class:`StackedStep`), then each its own optimizer step."""
    options, device = trainers[0].options, stream.device
    for t in trainers:
        t.model.train()
    units = _step_units(trainers, stack)
    for epoch in range(trainers[0].epoch, options.epochs):
        running = [t for t in trainers if t.running]
        if not running:
            break
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # the epoch's peak, not the process's
        started = [t.start_epoch(epoch) for t in running]
        meters = [meter for meter, _ in started]
        position = started[0][1]
        steps = meters[0].steps
        bar = Progress(
            options.progress, stream.steps_per_epoch, f"epoch {epoch + 1}/{options.epochs}", interval=0.2
        )
        figures = functools.partial(_progress_figures, meters[0])
        meter_of = {id(t): meter for t, meter in zip(running, meters)}
        for x, y, m in stream.train_epoch(epoch, meters, position):
            steps += 1
            stepping = [t for t in running if t.running]
            for unit in units:
                if isinstance(unit, StackedStep):
                    unit.step(x, y, m, meter_of)
                elif unit.running:
                    _guarded(unit, unit.train_step, x, y, m, meter_of[id(unit)])
            due = [t for t in stepping if t.stopped is None and t.checkpoint_due()]
            _save_checkpoints(epoch, [(t, stream.position(epoch, steps), meter_of[id(t)]) for t in due])
            bar.update(steps, figures)
            if not any(t.running for t in running):
                break
        else:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            bar.update(steps, figures, force=True)
            bar.close()
            _end_epoch(stream, epoch, [(t, meter) for t, meter in zip(running, meters) if t.running])
            continue
        bar.close()
    for unit in units:
        if isinstance(unit, StackedStep):
            unit.unstack()
    return [t.result(completed=t.epoch == options.epochs) for t in trainers]


def stack_key(trainer: Trainer) -> Optional[tuple]:
    """What trainers must share to be stacked (None: never stacked): a named backbone, its
    width, the lattice, full precision. Learning rates, schedules, weight decays and seeds may
    differ: each trainer keeps its own optimizer."""
    o = trainer.options
    if not isinstance(o.backbone, str) or o.amp != "off":
        return None
    return (o.backbone, o.num_features, o.lattice_size)


def _step_units(trainers: Sequence[Trainer], stack: bool) -> list:
    """The trainers as they step: alone, or (with ``stack``) stacked by architecture where two
    or more share one."""
    if not stack:
        return list(trainers)
    groups: dict = {}
    for t in trainers:
        key = stack_key(t)
        groups.setdefault(id(t) if key is None else key, []).append(t)
    return [StackedStep(group) if len(group) > 1 else group[0] for group in groups.values()]


class StackedStep:
    """The forward and backward passes of trainers whose models share an architecture, as one
    model vmapped over runs (``torch.func``): each parameter and buffer of the runs is one
    stacked tensor, and each run's model holds views of its slice, so its optimizer, checkpoint
    and evaluation work unchanged. Gradients agree with the models' own within float rounding
    (vmapped kernels may sum in another order), not bitwise."""

    def __init__(self, trainers: List[Trainer]):
        self.trainers: List[Trainer] = []
        self.task = trainers[0].task  # the group's
        self._stack(trainers)

    def _stack(self, trainers: List[Trainer]) -> None:
        self.unstack()
        self.trainers = list(trainers)
        models = [t.model for t in trainers]
        self.params = _stack_into(models, "named_parameters")
        self.buffers = _stack_into(models, "named_buffers")
        self.base = copy.deepcopy(models[0]).to("meta")  # the module structure functional_call runs

    def unstack(self) -> None:
        """Gives each model its own storage again."""
        for t in self.trainers:
            for tensor in itertools.chain(t.model.parameters(), t.model.buffers()):
                tensor.data = tensor.data.clone()

    def _loss(self, params: dict, buffers: dict, x, y, m) -> torch.Tensor:
        return loss(self.task, functional_call(self.base, (params, buffers), (x, m)), y)

    def step(self, x, y, m, meter_of: dict) -> None:
        """One step of every running trainer of the stack. A failure (a diverged model's
        lattice lookup) stops the trainers whose parameters are no longer finite, and the
        others take the step again without them."""
        while True:
            members = [t for t in self.trainers if t.running]
            if not members:
                return
            if members != self.trainers:
                self._stack(members)
            before = {name: b.clone() for name, b in self.buffers.items()}  # BatchNorm updates them
            try:
                grads, losses = vmap(grad_and_value(self._loss), in_dims=(0, 0, None, None, None))(
                    self.params, self.buffers, x, y, m
                )
            except (IndexError, RuntimeError):
                for name, b in before.items():
                    self.buffers[name].copy_(b)
                for t in members:
                    _guarded(t, t.check_finite, t.step + 1)
                if all(t.running for t in members):
                    raise
                continue
            break
        for i, t in enumerate(members):
            for name, p in t.model.named_parameters():
                p.grad = grads[name][i]
            t.apply_gradients(losses[i], len(y), meter_of[id(t)])


def _stack_into(models: List[nn.Module], which: str) -> dict:
    """name -> one tensor stacking ``which`` (named_parameters or named_buffers) of ``models``;
    each model's tensor becomes a view of its slice."""
    named = [dict(getattr(model, which)()) for model in models]
    stacked = {name: torch.stack([n[name].detach() for n in named]) for name in named[0]}
    for i, n in enumerate(named):
        for name, tensor in n.items():
            tensor.data = stacked[name][i]
    return stacked


def _guarded(trainer: Trainer, action, *args) -> None:
    """Runs ``action`` of ``trainer``; a divergence stops that trainer only."""
    try:
        action(*args)
    except Diverged as exc:
        trainer.diverged = exc
        trainer.stop(f"diverged: {exc}")


def _end_epoch(stream: DataStream, epoch: int, finished: List[Tuple[Trainer, EpochMeter]]) -> None:
    """Validates every trainer that finished ``epoch`` on one pass over the validation batches,
    records its metrics and saves it."""
    seconds = {id(t): meter.elapsed() for t, meter in finished}
    for t, _ in finished:
        _guarded(t, t.check_finite)
    evaluated = [(t, meter) for t, meter in finished if t.stopped is None]
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
    together = sum(m.samples / seconds[id(t)] for t, m in finished if seconds[id(t)] > 0)
    metrics = [
        t.end_epoch(epoch, meter, seconds[id(t)], total, count, together if t.name is not None else None)
        for total, (t, meter) in zip(sums, evaluated)
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
        _guarded(t, t.check_finite)
        if t.stopped is None:
            state = functools.partial(t.checkpoint_state, epoch, position, meter)
            group.append((t.options.checkpoint, state))
    save_group(group)


def _state_problem(expected: dict, state: dict) -> Optional[str]:
    """How a saved ``state`` (name -> tensor) differs from the model's own ``expected``: a
    missing or unexpected name, or another shape; None when it fits."""
    missing = sorted(set(expected) - set(state))
    if missing:
        return f"it has no {missing[0]}" + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        return f"{unexpected[0]} is no part of the model"
    for name, tensor in expected.items():
        if state[name].shape != tensor.shape:
            return f"{name} has shape {tuple(state[name].shape)}, the model's {tuple(tensor.shape)}"
    return None


def _progress_figures(meter: EpochMeter) -> str:
    """The progress bar's running loss, img/s and data-wait share (reading the loss waits for the device)."""
    elapsed = max(meter.elapsed(), 1e-9)
    loss = meter.loss_sum.item() / max(meter.samples, 1)
    return (
        f"loss {loss:.4g}, {meter.samples / elapsed:,.0f} img/s, data wait {100 * meter.wait / elapsed:.0f}%"
    )


def learning_rate(schedule: str, lr: float, step: int, total_steps: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``total_steps``: constant, or a
    short linear warm-up then a cosine decay to 0, which tolerates a higher peak rate and ends
    with small steps (on the demo's short runs it beat every constant rate tried). A function of
    the step alone, so a resumed run follows the same curve."""
    if schedule == "constant":
        return lr
    warmup = max(1, int(WARMUP_SHARE * total_steps))
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _gpu_metrics(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    metrics = {"gpu_max_memory_bytes": int(torch.cuda.max_memory_allocated(device))}
    with contextlib.suppress(Exception):  # needs pynvml; skipped silently without it
        metrics["gpu_utilization_percent"] = int(torch.cuda.utilization(device))
    return metrics
