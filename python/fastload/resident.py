"""`DeviceStore`: a store's images uploaded once, as uint8, into the accelerator's memory, and
each batch gathered there (`index_select`), so that no epoch after the upload crosses the bus,
needs pinned buffers or a host thread; every run trained from it shares the one copy.

`DeviceStore.loader(dataset)` yields exactly what `DeviceLoader(dataset, device)` yields, batch
for batch, because both follow the dataset's one cursor (`fastload.dataset.cursor`): the same
`Walk` decides which records each batch holds (here it is gathered on the device, there by the
Rust prefetcher on the host), the same `Progress` names the epoch its augmentation draws for
and counts the batches handed out, and the same `Conversion` converts.

A compressed store (`StoreWriter(encoding="jpeg")`) is held decoded by default (decoded once,
by fastload's Rust threads, as it is uploaded), or with decode="device" held compressed, in
pinned host memory, each batch decoded on the device (`fastload.decode`): a tenth of the bytes
crosses the bus per epoch, and the device's memory holds no records at all."""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from fastload.augment import Augment
from fastload.decode import DeviceDecoder, decode_mode
from fastload.device import Conversion, WalkLoader, usable_device
from fastload.inspect import DEFAULT_RESERVE_BYTES, device_plan, machine_memory
from fastload.progress import Progress, gigabytes
from fastload.store import PathLike, Store, as_indices

#: Bytes a chunk of the upload stages in pinned host memory; also the size of each block of
#: pinned memory a store held compressed takes (a power of two: torch's pinned allocator
#: rounds every allocation up to one, so one tensor of 9 GB would pin 16).
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

    `decode="device"` (a compressed store) holds the records' stored bytes in pinned host
    memory instead (`_hold_compressed` says why not on the device), only the labels on the
    device, and decodes each batch there with torchvision's decode_jpeg (nvjpeg on CUDA), as
    DeviceLoader(decode="device") does: the same batches, decoded by torchvision.
    """

    def __init__(
        self,
        store: Union[Store, PathLike],
        device: Union[str, torch.device],
        *,
        indices: Any = None,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
        progress: bool = True,
        decode: str = "host",
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
        # Where each store record sits on the device (-1: not resident).
        self._rows = np.full(count, -1, dtype=np.int64)
        self._rows[self.indices] = np.arange(len(self.indices), dtype=np.int64)
        self.decode = decode_mode(decode)
        self.decoder: Optional[DeviceDecoder] = None
        if self.decode == "device":
            self.decoder = DeviceDecoder(self.store, self.device)
            self._hold_compressed(reserve_bytes, progress)
            return
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
        held = "" if self.decoder is None else " compressed in pinned host memory, decoded"
        return (
            f"DeviceStore({str(self.store.path)!r}, {len(self)} records{held} on {self.device}, "
            f"{gigabytes(self.nbytes)})"
        )

    def _hold_compressed(self, reserve_bytes: int, progress: bool) -> None:
        """decode="device": the records' stored bytes (JPEG, and the raw records of a budget
        store) held in pinned host memory, in blocks of at most STAGING_BYTES, and only their
        labels on the device; each batch is decoded there (`DeviceDecoder`).

        Why not in the device's memory: torchvision's decode_jpeg takes its input on the CPU
        only (fastload.decode), so bytes held on the GPU would be copied back for every batch.
        Held pinned, they take no GPU memory at all, cross the bus once per epoch at a tenth of
        the pixels' bytes (quality 90), and never wait on the disk or the page cache. Pinned
        memory cannot be paged out, so they may take at most half this machine's RAM."""
        lengths = np.fromiter(
            (len(self.store.stored(int(i))[1]) for i in self.indices), dtype=np.int64, count=len(self.indices)
        )
        held = int(lengths.sum())
        plan = device_plan(len(self.indices), self.store.label_dtype.itemsize, self.device, reserve_bytes)
        self.nbytes = held + plan["needed_bytes"]
        self.images: Optional[torch.Tensor] = None  # no decoded records are held
        if not plan["fits"]:
            raise MemoryError(
                f"{self.store.path}: the labels of {len(self.indices):,} records need {gigabytes(plan['needed_bytes'])} "
                f"on {self.device}, which has {gigabytes(plan['available_bytes'])} after the "
                f"{gigabytes(reserve_bytes)} reserved for the model (reserve_bytes)"
            )
        limit = machine_memory() // 2
        if limit and held > limit:
            fits = int(np.searchsorted(np.cumsum(lengths), limit, side="right"))
            raise MemoryError(
                f"{self.store.path}: {len(self.indices):,} records take {gigabytes(held)} compressed, more than "
                f"half this machine's RAM ({gigabytes(limit)}), the most decode='device' pins: pass indices= "
                f"with at most {fits:,} records (e.g. indices=range({fits})), or use DeviceLoader(dataset, device, "
                "decode='device'), which reads each batch from the store instead"
            )
        # Each record in one block: a new block starts where the record would not fit.
        self._block = np.empty(len(lengths), dtype=np.int64)
        self._start = np.empty(len(lengths), dtype=np.int64)
        sizes: List[int] = []
        for k, length in enumerate(lengths.tolist()):
            if not sizes or sizes[-1] + length > max(STAGING_BYTES, length):
                sizes.append(0)
            self._block[k], self._start[k] = len(sizes) - 1, sizes[-1]
            sizes[-1] += length
        self._length = lengths
        self._jpeg = np.empty(len(lengths), dtype=bool)
        pin = self.device.type == "cuda"
        bar = Progress(progress, total=held, desc="fastload: holding the store compressed", unit=" B")
        try:
            self.labels = torch.from_numpy(self.store.labels[self.indices]).to(self.device)
            self._blocks = [torch.empty(size, dtype=torch.uint8, pin_memory=pin) for size in sizes]
            views = [block.numpy() for block in self._blocks]
            copied = 0
            for k, i in enumerate(self.indices.tolist()):
                encoding, data = self.store.stored(i)
                start = int(self._start[k])
                views[self._block[k]][start : start + len(data)] = data
                self._jpeg[k] = encoding == "jpeg"
                copied += len(data)
                bar.update(copied)
            bar.update(held, force=True)
        except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
            if not isinstance(exc, torch.cuda.OutOfMemoryError) and "memory" not in str(exc):
                raise
            raise MemoryError(
                f"{self.store.path}: out of memory holding {gigabytes(held)} of compressed records pinned for "
                f"{self.device} (DeviceStore(decode='device')): pass indices= with fewer records ({exc})"
            ) from None
        finally:
            bar.close()

    def stored(self, rows: np.ndarray) -> Tuple[List[torch.Tensor], np.ndarray]:
        """decode="device": the held bytes of `rows` (views, no copy) and whether each is a JPEG."""
        parts = [
            self._blocks[b][s : s + n]
            for b, s, n in zip(
                self._block[rows].tolist(), self._start[rows].tolist(), self._length[rows].tolist()
            )
        ]
        return parts, self._jpeg[rows]

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


class ResidentLoader(WalkLoader):
    """What `DeviceStore.loader` returns: DeviceLoader's batches and bookkeeping (`set_epoch`,
    `state_dict`, `load_state_dict`, `len`), gathered from the resident copy (or, for a store
    held compressed, decoded from it).

    The images of a batch are gathered into one of two reused device buffers and converted
    from there into a fresh tensor (the batch the caller holds): a buffer is written again only
    after the conversion that read it, on the stream that read it (a CUDA event the next write
    waits for), so no batch a caller holds is ever written over. Decoded batches are fresh
    tensors from the caching allocator, which orders their reuse by stream itself.
    """

    def __init__(self, resident: DeviceStore, dataset, conversion: Conversion):
        super().__init__(dataset, resident.device, conversion)
        if os.path.realpath(dataset.path) != os.path.realpath(resident.store.path):
            raise ValueError(
                f"the dataset reads {dataset.path}, another store than this DeviceStore's ({resident.store.path})"
            )
        resident.rows(dataset.indices)  # every record it can ask for is held
        self.resident = resident
        shape = (dataset.batch_size, *resident.store.shape)
        held = resident.decoder is None
        self._buffers = [
            torch.empty(shape, dtype=torch.uint8, device=self.device) for _ in range(2 if held else 0)
        ]
        self._read: list = [None, None]  # per buffer, the CUDA event after its last conversion
        self._turn = 0

    def _images(self, records: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        host_rows = self.resident.rows(records)
        rows = torch.from_numpy(host_rows).to(self.device)
        labels = self.resident.labels.index_select(0, rows)
        if self.resident.decoder is not None:
            parts, jpeg = self.resident.stored(host_rows)
            return self.resident.decoder(parts, jpeg, records), labels
        buffer, read = self._buffers[self._turn], self._read[self._turn]
        if read is not None:
            torch.cuda.current_stream(self.device).wait_event(read)
        return torch.index_select(self.resident.images, 0, rows, out=buffer[: len(rows)]), labels

    def _converted(self) -> None:
        if not self._buffers:
            return
        if self.device.type == "cuda":
            self._read[self._turn] = torch.cuda.Event()
            self._read[self._turn].record(torch.cuda.current_stream(self.device))
        self._turn ^= 1
