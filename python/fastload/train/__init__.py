"""Training a monotonic regressor on a store: :func:`fit` and the ``fastload train`` command.

The package's modules: ``config`` (:class:`TrainConfig`, every option checked in one place),
``data`` (the stores, their split and the stream of device batches), ``trainer`` (one model's
:class:`~fastload.train.trainer.Trainer` and the loop that feeds it), ``checkpoint`` (atomic
checkpoints tied to their stores), ``report`` (epoch lines and JSON logs).
"""

from __future__ import annotations

from typing import Union

from fastload.store import PathLike, Store
from fastload.train.checkpoint import load_checkpoint, store_fingerprint
from fastload.train.config import TrainConfig, check_outputs, option_problem, resolve_device
from fastload.train.data import DataStream, load_monotone_inputs, open_data, prepare_images
from fastload.train.report import epoch_logger, format_epoch
from fastload.train.trainer import FitResult, Trainer, build_model, learning_rate, torch_settings, train


def fit(store: Union[Store, PathLike], **options) -> FitResult:
    """Trains a :class:`~fastload.monotonic.MonotonicRegressor` on a store's float64 labels.
    The keyword arguments are the fields of :class:`TrainConfig` (their defaults are its).

    Validation uses ``val`` (another store) or a reproducible ``val_fraction`` of ``store``.
    ``monotone_inputs`` (a ``.npy`` path or array, (N,) or (N, K), aligned with ``store``) feed
    the model's monotone dimensions; with a separate ``val`` store, ``val_monotone_inputs`` are
    its aligned inputs. The model starts sensible: its output range is the training labels'
    range widened by 10% each side, its monotone-input calibrators span the training inputs,
    and images are normalized with per-channel statistics of a sample of training images
    (``size`` downscales them on the device first). ``schedule``: "cosine" (warm-up, then decay
    from ``lr``) or "constant". ``log`` receives one metrics dict per epoch. ``checkpoint`` is written at
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


__all__ = [
    "FitResult",
    "TrainConfig",
    "build_model",
    "check_outputs",
    "epoch_logger",
    "fit",
    "format_epoch",
    "learning_rate",
    "load_monotone_inputs",
    "option_problem",
    "prepare_images",
    "resolve_device",
    "store_fingerprint",
]
