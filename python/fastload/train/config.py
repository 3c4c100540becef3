"""`TrainConfig`: every option of :func:`fastload.train.fit`, checked in one place before any
data is read, and the checks the command line shares (:func:`option_problem`,
:func:`check_outputs`)."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
from torch import nn

from fastload._checks import INT_STATE_LIMIT, fspath, is_int
from fastload.augment import Augment
from fastload.inspect import usable_cores
from fastload.monotonic.lattice import check_lattice_size
from fastload.options import AMP_MODES, BACKBONES, MAX_RUNS, SCHEDULES, TASKS
from fastload.store import PathLike, Store
from fastload.train.checkpoint import check_checkpoint_path
from fastload.train.models import MonotonicRegressor

# Bounds on the options, so a slip (--threads 100000, --workers 500, --size 100000) is refused
# before anything runs instead of crashing torch, exhausting memory or leaving workers behind.
MAX_THREADS, MAX_WORKERS, PER_CORE = 256, 64, 4
MAX_LR = 10.0  # AdamW moves every parameter by about lr a step: beyond this it diverges at once
MAX_SIZE = 4096  # backbone input side: one 4096x4096x3 float32 image is 200 MB before any layer
# Model options: the lattice ensemble over the image features has half as many lattices as there
# are features, and one lattice over 4 inputs of size 32 already builds the largest table a lattice
# layer may (MAX_LATTICE_ENTRIES); together they are checked against that table size too.
MAX_NUM_FEATURES = 4096
MAX_LATTICE_SIZE = 32
MAX_SEED = INT_STATE_LIMIT - 1  # as FastLoadDataset's seed


@dataclass
class TrainConfig:
    """The options of one training run (as :func:`~fastload.train.fit` takes them), checked when
    the config is made: bad values raise ValueError naming the option, before any data is read
    (``dataclasses.replace`` checks the changed config again). ``torch_device`` is ``device``
    resolved. ``seed`` seeds the model's initialisation and, unless ``data_seed`` is given, the
    validation split and batch order too (``data_seed`` is resolved when the config is made, so a
    ``dataclasses.replace(config, seed=...)`` keeps the data of ``config``). ``patience`` stops a
    run after that many epochs without a new best validation RMSE (cross-entropy when
    classifying). ``task`` is "regression", "classification" or None: classification when the
    training store lists classes (``meta["class_names"]``), regression otherwise. ``augment``
    is a spec string (:meth:`~fastload.Augment.from_spec`) or the :class:`~fastload.Augment`
    ``from_spec`` returns, and is an ``Augment`` once the config is made (parsed once; its
    ``spec`` is what checkpoints record); its size and seed are the run's ``size`` and
    ``data_seed``. ``on_device`` holds the records of the run (training and validation) on the
    device as uint8 (:class:`~fastload.DeviceStore`), uploaded once and gathered there each
    batch: the same batches, with no host-to-device copy per epoch; every run of a
    ``fit_many`` group shares the one copy."""

    store: Union[Store, PathLike]
    val: Union[Store, PathLike, None] = None
    val_fraction: float = 0.1
    task: Optional[str] = None
    epochs: int = 10
    batch_size: int = 64
    lr: float = 3e-3
    schedule: str = "cosine"
    device: Union[str, torch.device] = "auto"
    amp: str = "off"
    workers: int = 0
    on_device: bool = False
    seed: int = 0
    data_seed: Optional[int] = None
    checkpoint: Optional[PathLike] = None
    checkpoint_every: Optional[int] = None
    resume: Optional[PathLike] = None
    monotone_inputs: Any = None
    val_monotone_inputs: Any = None
    backbone: Union[str, nn.Module, None] = "small-cnn"
    num_features: int = 8
    lattice_size: int = 3
    ordinal: bool = False  # ordered classes: a cumulative-link classifier (MonotonicClassifier)
    size: Optional[int] = None
    weight_decay: float = 0.0
    max_steps: Optional[int] = None
    patience: Optional[int] = None
    augment: Union[str, Augment] = ""  # the training batches'; validation is never augmented
    deterministic: bool = False
    threads: Optional[int] = None
    log: Optional[Callable[[dict], None]] = None
    progress: Optional[bool] = None  # None: when stderr is a terminal
    torch_device: torch.device = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)} or None, not {self.task!r}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp must be one of {', '.join(AMP_MODES)}, not {self.amp!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, not {self.schedule!r}")
        if not (self.backbone is None or isinstance(self.backbone, nn.Module) or self.backbone in BACKBONES):
            raise ValueError(
                f"backbone must be one of {', '.join(BACKBONES)} or a torch module, not {self.backbone!r}"
            )
        bounded = (
            "epochs",
            "batch_size",
            "max_steps",
            "patience",
            "checkpoint_every",
            "threads",
            "workers",
            "size",
            "seed",
            "data_seed",
        )
        bounded += ("num_features", "lattice_size")
        for name in bounded + ("lr", "weight_decay", "val_fraction"):
            value = getattr(self, name)
            if name == "val_fraction" and self.val is not None:
                continue  # unused with a separate validation store
            problem = None if value is None else option_problem(name, value)
            if problem:
                raise ValueError(f"{name} {problem}")
        sizes, count = MonotonicRegressor.lattice_layout(self.num_features, self.lattice_size)
        check_lattice_size(
            sizes, count, f"num_features {self.num_features} with lattice_size {self.lattice_size}"
        )
        if not isinstance(self.on_device, bool):
            raise ValueError(f"on_device must be True or False, not {self.on_device!r}")
        if self.on_device and self.workers:
            raise ValueError(
                f"on_device gathers every batch on the device, so workers must be 0, not {self.workers}"
            )
        if self.data_seed is None:
            self.data_seed = self.seed
        self.augment = parse_augment(self.augment)  # a bad spec is refused before any data is read
        self.torch_device = resolve_device(self.device)
        if self.checkpoint is not None:
            self.checkpoint = fspath(self.checkpoint, "checkpoint")
            check_outputs({"checkpoint": self.checkpoint}, self.inputs())
            check_checkpoint_path(self.checkpoint)
        if self.progress is None:
            self.progress = sys.stderr.isatty()

    def recorded_options(self) -> dict:
        """Every option of the run as plain values (paths as text, an ``Augment`` as its spec, a
        custom backbone as "custom", an array of monotone inputs as its shape), as its checkpoint
        records them: a checkpoint says how it was trained, and a resume can tell whether it
        continues the same run (:data:`~fastload.train.runs.RUN_OPTIONS`)."""
        recorded = {}
        for name in self.__dataclass_fields__:
            if name in ("log", "progress", "torch_device"):
                continue  # how the run reports, not what it trains
            value = getattr(self, name)
            if isinstance(value, Store):
                value = value.path
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            elif isinstance(value, Augment):
                value = value.spec
            elif isinstance(value, nn.Module):
                value = "custom"
            elif isinstance(value, torch.device):
                value = str(value)
            elif name in ("monotone_inputs", "val_monotone_inputs") and not (
                value is None or isinstance(value, str)
            ):
                value = f"array of shape {tuple(np.shape(value))}"
            recorded[name] = value
        return recorded

    def inputs(self) -> dict:
        """The files the run reads, by what they are (as :func:`check_outputs` takes them)."""
        return {
            "store": self.store,
            "validation store": self.val,
            "monotone inputs": self.monotone_inputs,
            "validation monotone inputs": self.val_monotone_inputs,
        }


def parse_augment(augment: Union[str, Augment]) -> Augment:
    """``augment`` as TrainConfig holds it: a spec string parsed, or an Augment that
    ``Augment.from_spec`` made (its spec is what a checkpoint records) with no size or seed of
    its own (the run's size and data seed replace them)."""
    if isinstance(augment, str):
        return Augment.from_spec(augment)
    if not isinstance(augment, Augment):
        raise TypeError(
            f"augment must be a spec string such as 'crop,flip' or an Augment, not {type(augment).__name__}"
        )
    if augment.spec is None:
        raise ValueError(
            f"augment {augment!r}: give a spec string such as 'crop,flip' or Augment.from_spec(spec), "
            "whose spec a checkpoint records"
        )
    if augment.size is not None or augment.seed != 0:
        raise ValueError(
            f"augment {augment!r}: its size and seed are the run's size and data_seed; "
            f"give Augment.from_spec({augment.spec!r}) without them"
        )
    return augment


def _integer_bounds() -> dict:
    """name -> (lowest, highest or None, why the highest) of fit's integer options."""
    cores = usable_cores()
    per_core = f"{PER_CORE} per core on this machine, at most"
    return {
        "epochs": (1, None, ""),
        "batch_size": (1, None, ""),
        "max_steps": (1, None, ""),
        "patience": (1, None, ""),
        "num_features": (1, MAX_NUM_FEATURES, "the most image features a model takes"),
        "lattice_size": (
            2,
            MAX_LATTICE_SIZE,
            "a lattice over 4 inputs of that size is the largest a lattice layer builds",
        ),
        "checkpoint_every": (1, None, ""),
        "threads": (1, min(PER_CORE * cores, MAX_THREADS), f"{per_core} {MAX_THREADS}"),
        "workers": (0, min(PER_CORE * cores, MAX_WORKERS), f"{per_core} {MAX_WORKERS}"),
        "size": (8, MAX_SIZE, "a larger image does not fit a backbone's memory"),
        "runs": (1, MAX_RUNS, "the most runs a group trains at once; train the others as another group"),
        "seed": (0, MAX_SEED, "the dataset keeps its seed in int64 state"),
        "data_seed": (0, MAX_SEED, "the dataset keeps its seed in int64 state"),
    }


def option_problem(name: str, value: Any) -> Optional[str]:
    """What is wrong with ``value`` for fit's option ``name`` ("must be between 0 and 8 (...),
    not 500"), or None. Shared with the command line, whose messages name the flag."""
    if name in ("lr", "weight_decay", "val_fraction"):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            return f"must be a number, not {value!r}"
        if name == "val_fraction":
            return None if 0 < value < 1 else f"must be between 0 and 1 (exclusive), not {value}"
        if name == "weight_decay":
            return None if 0 <= value < math.inf else f"must be a finite number, at least 0, not {value}"
        return None if 0 < value <= MAX_LR else f"must be above 0 and at most {MAX_LR:g}, not {value}"
    low, high, why = _integer_bounds()[name]
    if not is_int(value):
        return f"must be an integer, not {value!r}"
    if high is None:
        return None if value >= low else f"must be at least {low}, not {value}"
    return None if low <= value <= high else f"must be between {low} and {high} ({why}), not {value}"


def resolve_device(device: Union[str, torch.device]) -> torch.device:
    """'auto' picks CUDA when available; CUDA asked for on a machine without it fails now,
    before any data is read, rather than at the first batch."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', not {device!r} ({exc})") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {str(device)!r} was requested but CUDA is not available on this machine "
            f"(torch {torch.__version__}); use device 'cpu' or 'auto'"
        )
    if resolved.type == "cuda" and (resolved.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return resolved


def same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file or folder (by device and inode when both exist)."""
    try:
        return os.path.samefile(a, b)  # by device and inode: symlinks and hard links included
    except OSError:  # one does not exist (yet): the same file only where both lead to one place
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(outputs: dict, inputs: dict) -> None:
    """Refuses an output path (name -> path or None) that is one of the input files (name ->
    path, Store, array or None), compared by inode rather than spelling, so a run can never
    replace or append to its own store, validation store or inputs."""
    paths = {}
    for name, source in inputs.items():
        source = source.path if isinstance(source, Store) else source
        if isinstance(source, (str, os.PathLike)):
            paths[name] = os.fspath(source)
    for out_name, out in outputs.items():
        if out is None:
            continue
        out = fspath(out, out_name)
        for name, path in paths.items():
            if same_file(out, path):
                raise ValueError(
                    f"{out_name} {out} is the {name} {path}: training would overwrite it; choose another path"
                )
