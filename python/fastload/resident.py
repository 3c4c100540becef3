"""`DeviceStore`: a store's images uploaded once, as uint8, into the accelerator's memory, and
each batch gathered there (`index_select`), so that no epoch after the upload crosses the bus,
needs pinned buffers or a host thread; every run trained from it shares the one copy.

`DeviceStore.loader(dataset)` yields exactly what `DeviceLoader(dataset, device)` yields, batch
for batch, because both follow the dataset's one cursor (`fastload.dataset.cursor`): the same
`Walk` decides which records each batch holds (here it is gathered on the device, there by the
Rust prefetcher on the host), the same `Progress` names the epoch its augmentation draws for
and counts the batches handed out, and the same `Conversion` converts."""

from __future__ import annotations

import os
import time
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from fastload.augment import Augment, check_epoch
from fastload.device import Conversion, usable_device
from fastload.inspect import DEFAULT_RESERVE_BYTES, device_plan
from fastload.progress import Progress, gigabytes
from fastload.store import PathLike, Store, as_indices

#: Bytes a chunk of the upload stages in pinned host memory.
STAGING_BYTES = 256 * 2**20


class DeviceStore:
    """The records of `store` (all, or those at `indices`) held on `device` as uint8 images and
    their labels, uploaded once in chunks through a pinned staging buffer (progress on stderr
    when `progress`).

    Before anything is allocated, the store's bytes are compared with the device's free memory
    less `reserve_bytes` (left for the model): a store that does not fit is refused with both
    figures and the largest `indices=` subset that would fit. An out-of-memory during the upload
    is reported as this option's. Use `loader(dataset, ...)` to iterate batches; one DeviceStore
    serves any number of loaders (runs) at once.
    """

    def __init__(
        self,
        store: Union[Store, PathLike],
        device: Union[str, torch.device],
        *,
        indices: Any = None,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
        progress: bool = True,
    ):
        self.store = store if isinstance(store, Store) else Store(store)
        self.device = usable_device(device)
        if isinstance(reserve_bytes, bool) or not isinstance(reserve_bytes, int) or reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must be a non-negative integer, not {reserve_bytes!r}")
        count = len(self.store)
        self.indices = np.arange(count, dtype=np.int64) if indices is None else as_indices(indices)
        bad = self.indices[(self.indices < 0) | (self.indices >= count)]
        if len(bad):
            raise IndexError(
                f"indices out of range for {self.store.path} ({count} records): {bad[:5].tolist()}"
            )
        if len(np.unique(self.indices)) != len(self.indices):
            raise ValueError("indices name a record more than once: each record is held once")
        record_bytes = self.store.image_nbytes + self.store.label_dtype.itemsize
        plan = device_plan(len(self.indices), record_bytes, self.device, reserve_bytes)
        self.nbytes = plan["needed_bytes"]
        if record_bytes > plan["available_bytes"]:
            h, w, c = self.store.shape
            raise MemoryError(
                f"{self.store.path}: one record of {h}x{w}x{c} takes {gigabytes(record_bytes)}, more than the "
                f"{gigabytes(plan['available_bytes'])} {self.device} has after the {gigabytes(reserve_bytes)} "
                "reserved for the model (reserve_bytes): its records cannot be held on this device"
            )
        if not plan["fits"]:
            fits = plan["largest_fit"]
            raise MemoryError(
                f"{self.store.path}: {len(self.indices):,} records need {gigabytes(self.nbytes)} on "
                f"{self.device}, which has {gigabytes(plan['free_bytes'])} free, "
                f"{gigabytes(plan['available_bytes'])} after the {gigabytes(reserve_bytes)} reserved for the "
                f"model (reserve_bytes): pass indices= with at most {fits:,} records "
                f"(e.g. indices=range({fits})), or a smaller reserve_bytes"
            )
        # Where each store record sits on the device (-1: not resident).
        self._rows = np.full(count, -1, dtype=np.int64)
        self._rows[self.indices] = np.arange(len(self.indices), dtype=np.int64)
        try:
            self.images = torch.empty(
                (len(self.indices), *self.store.shape), dtype=torch.uint8, device=self.device
            )
            self.labels = torch.from_numpy(self.store.labels[self.indices]).to(self.device)
            self._upload(progress)
        except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
            if not isinstance(exc, torch.cuda.OutOfMemoryError) and "allocate" not in str(exc):
                raise
            raise MemoryError(
                f"{self.store.path}: out of memory on {self.device} holding {gigabytes(self.nbytes)} of "
                "records resident (DeviceStore, on_device=True, --on-device): pass indices= with fewer "
                f"records or raise reserve_bytes ({exc})"
            ) from None

    def __len__(self) -> int:
        return len(self.indices)

    def __repr__(self) -> str:
        return f"DeviceStore({str(self.store.path)!r}, {len(self)} records on {self.device}, {gigabytes(self.nbytes)})"

    def _upload(self, progress: bool) -> None:
        chunk = max(1, STAGING_BYTES // self.store.image_nbytes)
        cuda = self.device.type == "cuda"
        staging = torch.empty((min(chunk, max(len(self), 1)), *self.store.shape), dtype=torch.uint8)
        if cuda:
            staging = staging.pin_memory()
        copied = torch.cuda.Event() if cuda else None
        bar = Progress(progress, total=self.nbytes, desc="fastload: uploading the store", unit=" B")
        try:
            for first in range(0, len(self), chunk):
                part = self.indices[first : first + chunk]
                if copied is not None:
                    copied.synchronize()  # the staging buffer's previous chunk has left
                self.store.gather(part, out=staging[: len(part)])
                self.images[first : first + len(part)].copy_(staging[: len(part)], non_blocking=cuda)
                if copied is not None:
                    copied.record()
                bar.update((first + len(part)) * self.store.image_nbytes)
            if copied is not None:
                copied.synchronize()
            bar.update(self.nbytes, force=True)
        finally:
            bar.close()

    def rows(self, records: np.ndarray) -> np.ndarray:
        """The device rows of store records `records`; an error names records not held here."""
        rows = self._rows[records]
        if len(rows) and rows.min() < 0:
            missing = records[rows < 0][:5].tolist()
            raise IndexError(
                f"records {missing} of {self.store.path} are not on the device: the dataset reads "
                "records this DeviceStore was not given (its indices=)"
            )
        return rows

    def loader(
        self,
        dataset,
        *,
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = True,
        augment: Optional[Augment] = None,
    ) -> ResidentLoader:
        """The batches of `dataset` (a FastLoadDataset over this store) gathered on the device
        and converted as DeviceLoader converts them."""
        return ResidentLoader(self, dataset, Conversion(dtype, mean, std, channels_last, augment))


class ResidentLoader:
    """What `DeviceStore.loader` returns: DeviceLoader's batches and bookkeeping (`set_epoch`,
    `state_dict`, `load_state_dict`, `len`), gathered from the resident copy.

    The images of a batch are gathered into one of two reused device buffers and converted
    from there into a fresh tensor (the batch the caller holds): a buffer is written again only
    after the conversion that read it, on the stream that read it (a CUDA event the next write
    waits for), so no batch a caller holds is ever written over.
    """

    def __init__(self, resident: DeviceStore, dataset, conversion: Conversion):
        if not hasattr(dataset, "walk"):
            raise TypeError(f"dataset must be a FastLoadDataset, not {type(dataset).__name__}")
        if os.path.realpath(dataset.path) != os.path.realpath(resident.store.path):
            raise ValueError(
                f"the dataset reads {dataset.path}, another store than this DeviceStore's ({resident.store.path})"
            )
        resident.rows(dataset.indices)  # every record it can ask for is held
        self.resident, self.dataset, self.conversion = resident, dataset, conversion
        self.device = resident.device
        shape = (dataset.batch_size, *resident.store.shape)
        self._buffers = [torch.empty(shape, dtype=torch.uint8, device=self.device) for _ in range(2)]
        self._read: list = [None, None]  # per buffer, the CUDA event after its last conversion
        self._turn = 0
        self.waited = 0.0  # host seconds the latest iteration spent queueing gathers (DeviceLoader's figure)

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
            batch = self._batch(walk.batch(k), progress.epoch)
            self.waited += time.perf_counter() - started
            progress.position += walk.step
            yield batch
        self.dataset.cursor.finish(progress)

    def _batch(self, records: np.ndarray, epoch: int):
        rows = torch.from_numpy(self.resident.rows(records)).to(self.device)
        buffer, read = self._buffers[self._turn], self._read[self._turn]
        if read is not None:
            torch.cuda.current_stream(self.device).wait_event(read)
        images = torch.index_select(self.resident.images, 0, rows, out=buffer[: len(rows)])
        labels = self.resident.labels.index_select(0, rows)
        keys = torch.from_numpy(records.copy()).to(self.device)
        out = self.conversion(images, keys, epoch)
        if self.device.type == "cuda":
            self._read[self._turn] = torch.cuda.Event()
            self._read[self._turn].record(torch.cuda.current_stream(self.device))
        self._turn ^= 1
        extra = (keys,) if self.dataset.return_indices else ()
        return (out, labels, *extra)
