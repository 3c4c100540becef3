"""Training a monotonic regressor on a store: :func:`fit` and the ``fastload train`` command.

The loop exists to show whether the loader keeps the model busy. Every epoch it reports the
**data-wait fraction**: the share of the training wall time spent blocked in ``next()`` waiting
for the next batch. Near 0 the loader keeps up and the model is the bottleneck; well above 0 the
loader (or the disk under it) is.

Host-to-device overlap: on CUDA, right after the host code of step k has queued its kernels, the
loop fetches batch k+1 and copies its uint8 bytes on a side stream (``non_blocking`` from the
dataset's pinned buffers), so the copy runs while the GPU still computes step k; the loop never
synchronizes per step. On CPU it is a plain loop: the dataset's Rust thread already gathers the
next batches in the background.

Checkpoints (written atomically: a locked temporary file, fsync, ``os.replace``) hold the model,
optimizer, gradient scaler and dataset state, the epoch and step, the partial epoch's metrics, the
RNG states and a fingerprint of the stores trained on. Resuming continues with exactly the batches
the stopped run had not yet trained on, so a run stopped mid-epoch and resumed ends with the same
parameters as one that never stopped; resuming on other records is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import random
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, TextIO, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fastload.bench.machine import usable_cores
from fastload.dataset import FastLoadDataset, split_indices, to_device
from fastload.monotonic import MonotonicRegressor
from fastload.progress import Progress
from fastload.store import PathLike, Store, _fspath, _is_int, machine_memory

AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}
BACKBONES = ("small-cnn", "resnet18")
CHECKPOINT_FORMAT = "fastload-train-checkpoint-1"
# The output calibrator's range: the training labels' range widened by this share of its span on
# each side, so predictions start inside the labels' range and can still reach its ends.
LABEL_MARGIN = 0.1
# Images sampled to estimate the per-channel mean and standard deviation used for normalizing.
NORMALIZATION_SAMPLE = 512
SCHEDULES = ("cosine", "constant")
WARMUP_SHARE = 0.05  # cosine schedule: linear warm-up over this share of the steps
# Bounds on the options, so a slip (--threads 100000, --workers 500, --size 100000) is refused
# before anything runs instead of crashing torch, exhausting memory or leaving workers behind.
MAX_THREADS, MAX_WORKERS, PER_CORE = 256, 64, 4
MAX_LR = 10.0  # AdamW moves every parameter by about lr a step: beyond this it diverges at once
MAX_SIZE = 4096  # backbone input side: one 4096x4096x3 float32 image is 200 MB before any layer
# Host bytes a training step holds per image byte of its batch: the uint8 buffers in flight
# (the one in use and the prefetched ones) and the float32 copy the model reads.
BATCH_BYTES_PER_IMAGE_BYTE = 8
PARTIAL_SUFFIX = ".fastload-partial"  # as the store writer's temporary files
HEADER_SIZE = 4096  # docs/FORMAT.md: the header page, ending with its own checksum
CHECKSUM_SECTION_FIELD = 80  # docs/FORMAT.md: offset and length (u64 each) of the record checksums


def _integer_bounds() -> dict:
    """name -> (lowest, highest or None, why the highest) of fit's integer options."""
    cores = usable_cores()
    per_core = f"{PER_CORE} per core on this machine, at most"
    return {
        "epochs": (1, None, ""),
        "batch_size": (1, None, ""),
        "max_steps": (1, None, ""),
        "checkpoint_every": (1, None, ""),
        "threads": (1, min(PER_CORE * cores, MAX_THREADS), f"{per_core} {MAX_THREADS}"),
        "workers": (0, min(PER_CORE * cores, MAX_WORKERS), f"{per_core} {MAX_WORKERS}"),
        "size": (8, MAX_SIZE, "a larger image does not fit a backbone's memory"),
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
    if not _is_int(value):
        return f"must be an integer, not {value!r}"
    if high is None:
        return None if value >= low else f"must be at least {low}, not {value}"
    return None if low <= value <= high else f"must be between {low} and {high} ({why}), not {value}"


def _check_options(**options: Any) -> None:
    for name, value in options.items():
        problem = None if value is None else option_problem(name, value)
        if problem:
            raise ValueError(f"{name} {problem}")


def _check_batch_memory(batch_size: int, store: Store) -> None:
    """Refuses a batch whose buffers cannot fit in this machine's RAM (when it is known)."""
    per_record = BATCH_BYTES_PER_IMAGE_BYTE * store.image_nbytes
    ram = machine_memory()
    if ram and batch_size * per_record > ram:
        h, w, c = store.shape
        raise ValueError(
            f"batch_size must be between 1 and {ram // per_record:,} for {h}x{w}x{c} records of "
            f"{store.path} (a step holds about {per_record:,} bytes per record, this machine has "
            f"{ram / 1e9:.1f} GB of RAM), not {batch_size:,}"
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


@dataclass
class FitResult:
    """What :func:`fit` returns. ``history`` holds one metrics dict per epoch finished in this call
    (and the epochs before it when resumed): the same dicts the JSON log lines carry."""

    model: nn.Module
    history: List[dict]
    steps: int
    completed: bool  # False when max_steps stopped the run before the last epoch ended
    baseline_rmse: float  # validation RMSE of always predicting the training labels' mean
    device: str
    config: dict  # how to rebuild the model (build_model) and prepare its images (prepare_images)
    val_indices: np.ndarray  # the validation records (of the validation store when one was given)


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


def load_monotone_inputs(source: Any, count: int, what: str = "monotone inputs") -> np.ndarray:
    """Per-record scalar inputs, aligned with a store of ``count`` records, as float32 (N, K).
    ``source`` is a path to a ``.npy`` file or an array of shape (N,) or (N, K)."""
    if isinstance(source, (str, os.PathLike)):
        what = _fspath(source)
        try:
            arr = np.load(what, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"{what}: not a .npy array of numbers ({exc})") from None
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"{what}: expected a .npy file holding one array, not an .npz archive")
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


def _open_regression_store(store: Union[Store, PathLike], what: str) -> Store:
    opened = store if isinstance(store, Store) else Store(store)
    if opened.label_dtype != np.float64:
        raise ValueError(
            f"{what} {opened.path} has {opened.label_dtype} labels (class indices); regression needs "
            "real-valued float64 labels (pack with --label-dtype float64 and a labels CSV)"
        )
    if len(opened) == 0:
        raise ValueError(f"{what} {opened.path} holds no records")
    return opened


def _make_backbone(backbone: Union[str, nn.Module, None], in_channels: int, num_features: int):
    if backbone is None or isinstance(backbone, nn.Module):
        return backbone
    if backbone == "small-cnn":
        return None  # MonotonicRegressor's own default
    if backbone != "resnet18":
        raise ValueError(
            f"backbone must be one of {', '.join(BACKBONES)} or a torch module, not {backbone!r}"
        )
    try:
        from torchvision.models import resnet18
    except ImportError:
        raise ValueError(
            "the resnet18 backbone needs torchvision, which is not installed "
            "(pip install torchvision), or use --backbone small-cnn"
        ) from None
    net = resnet18(weights=None, num_classes=num_features)
    if in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net


def _column_ranges(values: np.ndarray) -> List[Tuple[float, float]]:
    """(min, max) per column, widened where a column is constant so a calibrator can be built."""
    ranges = []
    for low, high in zip(values.min(0).tolist(), values.max(0).tolist()):
        ranges.append((low, high) if high > low else (low - 0.5, high + 0.5))
    return ranges


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


def _rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": list(random.getstate()[1]) + [random.getstate()[2]],
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    *words, gauss = state["python"]
    random.setstate((3, tuple(words), gauss))


def _same_file(a: str, b: str) -> bool:
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
        out = _fspath(out, out_name)
        for name, path in paths.items():
            if _same_file(out, path):
                raise ValueError(
                    f"{out_name} {out} is the {name} {path}: training would overwrite it; choose another path"
                )


def _partial_prefix(path: str) -> Tuple[str, str]:
    directory, name = os.path.split(os.path.abspath(path))
    return directory, f".{name}."


def _remove_stale_partials(path: str) -> None:
    """Removes the temporary files left beside ``path`` by runs that died while saving: those
    whose lock nobody holds (a live save holds the lock on its own until it is renamed)."""
    directory, prefix = _partial_prefix(path)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(PARTIAL_SUFFIX)):
            continue
        partial = os.path.join(directory, name)
        try:
            fd = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(partial)
        except OSError:
            pass  # held by a live save, or already gone
        finally:
            os.close(fd)


def _open_partial(path: str) -> Tuple[int, str]:
    """A new temporary file ``.NAME.<random>.fastload-partial`` beside ``path``, created with
    O_EXCL and locked (flock) for as long as the descriptor is open. Errors name ``path``."""
    directory, prefix = _partial_prefix(path)
    while True:
        partial = os.path.join(directory, f"{prefix}{os.urandom(8).hex()}{PARTIAL_SUFFIX}")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot create a file beside the checkpoint {path}: {exc.strerror}"
            ) from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Another run's cleanup may have removed it between creation and lock: start again.
        with contextlib.suppress(OSError):
            if os.stat(partial).st_ino == os.fstat(fd).st_ino:
                return fd, partial
        os.close(fd)


def _check_checkpoint_path(path: str) -> None:
    """Before the first epoch: the checkpoint's folder exists and takes a new file."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ValueError(f"checkpoint {path}: its directory does not exist")
    if os.path.isdir(path):
        raise ValueError(f"checkpoint {path} is a directory")
    _remove_stale_partials(path)
    fd, partial = _open_partial(path)
    os.unlink(partial)
    os.close(fd)


def _save_atomically(obj: dict, path: str) -> None:
    """torch.save into a locked temporary file beside ``path``, fsync, then rename over it: a
    crash leaves either the previous checkpoint or the new one, never half of one, and the
    next save removes the temporary file of a run killed while saving."""
    _remove_stale_partials(path)
    fd, partial = _open_partial(path)
    try:
        with os.fdopen(fd, "wb") as f:  # closing it releases the lock, after the rename
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
            os.replace(partial, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"cannot write the checkpoint {path}: {exc.strerror or exc}") from None
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a power loss
        directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def store_fingerprint(store: Store) -> str:
    """SHA-256 of a store's header page (which ends with the header's own checksum) and of its
    record checksums: stores with the same fingerprint hold the same records and labels."""
    with open(store.path, "rb") as f:
        header = f.read(HEADER_SIZE)
        offset, length = struct.unpack_from("<QQ", header, CHECKSUM_SECTION_FIELD)
        digest = hashlib.sha256(header)
        f.seek(offset)
        while length > 0:
            chunk = f.read(min(length, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            length -= len(chunk)
    return digest.hexdigest()


def _check_same_stores(resume: str, saved: dict, stores: dict) -> None:
    """Refuses to resume on stores other than the ones the checkpoint was trained on
    (checkpoints written before fingerprints were recorded are compared by config alone)."""
    for what, now in stores.items():
        then = saved.get("stores", stores)[what]
        if then is None and now is None:
            continue
        if then is None or now is None:
            with_or_without = "without" if then is None else "with"
            raise ValueError(f"{resume}: the checkpoint was written for a run {with_or_without} a {what}")
        if then["fingerprint"] != now["fingerprint"]:
            raise ValueError(
                f"{resume}: the checkpoint was trained on the {what} {then['path']}, and {now['path']} "
                "holds different records; resume with the store it was trained on"
            )


def _load_checkpoint(path: PathLike) -> dict:
    path = _fspath(path, "resume")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ValueError(f"{path}: not a readable fastload training checkpoint ({exc})") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a fastload training checkpoint ({CHECKPOINT_FORMAT})")
    return checkpoint


class _EpochMeter:
    """Running totals of one epoch; part of a checkpoint so a resumed epoch reports whole-epoch figures."""

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


def _progress(enabled: bool, epoch: int, epochs: int, total: int) -> Progress:
    """Steps of one epoch, with the running loss, img/s and data-wait share."""
    return Progress(enabled, total, desc=f"epoch {epoch + 1}/{epochs}", interval=0.2)


def _progress_figures(meter: _EpochMeter) -> str:
    elapsed = max(meter.elapsed(), 1e-9)
    loss = meter.loss_sum.item() / max(meter.samples, 1)
    return f"loss {loss:.4g}, {meter.samples / elapsed:,.0f} img/s, data wait {100 * meter.wait / elapsed:.0f}%"


def prepare_images(images: torch.Tensor, config: dict, device: Union[str, torch.device]) -> torch.Tensor:
    """What the model of a run with ``config`` sees: a uint8 N×H×W×C batch moved to ``device``
    (as uint8, so the bus carries a quarter of the float32 bytes), converted and normalized
    there, and downscaled there to ``config["size"]`` when set."""
    x = to_device(images, device, mean=config["mean"], std=config["std"])
    size = config["size"]
    if size and tuple(x.shape[-2:]) != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
    return x


class _BatchPreparer:
    """Turns a host batch (images, labels, record indices) into device tensors; the record
    indices look up the per-record monotone inputs."""

    def __init__(self, device: torch.device, config: dict, monotone: Optional[np.ndarray]):
        self.device, self.config, self.monotone = device, config, monotone

    def __call__(self, batch):
        images, labels, indices = batch
        x = prepare_images(images, self.config, self.device)
        y = labels.to(self.device, dtype=torch.float32, non_blocking=True)
        m = None
        if self.monotone is not None:
            m = torch.from_numpy(self.monotone[indices.numpy()]).to(self.device, non_blocking=True)
        return x, y, m


def _device_batches(loader, prepare: _BatchPreparer, meter: Optional[_EpochMeter]):
    """Yields (x, y, m) already on the device, timing the wait in ``next()`` into ``meter``.

    The generator resumes only after the caller's step has queued its work, so on CUDA the
    next batch's copy (on a side stream) overlaps that step's kernels. The host batch is kept
    alive until its copy has completed, so the dataset cannot reuse its buffer too early."""
    device = prepare.device
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    iterator = iter(loader)
    in_flight = None  # (host batch, event recorded after its copy)
    while True:
        started = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            return
        if meter is not None:
            meter.wait += time.perf_counter() - started
        if stream is None:
            yield prepare(batch)
            continue
        with torch.cuda.stream(stream):
            tensors = prepare(batch)
            copied = torch.cuda.Event()
            copied.record(stream)
        current = torch.cuda.current_stream(device)
        current.wait_stream(stream)
        for t in tensors:
            if t is not None:
                t.record_stream(current)
        if in_flight is not None:
            in_flight[1].synchronize()
        in_flight = (batch, copied)
        yield tensors


def _make_loader(dataset: FastLoadDataset, workers: int, device: torch.device):
    """The dataset itself at workers=0 (Rust threads only); else a DataLoader of worker processes."""
    if workers == 0:
        return dataset
    return torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=workers, pin_memory=device.type == "cuda"
    )


@torch.no_grad()
def _evaluate(model: nn.Module, loader, prepare: _BatchPreparer, amp_dtype=None) -> Tuple[float, float]:
    """(MAE, RMSE) of ``model`` over a dataset, in eval mode."""
    was_training = model.training
    model.eval()
    abs_sum = torch.zeros((), dtype=torch.float64, device=prepare.device)
    sq_sum = torch.zeros((), dtype=torch.float64, device=prepare.device)
    count = 0
    try:
        for x, y, m in _device_batches(loader, prepare, None):
            with torch.autocast(prepare.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                pred = model(x, m)
            err = pred.double() - y.double()
            abs_sum += err.abs().sum()
            sq_sum += err.square().sum()
            count += len(y)
    finally:
        model.train(was_training)
    return abs_sum.item() / count, math.sqrt(sq_sum.item() / count)


def _gpu_metrics(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    metrics = {"gpu_max_memory_bytes": int(torch.cuda.max_memory_allocated(device))}
    with contextlib.suppress(Exception):  # needs pynvml; skipped silently without it
        metrics["gpu_utilization_percent"] = int(torch.cuda.utilization(device))
    return metrics


def fit(
    store: Union[Store, PathLike],
    val: Union[Store, PathLike, None] = None,
    val_fraction: float = 0.1,
    epochs: int = 10,
    batch_size: int = 64,
    lr: float = 3e-3,
    schedule: str = "cosine",
    device: Union[str, torch.device] = "auto",
    amp: str = "off",
    workers: int = 0,
    seed: int = 0,
    checkpoint: Optional[PathLike] = None,
    checkpoint_every: Optional[int] = None,
    resume: Optional[PathLike] = None,
    monotone_inputs: Any = None,
    val_monotone_inputs: Any = None,
    backbone: Union[str, nn.Module, None] = "small-cnn",
    num_features: int = 8,
    lattice_size: int = 3,
    size: Optional[int] = None,
    weight_decay: float = 0.0,
    max_steps: Optional[int] = None,
    deterministic: bool = False,
    threads: Optional[int] = None,
    log: Optional[Callable[[dict], None]] = None,
    progress: Optional[bool] = None,
) -> FitResult:
    """Trains a :class:`~fastload.monotonic.MonotonicRegressor` on a store's float64 labels.

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
    """
    if amp not in AMP_DTYPES:
        raise ValueError(f"amp must be one of {', '.join(AMP_DTYPES)}, not {amp!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    _check_options(
        epochs=epochs,
        batch_size=batch_size,
        max_steps=max_steps,
        checkpoint_every=checkpoint_every,
        threads=threads,
        workers=workers,
        size=size,
        lr=lr,
        weight_decay=weight_decay,
        val_fraction=None if val is not None else val_fraction,
    )
    resolved = resolve_device(device)
    amp_dtype = AMP_DTYPES[amp]
    inputs = {
        "store": store,
        "validation store": val,
        "monotone inputs": monotone_inputs,
        "validation monotone inputs": val_monotone_inputs,
    }
    if checkpoint is not None:
        checkpoint = _fspath(checkpoint, "checkpoint")
        check_outputs({"checkpoint": checkpoint}, inputs)
        _check_checkpoint_path(checkpoint)
    saved = _load_checkpoint(resume) if resume is not None else None

    train_store = _open_regression_store(store, "store")
    _check_batch_memory(batch_size, train_store)
    if val is not None:
        val_store = _open_regression_store(val, "validation store")
        if val_store.shape[2] != train_store.shape[2]:
            raise ValueError(
                f"validation store {val_store.path} has {val_store.shape[2]} channels, "
                f"the training store {train_store.shape[2]}"
            )
        _check_batch_memory(batch_size, val_store)
    stores = {
        "store": {"path": str(train_store.path), "fingerprint": store_fingerprint(train_store)},
        "validation store": None
        if val is None
        else {"path": str(val_store.path), "fingerprint": store_fingerprint(val_store)},
    }
    if saved is not None:
        _check_same_stores(_fspath(resume), saved, stores)
    if val is not None:
        train_idx, val_idx = np.arange(len(train_store)), np.arange(len(val_store))
    else:
        val_store = train_store
        train_idx, val_idx = split_indices(train_store, val_fraction, seed=seed)
        train_idx, val_idx = np.asarray(train_idx), np.asarray(val_idx)
    if len(val_idx) == 0:
        raise ValueError(
            f"the validation split of {train_store.path} is empty ({len(train_store)} records, "
            f"val_fraction {val_fraction}); raise val_fraction or pass a validation store"
        )
    if len(train_idx) == 0:
        raise ValueError(f"no training records left in {train_store.path} after the validation split")

    train_mono = val_mono = None
    if monotone_inputs is not None:
        train_mono = load_monotone_inputs(monotone_inputs, len(train_store))
        if val is None:
            val_mono = train_mono
        elif val_monotone_inputs is None:
            raise ValueError("with a separate validation store, pass val_monotone_inputs aligned with it")
        else:
            val_mono = load_monotone_inputs(val_monotone_inputs, len(val_store))
            if val_mono.shape[1] != train_mono.shape[1]:
                raise ValueError(
                    f"val_monotone_inputs has {val_mono.shape[1]} columns, monotone_inputs {train_mono.shape[1]}"
                )
    elif val_monotone_inputs is not None:
        raise ValueError("val_monotone_inputs given without monotone_inputs")

    train_labels = np.asarray(train_store.labels)[train_idx]
    val_labels = np.asarray(val_store.labels)[val_idx]
    for what, path, labels in (
        ("store", train_store.path, train_labels),
        ("validation", val_store.path, val_labels),
    ):
        if not np.all(np.isfinite(labels)):
            raise ValueError(f"{what} {path} has NaN or infinite labels; a regression target must be finite")
    baseline_rmse = float(np.sqrt(np.mean((val_labels - train_labels.mean()) ** 2)))
    output_min, output_max = _output_range(train_labels)
    mean, std = _channel_statistics(train_store, train_idx, seed)
    in_channels = train_store.shape[2]
    config = {
        "backbone": backbone if isinstance(backbone, str) else "custom",
        "num_features": num_features,
        "lattice_size": lattice_size,
        "in_channels": in_channels,
        "monotone_input_range": _column_ranges(train_mono[train_idx]) if train_mono is not None else [],
        "output_range": [output_min, output_max],
        "mean": mean,
        "std": std,
        "size": size,
        "seed": seed,
        "batch_size": batch_size,
    }
    if saved is not None and saved["config"] != config:
        differing = sorted(k for k in config if saved["config"].get(k) != config[k])
        raise ValueError(
            f"{resume}: the checkpoint was written for a different run (differs in: {', '.join(differing)}); "
            "resume with the same store, split, monotone inputs and options"
        )

    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    previous_threads = torch.get_num_threads()
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        model = build_model(config, backbone).to(resolved)
        if resolved.type == "cuda":
            model = model.to(memory_format=torch.channels_last)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        scaler = torch.amp.GradScaler(resolved.type, enabled=amp == "fp16")
        # Pinned host buffers only pay off when batches go to a GPU.
        loading = {"return_indices": True, "pin_memory": resolved.type == "cuda"}
        return _run(
            model=model,
            optimizer=optimizer,
            scaler=scaler,
            config=config,
            stores=stores,
            saved=saved,
            train_ds=FastLoadDataset(train_store, batch_size, seed=seed, indices=train_idx, **loading),
            val_ds=FastLoadDataset(val_store, batch_size, shuffle=False, indices=val_idx, **loading),
            train_prep=_BatchPreparer(resolved, config, train_mono),
            val_prep=_BatchPreparer(resolved, config, val_mono),
            epochs=epochs,
            learning_rate=lambda step, total: learning_rate(schedule, lr, step, total),
            workers=workers,
            amp_dtype=amp_dtype,
            checkpoint=checkpoint,
            checkpoint_every=checkpoint_every,
            max_steps=max_steps,
            baseline_rmse=baseline_rmse,
            val_indices=val_idx,
            log=log,
            progress=sys.stderr.isatty() if progress is None else progress,
        )
    finally:
        torch.use_deterministic_algorithms(previous_deterministic)
        torch.set_num_threads(previous_threads)


def build_model(config: dict, backbone: Union[str, nn.Module, None] = None) -> MonotonicRegressor:
    """The regressor a run's ``config`` (as stored in its checkpoints) describes."""
    output_min, output_max = config["output_range"]
    ranges = [tuple(r) for r in config["monotone_input_range"]]
    return MonotonicRegressor(
        backbone=_make_backbone(
            backbone if backbone is not None else config["backbone"],
            config["in_channels"],
            config["num_features"],
        ),
        num_features=config["num_features"],
        monotone_inputs=len(ranges),
        lattice_size=config["lattice_size"],
        in_channels=config["in_channels"],
        monotone_input_range=ranges if ranges else (0.0, 1.0),
        output_min=output_min,
        output_max=output_max,
        seed=config["seed"],
    )


def _run(
    *,
    model,
    optimizer,
    scaler,
    config,
    stores,
    saved,
    train_ds,
    val_ds,
    train_prep,
    val_prep,
    epochs,
    learning_rate,
    workers,
    amp_dtype,
    checkpoint,
    checkpoint_every,
    max_steps,
    baseline_rmse,
    val_indices,
    log,
    progress,
) -> FitResult:
    device = train_prep.device
    epoch, step, history, partial = 0, 0, [], None
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scaler.load_state_dict(saved["scaler"])
        epoch, step, history, partial = (
            saved["epoch"],
            saved["step"],
            list(saved["history"]),
            saved["partial"],
        )
        _set_rng_state(saved["rng"])

    def save(epoch_index: int, meter: Optional[_EpochMeter]) -> None:
        """Mid-epoch (with ``meter``) the checkpoint also holds where the dataset stands, in
        ``FastLoadDataset.state_dict()`` form, counted from the batches this loop consumed: exact
        with worker processes too (whose progress the dataset object here cannot see), and after
        an epoch's last batch, before its validation, too."""
        if checkpoint is None:
            return
        mid_epoch = None
        if meter is not None:
            dataset_state = {"seed": train_ds.seed, "epoch": epoch_index, "position": meter.steps}
            mid_epoch = {"dataset": dataset_state, "meter": meter.state()}
        _save_atomically(
            {
                "format": CHECKPOINT_FORMAT,
                "config": config,
                "stores": stores,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "epoch": epoch_index,
                "step": step,
                "history": history,
                "partial": mid_epoch,
                "rng": _rng_state(),
            },
            checkpoint,
        )

    def result(completed: bool) -> FitResult:
        return FitResult(model, history, step, completed, baseline_rmse, str(device), config, val_indices)

    train_loader = _make_loader(train_ds, workers, device)
    val_loader = _make_loader(val_ds, workers, device)
    total_steps = epochs * len(train_ds)
    if max_steps is not None and step >= max_steps:
        return result(completed=False)
    model.train()
    for epoch in range(epoch, epochs):  # noqa: B020 - continues from the checkpoint's epoch
        train_ds.set_epoch(epoch)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # the epoch's peak, not the process's
        meter = _EpochMeter(device, partial["meter"] if partial else None)
        if partial:
            train_ds.load_state_dict(partial["dataset"])
            partial = None
        bar = _progress(progress, epoch, epochs, len(train_ds))
        for x, y, m in _device_batches(train_loader, train_prep, meter):
            rate = learning_rate(step, total_steps)
            try:
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    pred = model(x, m)
                loss = F.mse_loss(pred.float(), y)
                for group in optimizer.param_groups:
                    group["lr"] = rate
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            except (IndexError, RuntimeError):
                # A NaN weight or BatchNorm statistic makes the lattice look up a cell at index -2**63.
                state = [t for t in model.state_dict().values() if t.is_floating_point()]
                if all(torch.isfinite(t).all() for t in state):
                    raise
                raise ValueError(
                    f"training diverged at step {step + 1}: the model's weights or statistics are "
                    f"no longer finite at learning rate {rate:g}; lower lr"
                ) from None
            meter.loss_sum += loss.detach().double() * len(y)
            meter.samples += len(y)
            meter.steps += 1
            step += 1
            bar.update(meter.steps, functools.partial(_progress_figures, meter))
            stopping = max_steps is not None and step >= max_steps
            if stopping or (checkpoint_every and step % checkpoint_every == 0):
                save(epoch, meter)
            if stopping:
                bar.close()
                return result(completed=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = meter.elapsed()
        bar.update(meter.steps, functools.partial(_progress_figures, meter), force=True)
        bar.close()
        val_mae, val_rmse = _evaluate(model, val_loader, val_prep, amp_dtype)
        metrics = {
            "epoch": epoch + 1,
            "epochs": epochs,
            "step": step,
            "train_loss": meter.loss_sum.item() / max(meter.samples, 1),
            "val_mae": val_mae,
            "val_rmse": val_rmse,
            "baseline_rmse": baseline_rmse,
            "images_per_s": meter.samples / seconds if seconds > 0 else 0.0,
            "data_wait_fraction": meter.wait / seconds if seconds > 0 else 0.0,
            "seconds": seconds,
            "device": str(device),
            **_gpu_metrics(device),
        }
        history.append(metrics)
        if log is not None:
            log(metrics)
        save(epoch + 1, None)
    return result(completed=True)


def format_epoch(metrics: dict) -> str:
    """One human-readable line for an epoch's metrics."""
    line = (
        f"epoch {metrics['epoch']}/{metrics['epochs']}  train loss {metrics['train_loss']:.4g}  "
        f"val MAE {metrics['val_mae']:.4g}  RMSE {metrics['val_rmse']:.4g} "
        f"(mean baseline {metrics['baseline_rmse']:.4g})  {metrics['images_per_s']:,.0f} img/s  "
        f"data wait {100 * metrics['data_wait_fraction']:.1f}%"
    )
    if "gpu_max_memory_bytes" in metrics:
        line += f"  GPU memory {metrics['gpu_max_memory_bytes'] / 2**30:.2f} GiB"
    if "gpu_utilization_percent" in metrics:
        line += f"  GPU busy {metrics['gpu_utilization_percent']}%"
    return line


def epoch_logger(
    json_lines: bool = False, json_log: Optional[PathLike] = None, stream: Optional[TextIO] = None
):
    """A ``log`` callable for :func:`fit`: a line per epoch on ``stream`` (default: the current
    stdout; JSON or human) and, with ``json_log``, a JSON line appended to that file, which is
    opened (created if missing) now, so an unwritable path fails before the first epoch."""
    if json_log is not None:
        json_log = _fspath(json_log, "json_log")
        with open(json_log, "a", encoding="utf-8"):
            pass

    def log(metrics: dict) -> None:
        line = json.dumps(metrics)
        out = sys.stdout if stream is None else stream
        out.write((line if json_lines else format_epoch(metrics)) + "\n")
        out.flush()
        if json_log is not None:
            with open(json_log, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    return log


__all__ = [
    "FitResult",
    "build_model",
    "check_outputs",
    "epoch_logger",
    "fit",
    "format_epoch",
    "load_monotone_inputs",
    "option_problem",
    "prepare_images",
    "store_fingerprint",
]
