"""One model's training: :class:`Trainer` (model, optimizer, mixed precision, a step, the
finite check, evaluation, what its checkpoint holds and the checks of one it resumes from) and
:class:`FitResult`, what a run returns. The loop that feeds trainers their batches is
:mod:`fastload.train.loop`; stacking trainers into one vmapped model is
:mod:`fastload.train.stacked`.

Checkpoints hold the model, optimizer, gradient scaler and dataset position, the epoch and step,
the partial epoch's metrics, the RNG states and a fingerprint of the stores trained on. Resuming
continues with exactly the batches the stopped run had not yet trained on, so a run stopped
mid-epoch and resumed ends with the same parameters as one that never stopped. A model whose
parameters are no longer finite stops the run (ValueError naming the step) before it is
evaluated or saved, so a diverged model never overwrites a good checkpoint.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
from torch import nn

from fastload.errors import Diverged
from fastload.monotonic import check_finite_parameters
from fastload.train.checkpoint import CHECKPOINT_FORMAT, invalid_checkpoint, rng_state, set_rng_state
from fastload.train.config import TrainConfig
from fastload.train.data import EpochMeter, TrainingData
from fastload.train.models import build_model, channels_last_convolutions, model_state_bytes
from fastload.train.runs import RUN_OPTIONS
from fastload.train.schedule import learning_rate
from fastload.train.task import (
    CLASSIFICATION,
    PATIENCE_FIGURES,
    REGRESSION,
    learned_too_little,
    loss,
    validation_metrics,
    validation_sums,
)

AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


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


class Trainer:
    """One model trained on a run's data: built from ``config`` (its model options, seed,
    optimizer, schedule, precision, checkpoint) and ``data`` (the statistics it is built from),
    resumed from ``saved`` when given. The loop (:func:`~fastload.train.loop.train_many`) hands
    it device batches."""

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
        if saved is not None and "monotone_input_keypoints" not in saved["config"]:
            # Written before keypoints were placed: the run resumes on its even keypoints.
            self.config.pop("monotone_input_keypoints", None)
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
        self.run = {"name": name, "options": config.recorded_options()}
        if saved is not None:
            self._check_same_run(saved)
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
        self.meter: Optional[EpochMeter] = None  # the current epoch's, from start_epoch
        self.rate = config.lr
        self.stopped: Optional[str] = None  # why the run stopped early
        self.diverged: Optional[Diverged] = None
        self.state_bytes = model_state_bytes(self.model)
        if saved is not None:
            self._resume(saved, steps_per_epoch)
        if self.epoch < config.epochs:
            self.stopped = self._patience_stop()

    def _check_same_run(self, saved: dict) -> None:
        """Refuses a checkpoint another run wrote (ValueError naming both): one of another name in
        a group, or with other per-run options (a group's files swapped: each run would continue
        the other's weights, credited to its own learning rate). A checkpoint from before runs
        were recorded has nothing to compare."""
        then = saved.get("run")
        if then is None:
            return
        per_run = [option for option in RUN_OPTIONS if option != "name"]
        differing = [
            o for o in per_run if then["options"].get(o, self.run["options"][o]) != self.run["options"][o]
        ]
        other_name = None not in (then["name"], self.name) and then["name"] != self.name
        if not (differing or other_name):
            return

        def described(run: dict) -> str:
            options = ", ".join(f"{o} {run['options'].get(o)}" for o in differing)
            name = f"run {run['name']}" if run["name"] is not None else "a run"
            return f"{name} ({options})" if options else name

        raise ValueError(
            f"resume {self.options.resume}: the checkpoint was written by {described(then)}, not by this "
            f"{described(self.run)}; resume each run from its own checkpoint"
        )

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
        if config.ordinal and data.statistics.get("task") != CLASSIFICATION:
            raise ValueError("ordinal=True orders the classes of a classification; this run is a regression")
        return {
            **({"ordinal": True} if config.ordinal else {}),  # absent otherwise, as before it existed
            "backbone": backbone if isinstance(backbone, str) else "custom",
            "num_features": config.num_features,
            "lattice_size": config.lattice_size,
            **data.statistics,
            "size": config.size,
            "seed": config.seed,
            "data_seed": config.data_seed,
            "batch_size": config.batch_size,
            "augment": config.augment.spec,
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

    def guarded(self, action, *args) -> None:
        """Runs ``action(*args)``; a divergence (:class:`Diverged`) stops this trainer only, the
        others of its group go on."""
        try:
            action(*args)
        except Diverged as exc:
            self.diverged = exc
            self.stop(f"diverged: {exc}")

    def _label(self) -> dict:
        return {} if self.name is None else {"run": self.name}

    def start_epoch(self, epoch: int) -> Optional[dict]:
        """Starts ``epoch``'s meter (``meter``, its own figures carried over when it resumes a
        stopped epoch) and returns the dataset position to continue from, or None."""
        partial, self.partial = self.partial, None
        self.meter = EpochMeter(self.device, partial["meter"] if partial else None)
        return partial["dataset"] if partial else None

    def train_step(self, x: torch.Tensor, y: torch.Tensor, m: Optional[torch.Tensor]) -> None:
        """One optimizer step on a device batch, at the schedule's learning rate."""
        try:
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                pred = self.model(x, m)
            step_loss = loss(self.task, pred, y)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(step_loss).backward()
            self.apply_gradients(step_loss, len(y))
        except (IndexError, RuntimeError):
            # A NaN weight makes the lattice look up a cell at index -2**63.
            self.check_finite(self.step + 1)
            raise

    def apply_gradients(self, loss: torch.Tensor, count: int) -> None:
        """The optimizer step on the gradients in the parameters' ``.grad``, at the schedule's
        learning rate, and the step's figures in the epoch's ``meter``."""
        o = self.options
        self.rate = learning_rate(o.schedule, o.lr, self.step, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = self.rate
        self.scaler.step(self.optimizer)
        self.scaler.update()
        meter = self.meter
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
            "run": self.run,
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
        if epoch + 1 == self.options.epochs:  # the run's final figures: say when they beat nothing
            problem = learned_too_little(
                self.task, [*self.history, metrics], len(self.data.train_indices), self.options.epochs
            )
            if problem is not None:
                metrics["learned_too_little"] = problem
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


def _gpu_metrics(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    metrics = {"gpu_max_memory_bytes": int(torch.cuda.max_memory_allocated(device))}
    with contextlib.suppress(Exception):  # needs pynvml; skipped silently without it
        metrics["gpu_utilization_percent"] = int(torch.cuda.utilization(device))
    return metrics
