"""The data side of training: the stores and their split, the per-record monotone inputs, the
statistics the model is built from (:class:`TrainingData`), and the stream of device batches
every trainer of a run consumes (:class:`DataStream`).

The batches reach the device through :class:`fastload.DeviceLoader`, as in a user's own loop: on
CUDA their uint8 bytes are copied on a side stream a couple of batches ahead, while the GPU still
computes the step before, and nothing synchronizes per step; on the CPU it is a plain loop (the
dataset's Rust thread already gathers the next batches in the background).
"""

from __future__ import annotations

import io
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from fastload._checks import fspath
from fastload.augment import Augment
from fastload.dataset import FastLoadDataset, split_indices
from fastload.device import DeviceLoader, to_device
from fastload.files import read_regular_file
from fastload.inspect import check_batch_memory
from fastload.monotonic.keypoints import place_keypoints
from fastload.options import MAX_MONOTONE_INPUTS_BYTES
from fastload.resident import DeviceStore, ResidentLoader
from fastload.store import PathLike, Store
from fastload.train.checkpoint import check_same_stores
from fastload.train.config import TrainConfig
from fastload.train.models import NUM_KEYPOINTS
from fastload.train.task import (
    CLASSIFICATION,
    baseline,
    check_class_labels,
    choose_task,
    class_names,
    label_dtype,
)

# The output calibrator's range: the training labels' range widened by this share of its span on
# each side, so predictions start inside the labels' range and can still reach its ends.
LABEL_MARGIN = 0.1
# Images sampled to estimate the per-channel mean and standard deviation used for normalizing.
NORMALIZATION_SAMPLE = 512


@dataclass
class TrainingData:
    """What a run trains and validates on, opened and checked: the same for every model trained
    on it. ``stores`` fingerprints them for checkpoints; ``statistics`` is the data's part of a
    run's model config (task, channels, the monotone inputs' ranges and calibrator keypoints,
    output range or classes, normalization): the keypoints placed from the training inputs and
    labels (class codes of two or ordered classes; quantiles alone for unordered classes), so a
    checkpoint rebuilds the same calibrators;
    ``baseline`` what a model ignoring the images scores (``baseline_rmse`` or
    ``baseline_accuracy``)."""

    train_store: Store
    val_store: Store
    train_indices: np.ndarray
    val_indices: np.ndarray
    train_monotone: Optional[np.ndarray]
    val_monotone: Optional[np.ndarray]
    stores: dict
    baseline: dict
    statistics: dict

    @property
    def task(self) -> str:
        return self.statistics["task"]


def open_data(config: TrainConfig, saved: Optional[dict]) -> TrainingData:
    """Opens and checks the stores and inputs of ``config``; with ``saved`` (a checkpoint being
    resumed), refuses stores other than those it was trained on."""
    train_store = _open_store(config.store, "store")
    task = choose_task(config.task, train_store)
    check_batch_memory(config.batch_size, train_store)
    val = config.val
    if val is not None:
        val_store = _open_store(val, "validation store")
        if val_store.shape[2] != train_store.shape[2]:
            raise ValueError(
                f"validation store {val_store.path} has {val_store.shape[2]} channels, "
                f"the training store {train_store.shape[2]}"
            )
        check_batch_memory(config.batch_size, val_store)
    stores = {
        "store": {"path": str(train_store.path), "fingerprint": train_store.fingerprint()},
        "validation store": None
        if val is None
        else {"path": str(val_store.path), "fingerprint": val_store.fingerprint()},
    }
    labels = {"task": task}  # the labels' part of the statistics
    if task == CLASSIFICATION:
        labels["class_names"] = class_names(train_store, None if val is None else val_store)
    if saved is not None:
        check_same_stores(fspath(config.resume), saved, stores)
    if val is not None:
        train_idx, val_idx = np.arange(len(train_store)), np.arange(len(val_store))
    else:
        val_store = train_store
        # Classes held out in proportion, none left out by chance; regression keeps a random split.
        by_class = train_store.labels if task == CLASSIFICATION else None
        train_idx, val_idx = split_indices(
            train_store, config.val_fraction, seed=config.data_seed, stratify=by_class
        )
        train_idx, val_idx = np.asarray(train_idx), np.asarray(val_idx)
    if val is None and len(train_store) < 2:
        raise ValueError(
            f"store {train_store.path} has {len(train_store)} record(s); training with a validation "
            "split needs at least 2 (one to train on, one to validate), or pass a validation store"
        )
    if len(val_idx) == 0:
        raise ValueError(
            f"the validation split of {train_store.path} is empty ({len(train_store)} records, "
            f"val_fraction {config.val_fraction}); raise val_fraction or pass a validation store"
        )
    if len(train_idx) == 0:
        raise ValueError(f"no training records left in {train_store.path} after the validation split")

    train_mono = val_mono = None
    if val is None and config.val_monotone_inputs is not None:
        raise ValueError(
            "val_monotone_inputs are the inputs of a separate validation store (val); without one the "
            "validation records are the store's own and take its monotone_inputs: drop val_monotone_inputs"
        )
    if config.monotone_inputs is not None:
        train_mono = load_monotone_inputs(config.monotone_inputs, len(train_store))
        if val is None:
            val_mono = train_mono
        elif config.val_monotone_inputs is None:
            raise ValueError("with a separate validation store, pass val_monotone_inputs aligned with it")
        else:
            val_mono = load_monotone_inputs(config.val_monotone_inputs, len(val_store))
            if val_mono.shape[1] != train_mono.shape[1]:
                raise ValueError(
                    f"val_monotone_inputs has {val_mono.shape[1]} columns, monotone_inputs {train_mono.shape[1]}"
                )
    elif config.val_monotone_inputs is not None:
        raise ValueError("val_monotone_inputs given without monotone_inputs")

    train_labels = np.asarray(train_store.labels)[train_idx]
    val_labels = np.asarray(val_store.labels)[val_idx]
    for what, path, values in (
        ("store", train_store.path, train_labels),
        ("validation store", val_store.path, val_labels),
    ):
        if task == CLASSIFICATION:
            check_class_labels(what, path, values, len(labels["class_names"]))
        elif not np.all(np.isfinite(values)):
            raise ValueError(f"{what} {path} has NaN or infinite labels; a regression target must be finite")
    if task != CLASSIFICATION:
        labels["output_range"] = list(_output_range(train_labels))
    monotone: dict = {"monotone_input_range": []}  # no keypoints without inputs, as before them
    if train_mono is not None:
        training = train_mono[train_idx]
        ranges = _column_ranges(training)
        target = _placement_target(labels, train_labels, config.ordinal)
        monotone = {
            "monotone_input_range": ranges,
            "monotone_input_keypoints": _monotone_keypoints(training, ranges, target, config.data_seed),
        }
    mean, std = _channel_statistics(train_store, train_idx, config.data_seed)
    return TrainingData(
        train_store=train_store,
        val_store=val_store,
        train_indices=train_idx,
        val_indices=val_idx,
        train_monotone=train_mono,
        val_monotone=val_mono,
        stores=stores,
        baseline=baseline(task, train_labels, val_labels),
        statistics={
            "in_channels": train_store.shape[2],
            **monotone,
            **labels,
            "mean": mean,
            "std": std,
        },
    )


class EpochMeter:
    """Running totals of one model's epoch; part of a checkpoint so a resumed epoch reports
    whole-epoch figures. ``wait`` is the time the data stream spent blocked in ``next()``."""

    def __init__(self, device: torch.device, saved: Optional[dict] = None):
        saved = saved or {}
        self.loss_sum = torch.tensor(saved.get("loss_sum", 0.0), dtype=torch.float64, device=device)
        self.samples = saved.get("samples", 0)
        self.steps = saved.get("steps", 0)
        self.wait = saved.get("wait", 0.0)  # seconds blocked in next()
        self.seconds = saved.get("seconds", 0.0)  # wall time of the training loop
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return self.seconds + time.perf_counter() - self.started

    def state(self) -> dict:
        return {
            "loss_sum": self.loss_sum.item(),
            "samples": self.samples,
            "steps": self.steps,
            "wait": self.wait,
            "seconds": self.elapsed(),
        }


class DataStream:
    """The batches of one run, on the device: the training and validation datasets, their
    loaders, and the time spent waiting for them. One stream can feed several models, each
    step's device batch shared by all of them. Unless ``batch_size`` is 1, no training batch
    holds a single record (where the epoch's last would, that record sits the epoch out),
    whatever the models, so runs with and without BatchNorm see the same batches."""

    def __init__(self, config: TrainConfig, data: TrainingData):
        self.device = device = config.torch_device
        # Pinned host buffers only pay off when batches go to a GPU.
        loading = {"return_indices": True, "pin_memory": device.type == "cuda"}
        size = config.batch_size
        training = dict(seed=config.data_seed, indices=data.train_indices, **loading)
        self.train_ds = FastLoadDataset(data.train_store, size, **training)
        if size > 1 and self.train_ds.last_batch_size == 1:
            # BatchNorm cannot train on a batch of one record: drop_last then drops just the
            # epoch's last record (one per rank), another one each epoch.
            self.train_ds = FastLoadDataset(data.train_store, size, drop_last=True, **training)
            if len(self.train_ds) == 0:
                raise ValueError(
                    f"{len(data.train_indices)} training record(s) in {data.train_store.path} make "
                    "batches of one record, on which BatchNorm cannot train; give the training "
                    "split at least 2 records (per rank)"
                )
        self.val_ds = FastLoadDataset(
            data.val_store, size, shuffle=False, indices=data.val_indices, **loading
        )
        # Augmentation draws from (data seed, epoch, record): the same for every run of a stream.
        # Its crop comes out at the model's size; an empty spec keeps the plain path (and resize).
        augment = None
        if config.augment.active:
            augment = config.augment.with_size_and_seed(config.size, config.data_seed)
        normalized = {"mean": data.statistics["mean"], "std": data.statistics["std"]}
        if config.on_device:
            train_resident, val_resident = _resident_stores(data, device, config.progress)
            self.train_batches = train_resident.loader(self.train_ds, augment=augment, **normalized)
            self.val_batches = val_resident.loader(self.val_ds, **normalized)
        else:
            self.train_batches = DeviceLoader(
                _make_loader(self.train_ds, config.workers, device), device, augment=augment, **normalized
            )
            self.val_batches = DeviceLoader(
                _make_loader(self.val_ds, config.workers, device), device, **normalized
            )
        labels = label_dtype(data.task)
        self.train_prep = BatchPreparer(device, config.size, labels, data.train_monotone)
        self.val_prep = BatchPreparer(device, config.size, labels, data.val_monotone)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.train_ds)

    def position(self, epoch: int, steps: int) -> dict:
        """Where the training dataset stands after ``steps`` batches of ``epoch``, in
        ``FastLoadDataset.state_dict()`` form: exact with worker processes too (whose progress
        the dataset object here cannot see), and after an epoch's last batch too."""
        return {"seed": self.train_ds.seed, "epoch": epoch, "position": steps}

    def train_epoch(
        self, epoch: int, meters: Sequence[EpochMeter], position: Optional[dict] = None
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
        """The training batches of ``epoch`` (from ``position`` on, when resuming mid-epoch),
        the wait for each added to ``meters``."""
        self.train_batches.set_epoch(epoch)
        if position is not None:
            self.train_batches.load_state_dict(position)
        return _metered(self.train_batches, self.train_prep, meters)

    def validation(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
        return _metered(self.val_batches, self.val_prep, ())


#: The .npy header readers of the format versions numbers are written in (np.save writes 1.0,
#: or 2.0 for a header past 64 KiB).
NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def load_monotone_inputs(source: Any, count: int, what: str = "monotone inputs") -> np.ndarray:
    """Per-record scalar inputs, aligned with a store of ``count`` records, as float32 (N, K).
    ``source`` is a path to a ``.npy`` file or an array of shape (N,) or (N, K)."""
    if isinstance(source, (str, os.PathLike)):
        what = fspath(source)
        arr = read_npy(what)
    else:
        arr = np.asarray(source)
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{what}: monotone inputs must be real numbers, not {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"{what}: monotone inputs must have shape (N,) or (N, K), not {arr.shape}")
    if len(arr) != count:
        raise ValueError(
            f"{what}: {len(arr)} rows of monotone inputs for a store of {count} records; "
            "they must be aligned with the store, one row per record"
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what}: monotone inputs contain NaN or infinite values")
    return np.ascontiguousarray(arr, dtype=np.float32)


def read_npy(path: str) -> np.ndarray:
    """The one array of a ``.npy`` file, read by the input rule (a regular file under
    ``MAX_MONOTONE_INPUTS_BYTES``: a named pipe is refused, not waited on), its header's shape
    checked against the bytes the file holds before anything is allocated for it (``np.load``
    allocates what the header declares). ValueError naming the file otherwise."""
    data = read_regular_file(path, MAX_MONOTONE_INPUTS_BYTES, "monotone inputs file")
    if data.startswith(b"PK\x03\x04"):
        raise ValueError(f"{path}: expected a .npy file holding one array, not an .npz archive")
    file = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(file)
        if version not in NPY_HEADERS:
            raise ValueError(f"a .npy format version {version[0]}.{version[1]}, not 1.0 or 2.0")
        shape, _, dtype = NPY_HEADERS[version](file)
    except ValueError as exc:
        raise ValueError(f"{path}: not a .npy array of numbers ({exc})") from None
    if dtype.hasobject:
        raise ValueError(f"{path}: it holds Python objects (a pickle), not numbers; save an array of numbers")
    declared, held = math.prod(shape) * dtype.itemsize, len(data) - file.tell()
    if declared != held:
        raise ValueError(
            f"{path}: its header declares {shape} values of {dtype} ({declared:,} bytes), "
            f"but the file holds {held:,} bytes of values; write it again with np.save"
        )
    file.seek(0)
    try:
        return np.load(file, allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{path}: not a .npy array of numbers ({exc})") from None


def _open_store(store: Union[Store, PathLike], what: str) -> Store:
    opened = store if isinstance(store, Store) else Store(store)
    if len(opened) == 0:
        raise ValueError(f"{what} {opened.path} holds no records")
    if not opened.labelled:
        raise ValueError(
            f"{what} {opened.path} has no labels (packed with --no-labels / no_labels=True): training needs "
            "a label per record; pack the images with labels (--labels FILE.csv, or class folders)"
        )
    return opened


def _column_ranges(values: np.ndarray) -> List[Tuple[float, float]]:
    """(min, max) per column, widened where a column is constant so a calibrator can be built."""
    ranges = []
    for low, high in zip(values.min(0).tolist(), values.max(0).tolist()):
        ranges.append((low, high) if high > low else (low - 0.5, high + 0.5))
    return ranges


def _placement_target(labels: dict, train_labels: np.ndarray, ordinal: bool) -> np.ndarray:
    """What the monotone inputs' keypoints follow: a regression's labels; the class codes of two
    classes or of ordered ones, an order along which the target steps. Codes of unordered
    classes are no such scale: a constant target, whose curve never changes, leaves
    place_keypoints the data's quantiles alone (as LatticeClassifier keeps for them)."""
    classes = labels.get("class_names")
    if classes is None or len(classes) == 2 or ordinal:
        return train_labels
    return np.zeros(len(train_labels))


def _monotone_keypoints(
    values: np.ndarray, ranges: List[Tuple[float, float]], target: np.ndarray, seed: int
) -> List[List[float]]:
    """Each monotone input's calibrator keypoints (:func:`place_keypoints`): half at quantiles of
    its training values, half where ``target`` steps along it; a constant input's the two ends
    of its widened range."""
    columns = [values[:, j].astype(np.float64) for j in range(values.shape[1])]
    placed = place_keypoints(columns, target, [NUM_KEYPOINTS] * len(columns), seed)
    return [list(ends) if points is None else points for points, ends in zip(placed, ranges)]


def _output_range(labels: np.ndarray) -> Tuple[float, float]:
    low, high = float(labels.min()), float(labels.max())
    margin = LABEL_MARGIN * (high - low) if high > low else 1.0
    return low - margin, high + margin


def _channel_statistics(store: Store, indices: np.ndarray, seed: int) -> Tuple[list, list]:
    """Per-channel mean and std (0..1 scale) of a sample of training images."""
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(indices, size=min(len(indices), NORMALIZATION_SAMPLE), replace=False))
    images, _ = store.gather(sample)
    pixels = images.reshape(-1, store.shape[2]).astype(np.float64) / 255.0
    std = np.maximum(pixels.std(0), 1e-3)
    return pixels.mean(0).tolist(), std.tolist()


def prepare_images(
    images: torch.Tensor,
    config: dict,
    device: Union[str, torch.device],
    augment: Optional[Augment] = None,
    keys: Optional[torch.Tensor] = None,
    epoch: int = 0,
) -> torch.Tensor:
    """What the model of a run with ``config`` sees: a uint8 N×H×W×C batch moved to ``device``
    (as uint8, so the bus carries a quarter of the float32 bytes), augmented there per record
    (``keys``) and ``epoch`` when given an ``augment``, converted and normalized there, and
    downscaled there to ``config["size"]`` when set."""
    x = to_device(
        images, device, mean=config["mean"], std=config["std"], augment=augment, keys=keys, epoch=epoch
    )
    return resized(x, config["size"])


def resized(x: torch.Tensor, size: Optional[int]) -> torch.Tensor:
    """Device images downscaled to ``size`` × ``size`` when set and not already that size."""
    if size and tuple(x.shape[-2:]) != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
    return x


class BatchPreparer:
    """Turns a device batch from :class:`~fastload.DeviceLoader` (images converted and augmented
    there, labels, record indices) into what the models take: the images at the model's size, the
    labels as ``labels`` (the task's :func:`~fastload.train.task.label_dtype`) and the per-record
    monotone inputs, looked up on the device by record index (their table moved there once)."""

    def __init__(
        self, device: torch.device, size: Optional[int], labels: torch.dtype, monotone: Optional[np.ndarray]
    ):
        self.size, self.labels = size, labels
        self.monotone = None if monotone is None else torch.from_numpy(monotone).to(device)

    def __call__(self, batch):
        images, labels, indices = batch
        m = None if self.monotone is None else self.monotone[indices]
        return resized(images, self.size), labels.to(self.labels), m


def _metered(
    batches: Union[DeviceLoader, ResidentLoader], prepare: BatchPreparer, meters: Sequence[EpochMeter]
):
    """Yields the prepared device batches, adding the time each waited for the source to each
    of ``meters``."""
    counted = 0.0
    for batch in batches:
        waited, counted = batches.waited - counted, batches.waited
        for meter in meters:
            meter.wait += waited
        yield prepare(batch)


def _resident_stores(data: TrainingData, device: torch.device, progress: bool):
    """The DeviceStores of the training and validation records: one holding both when they
    come from one store (a validation split), so each record is on the device once."""
    if data.val_store is data.train_store:
        both = np.union1d(data.train_indices, data.val_indices)
        resident = DeviceStore(data.train_store, device, indices=both, progress=progress)
        return resident, resident
    return (
        DeviceStore(data.train_store, device, indices=data.train_indices, progress=progress),
        DeviceStore(data.val_store, device, indices=data.val_indices, progress=progress),
    )


def _make_loader(dataset: FastLoadDataset, workers: int, device: torch.device):
    """The dataset itself at workers=0 (Rust threads only); else a DataLoader of worker processes."""
    if workers == 0:
        return dataset
    return torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=workers, pin_memory=device.type == "cuda"
    )
