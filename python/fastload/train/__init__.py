"""Training a monotonic regressor or classifier on a store: :func:`fit` and the ``fastload
train`` command.

The package's modules: ``config`` (:class:`TrainConfig`, every option checked in one place),
``task`` (regression or classification: which labels each takes, its loss and validation
figures), ``data`` (the stores, their split and the stream of device batches), ``models``
(every image model: :class:`MonotonicRegressor`, :class:`MonotonicClassifier`, and
:func:`build_model`), ``trainer`` (one model's
:class:`~fastload.train.trainer.Trainer`), ``loop`` (the epoch loop that feeds trainers one
stream), ``stacked`` (trainers of one architecture stepped as one vmapped model), ``schedule``
(the learning rate of each step), ``checkpoint`` (atomic checkpoints tied to their stores),
``report`` (epoch lines and JSON logs), ``runs`` (a :func:`fit_many` group's runs from dicts,
a runs file or lists of values; their table).
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import List, Mapping, Optional, Sequence, Union

import torch

from fastload.errors import Diverged
from fastload.inspect import machine_memory
from fastload.store import PathLike, Store
from fastload.train.checkpoint import load_checkpoint, load_group
from fastload.train.config import TrainConfig, check_outputs, option_problem, resolve_device, same_file
from fastload.train.data import DataStream, load_monotone_inputs, open_data, prepare_images
from fastload.train.loop import torch_settings, train, train_many
from fastload.train.models import MonotonicClassifier, MonotonicRegressor, build_model, model_state_bytes
from fastload.train.report import epoch_logger, explain_warning, format_epoch
from fastload.train.runs import RUN_OPTIONS, named_run, read_runs_file, resolve_runs, runs_table
from fastload.train.schedule import learning_rate
from fastload.train.trainer import FitResult, Trainer


def fit(store: Union[Store, PathLike], **options) -> FitResult:
    """Trains a :class:`~fastload.train.MonotonicRegressor` on a store's labels, or a
    :class:`MonotonicClassifier` on its class indices. The keyword arguments are the fields of
    :class:`TrainConfig` (their defaults are its).

    ``task``: "regression" takes float64 or int64 labels (int64 regressed as numbers);
    "classification" takes int64 class indices: the classes the store's metadata lists
    (``meta["class_names"]``, written when packing class folders), or, when it lists none, 0 to
    the largest label (a warning says so); a separate ``val`` store must list the same classes.
    Default (None): classification for a store that lists classes, regression otherwise.
    Classification trains on cross-entropy and reports validation cross-entropy (``val_loss``),
    ``val_accuracy``, per-class ``val_support`` and ``val_correct`` (lists by class index) and
    ``baseline_accuracy`` (always the training split's commonest class); regression reports
    ``val_mae``, ``val_rmse`` and ``baseline_rmse`` (always the training labels' mean).

    Validation uses ``val`` (another store) or a reproducible ``val_fraction`` of ``store``
    (for classification, that fraction of each class, at least one record of every class of
    two or more: ``split_indices(..., stratify=labels)``). The final epoch's metrics carry
    ``learned_too_little`` (a line that the epoch line prints after it) when the validation
    error is not 5% below the baseline's, with its likely cause.
    ``monotone_inputs`` (a ``.npy`` path or array, (N,) or (N, K), aligned with ``store``) feed
    the model's monotone dimensions; with a separate ``val`` store, ``val_monotone_inputs`` are
    its aligned inputs. The model starts sensible: a regressor's output range is the training
    labels' range widened by 10% each side (a classifier's logits start near 0), its monotone-input calibrators span the training inputs
    with keypoints placed from them and the labels (half at quantiles, half where the labels
    step: :func:`~fastload.monotonic.keypoints.place_keypoints`), so a step is learned as a step,
    and images are normalized with per-channel statistics of a sample of training images
    (``size`` downscales them on the device first). ``schedule``: "cosine" (warm-up, then decay
    from ``lr``) or "constant". Each epoch trains on the training records in a fresh order
    (from ``data_seed`` and the epoch), in batches of ``batch_size``, the last one smaller; when
    that last one would hold a single record, which BatchNorm cannot train on, that record (the
    epoch's last, so another one each epoch) sits the epoch out: every run on the same data
    leaves out the same one, and a resume continues the same batches. A training split of a
    single record is refused; ``batch_size=1`` is taken as asked. ``log`` receives one metrics dict per epoch. ``checkpoint`` is written at
    every epoch end, every ``checkpoint_every`` steps and when ``max_steps`` stops the run;
    ``resume`` continues from one. ``deterministic`` turns on
    ``torch.use_deterministic_algorithms`` for the call. ``threads`` sets torch's CPU threads
    for the call (small models on a few busy cores run several times faster with 1: every
    OpenMP region waits for its slowest, possibly descheduled, thread; the loader's Rust
    threads need cores too). ``progress`` draws a bar on stderr
    (default: when stderr is a terminal). Bad input raises ValueError before any data is read:
    options out of their bounds (:func:`option_problem`; ``batch_size`` also by this machine's
    RAM), a ``checkpoint`` that is one of the inputs, or a ``resume`` from another store's run;
    an unwritable checkpoint folder raises OSError naming the checkpoint, before the first epoch.
    A model whose parameters stop being finite ends the run with a ValueError naming the step,
    before it is evaluated or saved.
    """
    config = TrainConfig(store, **options)
    saved = load_checkpoint(config.resume) if config.resume is not None else None
    data = open_data(config, saved)
    with torch_settings(config):
        stream = DataStream(config, data)
        return train(stream, Trainer(config, data, stream.steps_per_epoch, saved))


def fit_many(
    store: Union[Store, PathLike],
    runs: Union[int, PathLike, Sequence[Mapping]],
    *,
    stack: bool = False,
    **shared,
) -> List[FitResult]:
    """Trains several models at once on one stream of batches: each batch is gathered once and
    moved to the device once (as uint8), and every run takes its step on it. Returns one
    :class:`FitResult` per run, in order (:func:`runs_table` shows them side by side).

    ``runs``: one dict per run, with keys among ``RUN_OPTIONS`` (``seed`` seeds the model's
    initialisation; ``name`` defaults to ``run<i>``); a run's missing keys take their value from
    ``shared``, which takes :func:`fit`'s other options, the same for every run (``task`` too:
    the runs learn the same labels). As ``fastload train`` takes them, ``runs`` may also be the
    path of a JSON file listing those dicts (:func:`read_runs_file`, ``--runs-file``), or a
    number N of runs whose per-run options in ``shared`` are lists of N values, one per run
    (``fit_many(store, 3, lr=[1e-3, 3e-3, 1e-2])``, ``--runs 3 --lr 1e-3,3e-3,1e-2``); a list of
    one value applies to every run (:func:`~fastload.train.runs.resolve_runs`). The data (split,
    normalization, batch order) follows ``data_seed`` (default: the shared ``seed``, so 0 when
    the seed is a list that differs between runs), so each
    run ends exactly where ``fit(store, **shared, **run, data_seed=...)`` alone would.

    Runs step one after the other on each device batch, on one CUDA stream (the models are
    small: one Python thread queues their kernels in turn), each ending bitwise where it would
    alone. With ``stack``, runs that share an architecture (same named backbone, num_features and
    lattice_size, amp off: ``stacked.stack_key``) take their forward and backward passes as one
    vmapped model, so one kernel launch serves them all; each keeps its own AdamW step. Stacked
    runs agree with the runs alone within float rounding (vmapped kernels may sum in another
    order), not bitwise, which is why stacking is asked for rather than the default. The models
    draw no random numbers after their initialisation, so a run's training does not depend on
    the others. A run whose
    parameters stop being finite, or whose validation RMSE (cross-entropy when classifying) has
    not improved for ``patience`` epochs, stops alone: its result says why (``stopped``) and its log gets a line. ``checkpoint``
    is a folder: one checkpoint ``<name>.ckpt`` per run, the runs due at a save point saved
    together, all or nothing; ``resume`` is such a folder, every run resuming from the same
    dataset position (after a save interrupted among its renames, the last one all runs saved:
    docs/RELIABILITY.md, "Group checkpoints"). Refused before any training (ValueError): a bad
    option (named with its run), duplicate or unsafe names, and runs whose parameters and
    optimizer state (``FitResult.state_bytes``) do not fit the device's memory together.
    A missing ``checkpoint`` folder is created (one level, as ``mkdir``; its parent must exist).
    """
    runs, shared = resolve_runs(runs, shared)
    folders = {key: shared.pop(key, None) for key in ("checkpoint", "resume")}
    resume = folders["resume"]
    if resume is not None and not os.path.isdir(resume):
        raise ValueError(
            f"resume {resume}: with several runs it must be an existing folder (one file per run)"
        )
    base = TrainConfig(store, **shared)
    _make_checkpoint_folder(folders["checkpoint"])
    configs, names = [], []
    for i, run in enumerate(runs):
        name, run = named_run(i, run, names)
        names.append(name)
        paths = {k: None if f is None else os.path.join(f, f"{name}.ckpt") for k, f in folders.items()}
        try:
            configs.append(dataclasses.replace(base, **run, **paths))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"run {name}: {exc}") from None
    saved: List[Optional[dict]] = [None] * len(configs)
    if folders["resume"] is not None:
        repair = folders["checkpoint"] is not None and same_file(folders["resume"], folders["checkpoint"])
        chosen = load_group(folders["resume"], [c.resume for c in configs], names, repair)
        for i, (path, checkpoint) in enumerate(chosen):
            saved[i] = checkpoint
            if path != configs[i].resume:  # a .previous file: messages name the file read
                configs[i] = dataclasses.replace(configs[i], resume=path)
    data = open_data(configs[0], saved[0])
    with torch_settings(base):
        stream = DataStream(base, data)
        _check_state_memory(configs, data, base.torch_device)
        trainers = [Trainer(c, data, stream.steps_per_epoch, s, n) for c, s, n in zip(configs, saved, names)]
        return train_many(stream, trainers, stack)


def _make_checkpoint_folder(folder: Optional[PathLike]) -> None:
    """Creates the checkpoint folder of a fit_many group when missing, one level as ``mkdir``
    does (its parent must exist): the runs' checkpoint files go in it."""
    if folder is None or os.path.isdir(folder):
        return
    where = f"checkpoint {os.fspath(folder)}: with several runs it is a folder (one file per run)"
    if os.path.lexists(folder):
        raise ValueError(f"{where}, and a file of that name exists")
    parent = os.path.dirname(os.path.abspath(folder))
    if not os.path.isdir(parent):
        raise ValueError(f"{where}; its parent {parent} does not exist (create it first)")
    try:
        os.mkdir(folder)
    except OSError as exc:
        raise ValueError(f"{where}; cannot create it: {exc.strerror}") from None


def _check_state_memory(configs: Sequence[TrainConfig], data, device: torch.device) -> None:
    """Refuses runs whose parameters and optimizer state exceed the device's memory (CUDA) or
    this machine's RAM (CPU), counted on CPU copies of their models before any is placed."""
    by_architecture, needed = {}, []
    for config in configs:
        architecture = (config.backbone, config.num_features, config.lattice_size)
        if architecture not in by_architecture:
            with torch.random.fork_rng(devices=[]):
                model = build_model(Trainer.model_config(config, data), config.backbone)
            by_architecture[architecture] = model_state_bytes(model)
        needed.append(by_architecture[architecture])
    if device.type == "cuda":
        available, where = torch.cuda.mem_get_info(device)[0], f"free on {device}"
    else:
        available, where = machine_memory(), "of RAM on this machine"
    if available and sum(needed) > available:
        sizes = collections.Counter(needed)  # one entry per size, however many runs: one short line
        each = ", ".join(f"{count} x {size / 1e6:,.1f} MB" for size, count in sizes.items())
        raise ValueError(
            f"{len(configs)} runs need {sum(needed) / 1e6:,.1f} MB for parameters and optimizer state "
            f"({each}), more than the {available / 1e6:,.1f} MB {where}; train fewer runs at once"
        )


__all__ = [
    "RUN_OPTIONS",
    "FitResult",
    "MonotonicClassifier",
    "MonotonicRegressor",
    "TrainConfig",
    "build_model",
    "check_outputs",
    "epoch_logger",
    "explain_warning",
    "fit",
    "fit_many",
    "Diverged",
    "format_epoch",
    "learning_rate",
    "load_monotone_inputs",
    "option_problem",
    "prepare_images",
    "read_runs_file",
    "resolve_device",
    "runs_table",
]
