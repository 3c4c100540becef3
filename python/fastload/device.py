"""Moving batches to the accelerator: `to_device` sends one uint8 batch and converts it only on
the device, augmenting there when given an `Augment` (fastload.augment); `DeviceLoader` does
that for every batch of a loader, on CUDA overlapping each batch's copy with the conversion of
the batch before it and the gather of the batches after it, or (decode="device") sends a
compressed store's bytes and decodes them there (fastload.decode). `WalkLoader` is what every
loader that makes its batches on the device shares: the dataset cursor's `Walk`, followed."""

from __future__ import annotations

import collections
import functools
import math
import statistics
import time
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from fastload.augment import Augment, check_epoch, check_uint8_batch, convert, kernel_runs
from fastload.dataset.cursor import Progress
from fastload.decode import DeviceDecoder, decode_mode
from fastload.store import Store

# Batches a DeviceLoader copies ahead at most: each is a batch of device memory held early.
MAX_DEPTH = 16
_END = object()  # what the source's iterator gives once it is exhausted


def to_device(
    images: torch.Tensor,
    device: Union[str, torch.device],
    dtype: torch.dtype = torch.float32,
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    channels_last: bool = True,
    augment: Optional[Augment] = None,
    keys=None,
    epoch: int = 0,
) -> torch.Tensor:
    """Moves a uint8 N×H×W×C batch to `device` and only there makes it N×C×H×W `dtype`,
    scaled to [0, 1] and normalized per channel with `mean`/`std` (in 0–1 units) when given.

    Why: the host-to-device link is a real bottleneck (Thunderbolt ~5 GB/s, PCIe 4.0 x16
    ~25 GB/s), and uint8 is a quarter of the bytes of float32. The copy is asynchronous
    when the batch is in pinned memory. With channels_last=True the result keeps the
    channels_last memory format that NHWC data has anyway (no transpose copy; fast for
    convolutions on GPUs); otherwise it is made contiguous NCHW. For every batch of a loader,
    `DeviceLoader` does the same with the copies overlapped.

    With `augment`, the batch is augmented on the device in the same float pass, each image by
    draws that depend on (augment.seed, `epoch`, its record index in `keys`: the indices
    FastLoadDataset(return_indices=True) yields), so not on batch size, workers or resumes.
    On the CPU (float32) the augmented batch is written into memory that fastload reuses for a
    later batch once this one and every view of it are gone (a tensor over a NumPy array; its
    storage cannot be resized): fresh memory per batch cost as much as the augmentation.
    """
    check_uint8_batch(images)
    conversion = Conversion(dtype, mean, std, channels_last, augment)
    check_epoch(epoch)
    if conversion.augmenting and keys is None:
        raise ValueError(
            "augment needs keys: the record index of each image (FastLoadDataset(return_indices=True))"
        )
    return conversion(images.to(device, non_blocking=images.is_pinned()), keys, epoch)


class Conversion:
    """What to_device makes of a uint8 batch already on its device, its arguments checked once
    (every number finite, the normalized values within `dtype`'s range) and applied per batch."""

    def __init__(self, dtype, mean, std, channels_last: bool, augment: Optional[Augment]):
        given = dtype
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, None) if dtype.isidentifier() else None
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(
                f"dtype must be a floating-point torch dtype such as torch.float32, not {given!r}"
            )
        if not isinstance(channels_last, bool):
            raise TypeError(f"channels_last must be True or False, not {channels_last!r}")
        if augment is not None and not isinstance(augment, Augment):
            raise TypeError(f"augment must be a fastload.Augment, not {type(augment).__name__}")
        self.dtype, self.channels_last = dtype, channels_last
        self.augment = augment if augment is not None and augment.active else None
        self.mean = (0.0,) if mean is None else channel_values(mean, "mean")
        self.std = (1.0,) if std is None else channel_values(std, "std")
        if 0.0 in self.std:
            raise ValueError(f"std must not be zero: {std!r}")
        if min(self.std) < 0.0:
            raise ValueError(f"std must be positive, not {std!r}")
        # Normalized values reach 1/std (the scaled pixel), mean/std and (1 - mean)/std.
        largest = max(max(1.0, abs(m), abs(1.0 - m)) / s for m in self.mean for s in self.std)
        if not largest < torch.finfo(dtype).max:
            raise ValueError(
                f"mean {mean!r} and std {std!r} make normalized values beyond {dtype}'s range "
                f"(up to {largest:.3g}); give std in 0-1 units, as mean"
            )

    @property
    def augmenting(self) -> bool:
        return self.augment is not None

    def __call__(self, on_device: torch.Tensor, keys, epoch: int) -> torch.Tensor:
        check_uint8_batch(on_device)
        channels = on_device.shape[3]
        for name, value in (("mean", self.mean), ("std", self.std)):
            if len(value) not in (1, channels):
                raise ValueError(f"{name} must have 1 or {channels} values, not {len(value)}")
        scale, shift = _normalization(on_device.device, self.dtype, self.mean, self.std)
        if self.augment is not None:
            return self.augment.apply(on_device, keys, epoch, self.dtype, scale, shift, self.channels_last)
        if self.channels_last and len(on_device) and kernel_runs(on_device, self.dtype):
            return convert(on_device, scale, shift)
        x = on_device.permute(0, 3, 1, 2).to(self.dtype).mul_(scale).sub_(shift)
        return x if self.channels_last else x.contiguous()


def usable_device(device: Union[str, torch.device]) -> torch.device:
    """`device` as a torch.device, or an error saying why batches cannot go there."""
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device such as 'cuda' or 'cpu', not {device!r}") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available (torch.cuda.is_available() is False)")
    return found


def channel_values(value: Any, name: str) -> Tuple[float, ...]:
    """A per-channel argument (a number, or one per channel) as finite floats, or an error
    naming the argument: a NaN or infinite mean or std would make every output NaN."""
    try:
        values = tuple(torch.as_tensor(value, dtype=torch.float64).flatten().tolist())
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a number or one number per channel, not {value!r}") from None
    if not values:
        raise ValueError(f"{name} must have 1 value or one per channel, not none")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{name} must be finite, not {value!r}")
    return values


@functools.lru_cache(maxsize=64)
def _normalization(
    device: torch.device, dtype: torch.dtype, mean: tuple, std: tuple
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-channel scale and shift on `device`, made once per (device, dtype, mean, std): a
    fresh small tensor per batch would be a synchronous host-to-device copy, queued behind the
    batch's asynchronous one, so the host would wait for every batch to arrive."""
    mean_t, std_t = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
    scale = (1.0 / (255.0 * std_t)).to(device=device, dtype=dtype).view(1, -1, 1, 1)
    shift = (mean_t / std_t).to(device=device, dtype=dtype).view(1, -1, 1, 1)
    return scale, shift


class CudaCopies:
    """The side stream a DeviceLoader queues its host-to-device copies on."""

    def __init__(self, device: torch.device):
        self.device = (
            device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        )
        self.stream = torch.cuda.Stream(self.device)

    def upload(self, tensor: torch.Tensor) -> torch.Tensor:
        """Queues `tensor`'s copy to the device on the current stream (the copy stream, where
        DeviceLoader calls it) without waiting for it. A pageable tensor is first copied into
        pinned memory: its copy would otherwise make the host wait for the stream."""
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()  # torch's host allocator keeps it until the copy ran
        return self.copy(tensor)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, non_blocking=True)


class BatchTimes:
    """One batch's stages (timing=True): the host's wait for it, and CUDA events around its
    copy and conversion (on the CPU, the conversion's host time instead)."""

    __slots__ = ("wait_s", "convert_s", "copy_start", "copied", "ready", "started", "converted")

    def __init__(self, wait_s: float):
        self.wait_s, self.convert_s = wait_s, None
        self.copy_start = self.copied = self.ready = self.started = self.converted = None


class DeviceLoader:
    """The batches of `source` on `device`, converted there: what a training loop iterates.

    `source` yields what FastLoadDataset yields, directly or through
    `DataLoader(ds, batch_size=None)`: tuples of uint8 N×H×W×C images, labels and (with
    return_indices=True) record indices, or bare images tensors. DeviceLoader yields the same
    tuples with every tensor on `device`, the images as `to_device` makes them: N×C×H×W
    `dtype`, scaled to [0, 1], normalized with `mean`/`std`, augmented by `augment` (which
    needs the record indices; the draws follow the epoch `set_epoch` sets, else the count of
    iterations, as FastLoadDataset's own epochs do).

    On CUDA each batch's tensors are copied on a stream of their own, `depth` batches ahead of
    the batch handed out, so the copy of batch k+1 runs while batch k is converted and the
    Rust thread gathers batch k+2. The host never waits for a copy: the stream the loop
    computes on waits for a batch's copy event (`wait_event`) before converting it, and the
    copied tensors are marked as used on that stream (`record_stream`) so the caching allocator
    does not hand their memory out again too early. The source is read with the copy stream
    current, and the host batch is dropped as soon as its copies are queued: FastLoadDataset's
    buffer pool then records its own event on the copy stream, after that batch's copies, and
    refills the pinned buffer only once that event has completed. Pageable tensors are pinned
    before their copy. Elsewhere (CPU, other devices) batches are converted one by one.

    `set_epoch`, `state_dict` and `load_state_dict` pass through to the dataset (the source,
    or the DataLoader's dataset), whose one cursor (`fastload.dataset.cursor`) says where
    loading stands for both: the epoch of each iteration (the order and the augmentation
    draws) is the one the dataset claims, and while the loader iterates, the position is the
    batches it handed out, not those copied ahead or gathered by DataLoader workers. A source
    without a FastLoadDataset (bare batches) has no state: its iterations count the epochs
    of the augmentation draws. `timing=True` records CUDA events per batch; `timings()` sums
    them up.

    `decode="device"` (a compressed store: `StoreWriter(encoding="jpeg")`) decodes on `device`
    instead of in fastload's Rust threads: `source` is then the FastLoadDataset itself, whose
    cursor's `Walk` this loader follows (as the resident store does), reading each batch's
    stored bytes from the mapping (a tenth of the pixels' at quality 90) and decoding them with
    torchvision's `decode_jpeg`, nvjpeg on CUDA (fastload.decode: why the bytes go through the
    host). The same records, labels, indices, epochs, resume points, rank shares and
    augmentation draws as the default decode="host"; pixels as torchvision's decoder makes
    them (on the CPU equal to fastload's own, measured; nvjpeg rounds differently). `depth`
    and the copy stream do not apply: decode_jpeg returns once its batch is decoded.
    """

    def __init__(
        self,
        source,
        device: Union[str, torch.device],
        *,
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = True,
        augment: Optional[Augment] = None,
        depth: int = 2,
        timing: bool = False,
        decode: str = "host",
    ):
        if not hasattr(source, "__iter__"):
            raise TypeError(
                f"source must be an iterable of batches, such as a FastLoadDataset, not {source!r}"
            )
        self.device = usable_device(device)
        self.conversion = Conversion(dtype, mean, std, channels_last, augment)
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth must be an integer from 1 to {MAX_DEPTH}, not {depth!r}")
        if not isinstance(timing, bool):
            raise TypeError(f"timing must be True or False, not {timing!r}")
        self.source, self.depth, self.timing = source, depth, timing
        self.dataset = source if hasattr(source, "set_epoch") else getattr(source, "dataset", None)
        if not hasattr(self.dataset, "set_epoch"):
            self.dataset = None
        # Where loading stands: the dataset's cursor; without one, the epoch of the next iteration.
        self.cursor = getattr(self.dataset, "cursor", None)
        self._next_epoch_without_cursor = 0
        self.waited = 0.0  # seconds the latest iteration spent blocked on the source
        # One copy stream for every iteration: the events the dataset's buffer pool records on
        # it, when it takes buffers back, then follow the copies of earlier iterations too.
        self._copies: Optional[CudaCopies] = None
        self._times: List[BatchTimes] = []
        self.decode = decode_mode(decode)
        self._decoding: Optional[DecodingLoader] = None
        if self.decode == "device":
            if not hasattr(source, "walk"):
                raise TypeError(
                    "decode='device' reads the stored bytes of the dataset's batches itself: pass the "
                    f"FastLoadDataset as the source (not a DataLoader over it), not {type(source).__name__}"
                )
            if timing:
                raise ValueError("timing=True times the copies of decode='host'; decode='device' has none")
            self._decoding = DecodingLoader(source, self.device, self.conversion)

    def __len__(self) -> int:
        return len(self.source)

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration epoch `epoch` (the dataset's and the augmentation's)."""
        check_epoch(epoch)
        if self.dataset is not None:
            self.dataset.set_epoch(epoch)
        self._next_epoch_without_cursor = epoch

    def state_dict(self) -> dict:
        """The dataset's {"seed", "epoch", "position"}: while this loader iterates, the position
        counts the batches it handed out (the dataset itself has yielded up to `depth` more,
        copied ahead)."""
        if not hasattr(self.dataset, "state_dict"):
            raise TypeError(f"the source {self.source!r} has no dataset with a state_dict")
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Makes the next iteration continue where `state` (from `state_dict`) stopped."""
        if not hasattr(self.dataset, "load_state_dict"):
            raise TypeError(f"the source {self.source!r} has no dataset with a load_state_dict")
        self.dataset.load_state_dict(state)

    def _start(self) -> Progress:
        """The count of the iteration starting: the dataset cursor's (its epoch the one the
        dataset claims), or a count of this loader's own for a source without a cursor."""
        if self.cursor is not None:
            return self.cursor.hand_out()
        epoch = self._next_epoch_without_cursor
        self._next_epoch_without_cursor += 1
        return Progress(epoch, 0, dispatched=False, claimed=True)

    def __iter__(self) -> Iterator:
        if self._decoding is not None:
            return iter(self._decoding)
        return self._iteration()

    def _iteration(self) -> Iterator:
        # Started on the first batch, as FastLoadDataset claims its epoch.
        progress = self._start()
        self.waited, self._times = 0.0, []
        host = iter(self.source)
        if self.device.type == "cuda" and self._copies is None:
            self._copies = CudaCopies(self.device)
        try:
            if self._copies is not None:
                yield from self._overlapped(host, progress, self._copies)
            else:
                yield from self._one_by_one(host, progress)
            if self.cursor is not None:
                self.cursor.finish(progress)  # ran to its end: the dataset's next epoch comes next
        finally:
            close = getattr(host, "close", None)
            if close is not None:
                close()
            if self.cursor is not None:
                self.cursor.end_hand_out(progress)
            if self._copies is not None:
                # Copies of batches never handed out may still be queued: whatever the loop's
                # stream does next (an event the dataset records on a buffer it takes back,
                # too) comes after them. A wait on the GPU, not the host.
                torch.cuda.current_stream(self._copies.device).wait_stream(self._copies.stream)

    def _next_batch(self, host: Iterator):
        started = time.perf_counter()
        batch = next(host, _END)
        waited = time.perf_counter() - started
        self.waited += waited
        if self.timing and batch is not _END:
            self._times.append(BatchTimes(waited))
        return batch

    def _one_by_one(self, host: Iterator, progress: Progress) -> Iterator:
        while True:
            batch = self._next_batch(host)
            if batch is _END:
                return
            images, rest = _split(batch)
            del batch
            started = time.perf_counter()
            images = images.to(self.device, non_blocking=images.is_pinned())
            if rest is not None:
                rest = tuple(
                    t.to(self.device, non_blocking=t.is_pinned()) if isinstance(t, torch.Tensor) else t
                    for t in rest
                )
            out = self._convert(images, rest, progress.epoch)
            if self.timing:
                self._times[-1].convert_s = time.perf_counter() - started
            progress.position += 1
            yield out

    def _overlapped(self, host: Iterator, progress: Progress, copies: CudaCopies) -> Iterator:
        # Non-timing copy events come from a ring: an event is recorded again only after the
        # compute stream's wait on its previous recording was queued, which that wait keeps.
        ring = [torch.cuda.Event() for _ in range(self.depth + 1)]
        ahead: collections.deque = collections.deque()
        issued, exhausted = 0, False
        while True:
            while not exhausted and len(ahead) <= self.depth:
                with torch.cuda.stream(copies.stream):
                    batch = self._next_batch(host)  # the pool's reclaim records on the copy stream
                    if batch is _END:
                        exhausted = True
                        break
                    times = self._times[-1] if self.timing else None
                    if times is not None:
                        times.copy_start = _timing_event(copies.stream)
                    images, rest = _split(batch)
                    del batch
                    images = copies.upload(images)
                    if rest is not None:
                        rest = tuple(copies.upload(t) if isinstance(t, torch.Tensor) else t for t in rest)
                    if times is not None:
                        copied = times.copied = _timing_event(copies.stream)
                    else:
                        copied = ring[issued % len(ring)]
                        copied.record(copies.stream)
                    issued += 1
                    ahead.append((images, rest, copied, times))
            if not ahead:
                return
            images, rest, copied, times = ahead.popleft()
            compute = torch.cuda.current_stream(copies.device)
            if times is not None:
                times.ready = _timing_event(compute)
            compute.wait_event(copied)
            images.record_stream(compute)
            if rest is not None:
                for t in rest:
                    if isinstance(t, torch.Tensor):
                        t.record_stream(compute)
            if times is not None:
                times.started = _timing_event(compute)
            out = self._convert(images, rest, progress.epoch)
            if times is not None:
                times.converted = _timing_event(compute)
            progress.position += 1
            yield out

    def _convert(self, images: torch.Tensor, rest: Optional[tuple], epoch: int):
        keys = None
        if self.conversion.augmenting:
            if rest is None or len(rest) < 2:
                raise ValueError(
                    "augment needs the record index of each image: the source must yield "
                    "(images, labels, indices), as FastLoadDataset(return_indices=True) does"
                )
            keys = rest[1]
        x = self.conversion(images, keys, epoch)
        return x if rest is None else (x, *rest)

    def timings(self) -> dict:
        """Where the batches of the latest iteration (timing=True) spent their time, in
        milliseconds per batch, {"median", "total"} per stage: `wait` (the host blocked on the
        source: the gather), `copy` (the host-to-device copy on the copy stream), `link_idle`
        (the copy stream idle before a copy: nothing to copy yet), `gpu_wait` (the compute stream
        waiting for a copy) and `convert` (conversion and augmentation). On the CPU only `wait`
        and `convert` (host time). Waits for the GPU to finish the batches first."""
        if not self.timing:
            raise ValueError("timings() needs DeviceLoader(..., timing=True)")
        done = [t for t in self._times if t.converted is not None or t.convert_s is not None]
        stages = {"wait": [1e3 * t.wait_s for t in done]}
        if self.device.type != "cuda":
            stages["convert"] = [1e3 * t.convert_s for t in done]
        elif done:
            done[-1].converted.synchronize()
            stages["copy"] = [t.copy_start.elapsed_time(t.copied) for t in done]
            stages["link_idle"] = [a.copied.elapsed_time(b.copy_start) for a, b in zip(done, done[1:])]
            stages["gpu_wait"] = [t.ready.elapsed_time(t.started) for t in done]
            stages["convert"] = [t.started.elapsed_time(t.converted) for t in done]
        summary: dict = {"batches": len(done)}
        for name, values in stages.items():
            summary[f"{name}_ms"] = {
                "median": statistics.median(values) if values else 0.0,
                "total": sum(values),
            }
        return summary


class WalkLoader:
    """A loader that makes its batches on the device itself, from the record numbers of the
    dataset cursor's `Walk` (`FastLoadDataset.walk`): the resident store (`ResidentLoader`)
    and DeviceLoader(decode="device"). Order, epochs, resume points, rank shares and the
    epoch of the augmentation draws are then the dataset's, as DeviceLoader's are, and
    `set_epoch`, `state_dict` and `load_state_dict` pass to it. A subclass makes the images
    and labels of one batch (`_images`); this class counts, converts and yields it."""

    def __init__(self, dataset, device: torch.device, conversion: Conversion):
        if not hasattr(dataset, "walk"):
            raise TypeError(f"dataset must be a FastLoadDataset, not {type(dataset).__name__}")
        self.dataset, self.device, self.conversion = dataset, device, conversion
        self.waited = 0.0  # host seconds the latest iteration spent making batches (DeviceLoader's figure)

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        check_epoch(epoch)
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)

    def __iter__(self) -> Iterator:
        # Claimed on the first batch, as FastLoadDataset claims its epoch.
        self.waited = 0.0
        walk = self.dataset.walk()
        progress = walk.progress
        for k in range(len(walk)):
            started = time.perf_counter()
            records = walk.batch(k)
            images, labels = self._images(records)
            keys = torch.from_numpy(records.copy()).to(self.device)
            out = self.conversion(images, keys, progress.epoch)
            self._converted()
            self.waited += time.perf_counter() - started
            progress.position += walk.step
            yield (out, labels, keys) if self.dataset.return_indices else (out, labels)
        self.dataset.cursor.finish(progress)

    def _images(self, records: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        """(uint8 N×H×W×C images, labels) of `records`, on the device."""
        raise NotImplementedError

    def _converted(self) -> None:
        """Called once a batch's images were converted: their memory may be reused after it."""


class DecodingLoader(WalkLoader):
    """DeviceLoader(decode="device"): each batch's stored bytes read from the mapping and
    decoded on the device (`fastload.decode.DeviceDecoder`), its labels from the store's."""

    def __init__(self, dataset, device: torch.device, conversion: Conversion):
        super().__init__(dataset, device, conversion)
        self.store = Store(dataset.path)
        self.decoder = DeviceDecoder(self.store, device)

    def _images(self, records: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        parts, jpeg = self.decoder.read(records)
        labels = torch.from_numpy(self.store.labels[records]).to(self.device)
        return self.decoder(parts, jpeg, records), labels


def _timing_event(stream) -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return event


def _split(batch) -> Tuple[torch.Tensor, Optional[tuple]]:
    """(images, the rest of the batch or None for a bare images tensor)."""
    if isinstance(batch, torch.Tensor):
        return batch, None
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0], tuple(batch[1:])
    raise TypeError(
        "DeviceLoader's source must yield uint8 images tensors or tuples (images, labels, ...), "
        f"not {type(batch).__name__}"
    )
