"""`fastload bench`: measures every stage of a rig's feeding path (memory, disk, the
host-to-device link), fastload itself and the loaders a user would pick instead, all on
the same records, and names the stage that bounds the path.

`run()` is the single implementation; the `fastload bench` command only parses its
arguments. Every figure is the median of several repetitions with its spread.
"""

from __future__ import annotations

import functools
import json
import math
import multiprocessing
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

import fastload
from fastload import _core
from fastload.cli import _gb
from fastload.store import PathLike, Store, StoreWriter, _fspath, machine_memory, memory_plan

STAGES = (
    "memcpy",
    "disk",
    "h2d",
    "gather",
    "dataset",
    "to_device",
    "memmap",
    "dataloader",
    "jpeg",
    "litdata",
    "streaming",
)
NOISY_SPREAD_PCT = 20.0
SYNTHETIC_SHAPE = (224, 224, 3)
INSTALL_EXTRA = "pip install 'fastload[bench]'"


@dataclass
class Plan:
    """How much each stage moves: full runs take minutes, `quick` ones seconds."""

    sample_bytes: int  # records 0..K-1 that every stage reads (the same bytes for all)
    copy_bytes: int  # memcpy buffer, large enough to leave the CPU caches
    loader_records: int  # per-item Python loaders (DataLoader recipe) are slow: fewer records
    jpeg_records: int
    h2d_bytes: int
    min_run_s: float  # warm runs repeat their trial to last this long

    @classmethod
    def for_run(cls, quick: bool) -> Plan:
        if quick:
            return cls(64 << 20, 64 << 20, 1024, 64, 256 << 20, 0.1)
        return cls(2 << 30, 512 << 20, 8192, 512, 2 << 30, 0.5)


@dataclass
class Figure:
    """One method to measure: `trial()` does one pass (returning images, bytes moved); the
    run fills in `repeats` timed runs of `calls` trials each. Cold figures evict the store
    before each run."""

    stage: str
    method: str
    kind: str  # "limit", "fastload" or "baseline"
    trial: Optional[Callable[[], Tuple[float, int]]]
    note: str = ""
    cold: bool = False
    calls: int = 1
    images: float = 0
    nbytes: int = 0
    seconds: List[float] = field(default_factory=list)
    cpu_seconds: List[float] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.images / statistics.median(self.seconds)

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / statistics.median(self.seconds)

    @property
    def spread_pct(self) -> float:
        """(fastest - slowest run) as % of the median rate."""
        rates = [1.0 / s for s in self.seconds]
        return 100.0 * (max(rates) - min(rates)) / statistics.median(rates)

    @property
    def cpu_us_per_image(self) -> float:
        return 1e6 * statistics.median(self.cpu_seconds) / self.images

    def as_dict(self, memcpy_rate: Optional[float], fastload_rate: Optional[float]) -> dict:
        """The figure with its ratios to the memcpy limit and to fastload, both in images/s
        (the same as bytes/s except on the host-to-device link, where float32 is 4x the bytes)."""
        return {
            "stage": self.stage,
            "method": self.method,
            "kind": self.kind,
            "images_per_s": self.images_per_s,
            "gb_per_s": self.bytes_per_s / 1e9,
            "gb_per_s_min": self.nbytes / max(self.seconds) / 1e9,
            "gb_per_s_max": self.nbytes / min(self.seconds) / 1e9,
            "spread_pct": self.spread_pct,
            "vs_memcpy": self.images_per_s / memcpy_rate if memcpy_rate else None,
            "vs_fastload": self.images_per_s / fastload_rate if fastload_rate else None,
            "cpu_us_per_image": self.cpu_us_per_image,
            "images_per_run": self.images,
            "bytes_per_run": self.nbytes,
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "note": self.note,
            **self.extra,
        }


class Skip(Exception):
    """A stage that cannot run on this machine; the message says why (and how to enable it)."""


@dataclass
class Context:
    """Facts about the benchmarked store, and `resources`: what the warm figures keep open
    (mappings, pools), closed before the cold figures run (a mapped page cannot be evicted)."""

    path: str
    count: int
    shape: Tuple[int, int, int]
    stride: int
    file_size: int
    sample: int  # records 0..sample-1 are the bytes every stage reads
    labels: np.ndarray
    plan: Plan
    repeats: int
    batch_size: int
    workdir: str
    cuda: bool
    resources: ExitStack

    @property
    def image_nbytes(self) -> int:
        h, w, c = self.shape
        return h * w * c

    @property
    def sample_bytes(self) -> int:
        return self.sample * self.image_nbytes

    def order(self, seed: int = 0) -> np.ndarray:
        return np.random.default_rng(seed).permutation(self.sample)

    def batches(self, indices: np.ndarray) -> List[np.ndarray]:
        return [indices[i : i + self.batch_size] for i in range(0, len(indices), self.batch_size)]


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. under taskset or a container)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (DataLoader workers), all threads."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _run_rounds(ctx: Context, figures: List[Figure], progress: Callable[[str], None]) -> None:
    """Times every figure `repeats` times, interleaved: each round runs every figure in turn,
    so a shared machine's changing load hits all of them alike and their ratios hold. Warm
    figures first get an untimed trial that also sizes their runs to last at least
    plan.min_run_s (a run of a few milliseconds measures the scheduler, not the copy)."""
    for figure in figures:
        if not figure.cold:
            progress(f"warming up: {figure.method}")
            t0 = time.perf_counter()
            figure.trial()
            figure.calls = max(1, math.ceil(ctx.plan.min_run_s / max(time.perf_counter() - t0, 1e-6)))
    for round_ in range(1, ctx.repeats + 1):
        for figure in figures:
            progress(f"round {round_}/{ctx.repeats}: {figure.method}")
            if figure.cold:
                _core.evict(ctx.path)
            c0, t0 = _cpu_seconds(), time.perf_counter()
            for _ in range(figure.calls):
                images, nbytes = figure.trial()
            figure.seconds.append(time.perf_counter() - t0)
            figure.cpu_seconds.append(_cpu_seconds() - c0)
            figure.images, figure.nbytes = images * figure.calls, nbytes * figure.calls


def resident_fraction(path: PathLike) -> float:
    """Share of the file in the page cache now, as seen right after opening it (which reads
    the header, and with it the kernel's read-ahead window)."""
    with Store(path) as store:
        resident, size = store.resident_bytes()
    return resident / max(size, 1)


def _cold_note(ctx: Context) -> str:
    """Checks that eviction works for this file (nothing maps it any more, not tmpfs)."""
    _core.evict(ctx.path)
    left = resident_fraction(ctx.path)
    if left > 0.1:
        return (
            f"after eviction {100 * left:.0f}% of the file was still cached: not truly cold (a file smaller "
            "than the kernel's read-ahead comes back whole when opened; tmpfs cannot be evicted)"
        )
    return "page cache evicted before each run"


# ---------------------------------------------------------------- limits


def bench_memcpy(ctx: Context) -> List[Figure]:
    """The ceiling for any loader that copies records: numpy copies from a buffer larger than
    the CPU caches into a reused batch-sized buffer (a loader's pattern), on one thread and on
    every core (numpy releases the GIL for large copies). The copies go in pieces of about
    256 KiB, whole records each, as a loader copies records: one multi-megabyte memcpy can take
    the C library's non-temporal path and bypass the cache that the batch buffer lives in."""
    threads = usable_cores()
    batch_bytes = ctx.batch_size * ctx.image_nbytes
    piece = max(1, (256 << 10) // ctx.image_nbytes) * ctx.image_nbytes
    rows = max(ctx.plan.copy_bytes // batch_bytes, threads)
    src = np.full((rows, batch_bytes), 7, dtype=np.uint8)
    batches = [np.zeros(batch_bytes, dtype=np.uint8) for _ in range(threads)]
    images = rows * ctx.batch_size

    def copy_rows(first: int, step: int) -> None:
        out = batches[first]
        for row in src[first::step]:
            for start in range(0, batch_bytes, piece):
                np.copyto(out[start : start + piece], row[start : start + piece])

    def copy_one() -> Tuple[float, int]:
        copy_rows(0, 1)
        return images, src.nbytes

    pool = ctx.resources.enter_context(ThreadPoolExecutor(threads))

    def copy_many() -> Tuple[float, int]:
        list(pool.map(copy_rows, range(threads), [threads] * threads))
        return images, src.nbytes

    note = f"{src.nbytes >> 20} MiB into batches of {ctx.batch_size}"
    return [
        Figure("memcpy", "memcpy, 1 thread", "limit", copy_one, note),
        Figure("memcpy", f"memcpy, {threads} threads", "limit", copy_many, note),
    ]


def bench_disk(ctx: Context) -> List[Figure]:
    """Sequential read of the store's file (the sampled records), cold and from the page cache."""
    length = 4096 + ctx.sample * ctx.stride
    buf = memoryview(np.empty(8 << 20, dtype=np.uint8))

    def read() -> Tuple[float, int]:
        done = 0
        with open(ctx.path, "rb", buffering=0) as f:
            while done < length:
                n = f.readinto(buf[: min(len(buf), length - done)])
                if not n:
                    break
                done += n
        return done / ctx.stride, done

    return [
        Figure("disk", "sequential read, cold", "limit", read, cold=True),
        Figure("disk", "sequential read, warm", "limit", read, "from the page cache"),
    ]


def bench_h2d(ctx: Context) -> List[Figure]:
    """Host-to-device copies of one batch: pinned vs pageable memory, uint8 vs float32
    (four times the bytes on the bus for the same images)."""
    if not ctx.cuda:
        raise Skip(
            "CUDA is not available (torch.cuda.is_available() is False): no host-to-device link to measure"
        )
    import torch

    shape = (ctx.batch_size, *ctx.shape)
    figures = []
    for dtype in (torch.uint8, torch.float32):
        device = torch.empty(shape, dtype=dtype, device="cuda")
        per_batch = device.numel() * device.element_size()
        copies = max(1, ctx.plan.h2d_bytes // per_batch)
        for pinned in (True, False):
            host = torch.ones(shape, dtype=dtype, pin_memory=pinned)

            def copy(host=host, device=device, copies=copies, per_batch=per_batch):
                for _ in range(copies):
                    device.copy_(host, non_blocking=True)
                torch.cuda.synchronize()
                return copies * ctx.batch_size, copies * per_batch

            name = f"host-to-device, {'pinned' if pinned else 'pageable'} {str(dtype).split('.')[-1]}"
            figures.append(Figure("h2d", name, "limit", copy, f"batches of {ctx.batch_size}"))
    return figures


# ---------------------------------------------------------------- fastload


def _warm(ctx: Context, stage: str, method: str, make_trial: Callable[[Store], Callable]) -> Figure:
    """Steady state, as in training: one mapping for every run, its pages in the page cache
    and in this process's page tables after the untimed first run."""
    store = ctx.resources.enter_context(Store(ctx.path))
    return Figure(stage, method, "fastload", make_trial(store), "page cache, store kept mapped")


def _cold(ctx: Context, stage: str, method: str, make_trial: Callable[[Store], Callable]) -> Figure:
    """First epoch from disk: each run maps the store afresh after evicting it."""

    def trial() -> Tuple[float, int]:
        with Store(ctx.path) as store:
            return make_trial(store)()

    return Figure(stage, method, "fastload", trial, cold=True)


def bench_gather(ctx: Context) -> List[Figure]:
    """`Store.gather` of shuffled batches into a reused buffer: the copy fastload does per batch."""
    batches = ctx.batches(ctx.order())
    out = np.empty((ctx.batch_size, *ctx.shape), dtype=np.uint8)
    labels = np.empty(ctx.batch_size, dtype=ctx.labels.dtype)

    def gather_epoch(store: Store):
        def epoch() -> Tuple[float, int]:
            for idx in batches:
                store.gather(idx, out=out[: len(idx)], labels_out=labels[: len(idx)])
            return ctx.sample, ctx.sample_bytes

        return epoch

    return [
        _warm(ctx, "gather", "Store.gather, warm, random", gather_epoch),
        _cold(ctx, "gather", "Store.gather, cold, random", gather_epoch),
    ]


def _dataset_module():
    try:
        from fastload import dataset
    except ImportError as exc:
        raise Skip(f"fastload.dataset is not available in this build ({exc})") from None
    return dataset


def _dataset_epochs(ctx: Context, order: str, deliver: Callable = lambda images: None):
    """Makes trials that iterate a FastLoadDataset over the sampled records, one epoch per
    call, handing each batch's images to `deliver`."""
    dataset = _dataset_module()
    indices = None if ctx.sample == ctx.count else np.arange(ctx.sample)

    def make_trial(store: Store):
        loader = dataset.FastLoadDataset(store, ctx.batch_size, order=order, indices=indices, seed=0)

        def epoch() -> Tuple[float, int]:
            images = 0
            for batch in loader:
                deliver(batch[0])
                images += len(batch[0])
            return images, images * ctx.image_nbytes

        return epoch

    return make_trial


def bench_dataset(ctx: Context) -> List[Figure]:
    """`FastLoadDataset` epochs over the sampled records: warm in random and block order, and
    cold (first epoch from disk) in every order, to set against a sequential read of the file."""
    figures = []
    for measure, state, orders in (
        (_warm, "warm", ("random", "block")),
        (_cold, "cold", ("random", "block", "sequential")),
    ):
        for order in orders:
            figures.append(
                measure(ctx, "dataset", f"FastLoadDataset, {state}, {order}", _dataset_epochs(ctx, order))
            )
    return figures


def bench_to_device(ctx: Context) -> List[Figure]:
    """End to end: batches arriving on the GPU as normalized float32 tensors."""
    if not ctx.cuda:
        raise Skip("CUDA is not available (torch.cuda.is_available() is False): no GPU to deliver to")
    dataset = _dataset_module()
    import torch

    channels = ctx.shape[2]
    mean, std = [0.5] * channels, [0.25] * channels

    def deliver(images) -> None:
        dataset.to_device(images, "cuda", dtype=torch.float32, mean=mean, std=std)

    make_epoch = _dataset_epochs(ctx, "random", deliver)

    def make_trial(store: Store):
        epoch = make_epoch(store)

        def synchronized() -> Tuple[float, int]:
            done = epoch()
            torch.cuda.synchronize()
            return done

        return synchronized

    figure = _warm(ctx, "to_device", "FastLoadDataset + to_device, float32 on GPU", make_trial)
    figure.note = "warm, random order, normalized on the GPU"
    return [figure]


# ---------------------------------------------------------------- baselines


def map_image_section(path: str, count: int, stride: int) -> np.memmap:
    """The store's image section (after the 4096-byte header) as a plain N × stride np.memmap,
    the way a user without fastload maps a raw array file."""
    return np.memmap(path, dtype=np.uint8, mode="r", offset=4096, shape=(count, stride))


def bench_memmap(ctx: Context) -> List[Figure]:
    """np.memmap fancy indexing of shuffled batches (a new array per batch, as users write it),
    the mapping kept across runs like fastload's warm runs."""
    batches = ctx.batches(ctx.order())
    mapped = map_image_section(
        ctx.path, ctx.count, ctx.stride
    )  # unmapped with the trial, when the warm figures are done

    def epoch() -> Tuple[float, int]:
        for idx in batches:
            batch, labels = mapped[idx], ctx.labels[idx]
        del batch, labels
        return ctx.sample, ctx.sample_bytes

    method = "np.memmap fancy indexing, warm, random"
    return [Figure("memmap", method, "baseline", epoch, "page cache, file kept mapped")]


class MemmapRecords:
    """The common map-style recipe: one record per `__getitem__` from an np.memmap opened
    lazily in each DataLoader worker. Module-level so that workers can unpickle it."""

    def __init__(self, path: str, count: int, stride: int, shape: Tuple[int, int, int], labels: np.ndarray):
        self.path, self.count, self.stride, self.shape, self.labels = path, count, stride, shape, labels
        self._images: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        if self._images is None:
            self._images = map_image_section(self.path, self.count, self.stride)
        nbytes = int(np.prod(self.shape))
        return np.array(self._images[i, :nbytes]).reshape(self.shape), self.labels[i]


class JpegFolder:
    """An ImageFolder-style dataset: decode one JPEG with Pillow per item, to a uint8 tensor."""

    def __init__(self, files: List[str], mode: str):
        self.files, self.mode = files, mode

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image

        with Image.open(self.files[i]) as im:
            pixels = np.asarray(im.convert(self.mode))
        return torch.from_numpy(pixels.reshape(pixels.shape[0], pixels.shape[1], -1).copy()), 0


def _loader_epoch(ctx: Context, loader, images_of=lambda batch: batch[0]) -> Callable[[], Tuple[float, int]]:
    """One pass over a torch-style loader, counting images. Non-persistent workers exit
    and are reaped at the end of the pass, so their CPU time is counted."""

    def epoch() -> Tuple[float, int]:
        images = 0
        for batch in loader:
            images += len(images_of(batch))
        return images, images * ctx.image_nbytes

    return epoch


def _dataloader_epoch(ctx: Context, data) -> Callable[[], Tuple[float, int]]:
    from torch.utils.data import DataLoader

    loader = DataLoader(data, batch_size=ctx.batch_size, shuffle=True, num_workers=2, pin_memory=ctx.cuda)
    return _loader_epoch(ctx, loader)


def _loader_records(ctx: Context) -> int:
    """How many records the per-item loaders (DataLoader recipe, LitData, streaming) read per run."""
    return min(ctx.sample, ctx.plan.loader_records)


def _record_chunks(ctx: Context, count: int, chunk: int = 256):
    """Yields (images, labels) of records 0..count-1 in chunks, to write the other loaders' formats."""
    with Store(ctx.path) as store:
        for start in range(0, count, chunk):
            yield store.gather(np.arange(start, min(count, start + chunk)))


def bench_dataloader(ctx: Context) -> List[Figure]:
    """The np.memmap Dataset in a torch DataLoader (2 workers, default collate) recipe."""
    count = _loader_records(ctx)
    data = MemmapRecords(ctx.path, ctx.count, ctx.stride, ctx.shape, ctx.labels[:count])
    note = f"num_workers=2, default collate, {count:,} records per run" + (", pin_memory" if ctx.cuda else "")
    return [
        Figure(
            "dataloader",
            "np.memmap Dataset + DataLoader, warm",
            "baseline",
            _dataloader_epoch(ctx, data),
            note,
        )
    ]


def _write_jpegs(ctx: Context, folder: Path) -> Tuple[List[str], str]:
    from PIL import Image

    channels = ctx.shape[2]
    if channels == 4:
        raise Skip("JPEG cannot hold 4-channel images")
    mode = "L" if channels == 1 else "RGB"
    count = min(ctx.sample, ctx.plan.jpeg_records)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    with Store(ctx.path) as store:
        for i in np.linspace(0, ctx.sample - 1, count).astype(np.int64).tolist():
            image, _ = store.gather([i])
            path = folder / f"{i:08d}.jpg"
            Image.fromarray(image[0].squeeze(axis=2) if channels == 1 else image[0]).save(path, quality=90)
            files.append(str(path))
    return files, mode


def bench_jpeg(ctx: Context) -> List[Figure]:
    """A folder of JPEGs decoded by Pillow in a DataLoader, as an ImageFolder pipeline does."""
    try:
        import PIL
    except ImportError:
        raise Skip(
            f"Pillow is not installed: {INSTALL_EXTRA} (or pip install pillow / pillow-simd)"
        ) from None
    files, mode = _write_jpegs(ctx, Path(ctx.workdir) / "jpeg")
    mean_kb = sum(os.path.getsize(f) for f in files) / len(files) / 1024
    simd = " (Pillow-SIMD)" if ".post" in PIL.__version__ else ""
    note = f"{len(files)} JPEGs of quality 90, {mean_kb:.0f} KiB each, Pillow {PIL.__version__}{simd}, num_workers=2"
    figure = Figure(
        "jpeg",
        "JPEG folder + Pillow + DataLoader",
        "baseline",
        _dataloader_epoch(ctx, JpegFolder(files, mode)),
        note,
    )
    figure.extra["jpeg_bytes_mean"] = mean_kb * 1024
    return [figure]


def litdata_records(span: Tuple[int, int], path: str):
    """LitData `optimize` input function: the records of one span of a store (module-level
    so that LitData's worker processes can unpickle it)."""
    with Store(path) as store:
        images, labels = store.gather(np.arange(*span))
    for image, label in zip(images, labels.tolist()):
        yield {"image": image, "label": label}


def bench_litdata(ctx: Context) -> List[Figure]:
    """LitData: the records optimized into its chunk format, read by StreamingDataLoader."""
    try:
        import litdata
    except ImportError:
        raise Skip("LitData is not installed: pip install litdata") from None
    count = _loader_records(ctx)
    out = str(Path(ctx.workdir) / "litdata")
    spans = [(start, min(count, start + 256)) for start in range(0, count, 256)]
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        litdata.optimize(
            fn=functools.partial(litdata_records, path=ctx.path),
            inputs=spans,
            output_dir=out,
            chunk_bytes="64MB",
            num_workers=1,
            start_method="fork",
            verbose=False,
        )
    finally:
        # optimize() sets the start method process-wide; left as it sets it, every later
        # DataLoader worker would re-import torch.
        multiprocessing.set_start_method(start_method, force=True)
    loader = litdata.StreamingDataLoader(
        litdata.StreamingDataset(out, shuffle=True),
        batch_size=ctx.batch_size,
        num_workers=2,
        pin_memory=ctx.cuda,
    )
    note = f"litdata {litdata.__version__}, num_workers=2, {count:,} records per run"
    epoch = _loader_epoch(ctx, loader, lambda batch: batch["image"])
    return [Figure("litdata", "LitData StreamingDataLoader, warm", "baseline", epoch, note)]


def bench_streaming(ctx: Context) -> List[Figure]:
    """MosaicML streaming: the records written as MDS shards, read by StreamingDataset in a DataLoader."""
    try:
        import streaming
        from streaming.base.util import clean_stale_shared_memory
    except ImportError:
        raise Skip("MosaicML streaming is not installed: pip install mosaicml-streaming") from None
    from torch.utils.data import DataLoader

    count = _loader_records(ctx)
    out = str(Path(ctx.workdir) / "mds")
    columns = {"image": "ndarray:uint8:" + ",".join(map(str, ctx.shape)), "label": str(ctx.labels.dtype)}
    with streaming.MDSWriter(out=out, columns=columns, size_limit="64mb") as writer:
        for images, labels in _record_chunks(ctx, count):
            for image, label in zip(images, labels):
                writer.write({"image": image, "label": label})
    data = streaming.StreamingDataset(local=out, shuffle=True, batch_size=ctx.batch_size)
    loader = DataLoader(data, batch_size=ctx.batch_size, num_workers=2, pin_memory=ctx.cuda)
    ctx.resources.callback(clean_stale_shared_memory)
    # Its samples are read-only arrays; default collate warns about each in every worker.
    ctx.resources.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    note = f"mosaicml-streaming {streaming.__version__}, num_workers=2, {count:,} records per run"
    epoch = _loader_epoch(ctx, loader, lambda batch: batch["image"])
    return [Figure("streaming", "MosaicML StreamingDataset + DataLoader, warm", "baseline", epoch, note)]


BENCHES: Dict[str, Callable[[Context], List[Figure]]] = {
    "memcpy": bench_memcpy,
    "disk": bench_disk,
    "h2d": bench_h2d,
    "gather": bench_gather,
    "dataset": bench_dataset,
    "to_device": bench_to_device,
    "memmap": bench_memmap,
    "dataloader": bench_dataloader,
    "jpeg": bench_jpeg,
    "litdata": bench_litdata,
    "streaming": bench_streaming,
}


# ---------------------------------------------------------------- the run


def describe_machine() -> dict:
    """CPU, cores, RAM, GPU and library versions, recorded with every figure."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import torch

    try:
        import PIL

        pillow = PIL.__version__
    except ImportError:
        pillow = None
    cuda = torch.cuda.is_available()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "fastload_threads": _core.num_threads(),
        "ram_bytes": machine_memory(),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "platform": platform.platform(),
        "versions": {
            "python": platform.python_version(),
            "fastload": fastload.__version__,
            "numpy": np.__version__,
            "torch": torch.__version__,
            "pillow": pillow,
        },
    }


def parse_stages(only: Optional[Iterable[str] | str]) -> List[str]:
    """The stages to run, in the canonical order; `only` may be a comma-separated string."""
    if only is None:
        return list(STAGES)
    names = [s.strip() for s in (only.split(",") if isinstance(only, str) else only) if s.strip()]
    unknown = [s for s in names if s not in STAGES]
    if unknown or not names:
        raise ValueError(
            f"unknown stage(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(STAGES)}"
        )
    return [s for s in STAGES if s in names]


def default_size_gb(workdir: str) -> float:
    """A synthetic store that fits: at most 2 GB, an eighth of RAM and a quarter of free disk."""
    free = shutil.disk_usage(workdir).free
    return min(2.0, machine_memory() / 8 / 1e9, free / 4 / 1e9)


def write_synthetic_store(path: PathLike, size_bytes: int, shape=SYNTHETIC_SHAPE, seed: int = 0) -> Path:
    """A store of photo-like images (smooth blocks plus noise, so JPEG sizes are realistic),
    with 10 classes, holding at least `size_bytes` of images."""
    h, w, c = shape
    count = max(1, -(-size_bytes // (h * w * c)))
    rng = np.random.default_rng(seed)
    with StoreWriter(path, shape, label_dtype="int64", meta={"synthetic": "fastload bench"}) as writer:
        for start in range(0, count, 256):
            n = min(256, count - start)
            coarse = rng.integers(0, 224, (n, -(-h // 16), -(-w // 16), c), dtype=np.uint8)
            images = coarse.repeat(16, axis=1).repeat(16, axis=2)[:, :h, :w]
            images += rng.integers(0, 32, images.shape, dtype=np.uint8)
            writer.extend(images, np.arange(start, start + n) % 10)
    return Path(path)


class Progress:
    """Says which stage runs: a rich spinner on a terminal, plain lines on stderr otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._status = None
        if enabled and sys.stderr.isatty():
            try:
                from rich.console import Console

                self._status = Console(stderr=True).status("fastload bench")
                self._status.start()
            except ImportError:
                pass

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        if self._status is not None:
            self._status.update(f"fastload bench: {message}")
        else:
            print(f"fastload bench: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()


def _reference(rows: List[dict], *methods: str) -> Optional[dict]:
    for method in methods:
        for row in rows:
            if row["method"].startswith(method):
                return row
    return None


FASTLOAD_REFERENCE = ("FastLoadDataset, warm, random", "Store.gather, warm, random")


def _memcpy_limit(rows: List[dict]) -> Optional[dict]:
    """The faster of the memcpy figures: the machine's copy bandwidth."""
    return max((r for r in rows if r["stage"] == "memcpy"), key=lambda r: r["gb_per_s"], default=None)


def _paired_ratio(row: dict, other: dict) -> Optional[float]:
    """Median over rounds of row's rate / other's rate in the same round: runs of one round
    ran minutes apart at most, so this ratio moves less with the machine's speed than the
    ratio of the medians does. None when the figures lack per-run times."""
    a, b = row.get("seconds") or [], other.get("seconds") or []
    if not a or len(a) != len(b):
        return None
    per_run = [(row["images_per_run"] / ta) / (other["images_per_run"] / tb) for ta, tb in zip(a, b)]
    return statistics.median(per_run)


# The speed targets are set for epochs over at least this many bytes (far beyond any CPU
# cache, and long enough that an epoch's start-up does not count): a --quick run's short
# epochs of 64 MB are reported against them but not judged.
TARGET_MIN_BYTES = 2_000_000_000


def _targets(rows: List[dict], measured_bytes: int) -> List[dict]:
    """The project's speed targets, checked against this run's figures (the ratio of the
    medians decides; the median of per-round ratios is given beside it), judged only when
    the run read at least TARGET_MIN_BYTES."""
    ref = _reference(rows, *FASTLOAD_REFERENCE)
    checks = [
        ("fastload >= 85% of memcpy", 0.85, _memcpy_limit(rows)),
        ("fastload >= 4x the np.memmap DataLoader recipe", 4.0, _reference(rows, "np.memmap Dataset")),
        ("fastload >= 1.5x np.memmap fancy indexing", 1.5, _reference(rows, "np.memmap fancy")),
    ]
    targets = []
    for name, goal, other in checks:
        if ref is None or other is None:
            continue
        ratio = ref["images_per_s"] / other["images_per_s"]
        targets.append(
            {
                "target": name,
                "fastload": ref["method"],
                "against": other["method"],
                "ratio": ratio,
                "paired_ratio": _paired_ratio(ref, other),
                "met": ratio >= goal,
                "judged": measured_bytes >= TARGET_MIN_BYTES,
            }
        )
    return targets


def _rate(row: Optional[dict]) -> str:
    return f"{row['images_per_s']:,.0f} img/s" if row else "?"


def verdict(rows: List[dict], plan: dict) -> str:
    """Names the narrowest stage of the path from storage to the training step, for the
    dataset of the memory plan `plan` (the store's, or the one the user plans)."""
    loader = _reference(rows, *FASTLOAD_REFERENCE)
    if loader is None:
        return "no fastload stage ran: nothing to compare the limits with"
    memcpy = _memcpy_limit(rows)
    disk = _reference(rows, "sequential read, cold")
    cold = _reference(rows, "FastLoadDataset, cold, random", "Store.gather, cold, random")
    f32 = _reference(rows, "host-to-device, pinned float32")
    u8 = _reference(rows, "host-to-device, pinned uint8")
    end_to_end = _reference(rows, "FastLoadDataset + to_device")
    fits = plan["uint8_bytes"] <= 0.8 * plan["ram_bytes"]
    parts = [f"the loader ({loader['method']}) delivers {_rate(loader)}"]
    path = [("the loader", loader)]
    if memcpy:
        parts[0] += (
            f", {100 * loader['images_per_s'] / memcpy['images_per_s']:.0f}% of the {_rate(memcpy)} memcpy limit"
        )
        path.append(("memory bandwidth", memcpy))
    if f32 and u8:
        advice = "send uint8 (fastload.to_device converts on the GPU)"
        if u8["images_per_s"] < loader["images_per_s"]:
            advice = "the link bounds the path even as uint8"
        elif f32["images_per_s"] >= loader["images_per_s"]:
            advice = "the link keeps up either way"
        parts.append(
            f"your host-to-device link carries {_rate(f32)} as float32 and {_rate(u8)} as uint8: {advice}"
        )
        path.append(("the host-to-device link (uint8)", u8))
    else:
        parts.append("no GPU here, so the host-to-device link was not measured")
    if end_to_end:
        parts.append(f"end to end, normalized float32 batches reach the GPU at {_rate(end_to_end)}")
    if cold and disk:
        parts.append(f"a cold epoch delivers {_rate(cold)}, the disk reads {_rate(disk)} sequentially")
        if not fits:
            path.append(("the disk (the store does not fit in RAM)", disk))
        elif disk["images_per_s"] < loader["images_per_s"]:
            parts.append("the store fits in RAM, so the disk bounds only the first epoch")
    name, narrowest = min(path, key=lambda stage: stage[1]["images_per_s"])
    parts.append(f"the narrowest stage is {name}, at {_rate(narrowest)}")
    return "; ".join(parts) + "."


def run(
    store: Optional[PathLike] = None,
    size_gb: Optional[float] = None,
    quick: bool = False,
    only: Optional[Iterable[str] | str] = None,
    json_path: Optional[PathLike] = None,
    plot_path: Optional[PathLike] = None,
    images: Optional[int] = None,
    size: Optional[int] = None,
    repeats: int = 3,
    batch_size: int = 64,
    console: bool = True,
) -> dict:
    """Benchmarks the feeding path on `store` (or on a temporary synthetic store of
    `size_gb`, removed afterwards) and returns every figure, the memory plan and a verdict.

    Cold stages evict the store from the page cache. `images`/`size` plan memory for a
    dataset of that many size×size×3 images instead of the store's.
    """
    stages = parse_stages(only)
    if repeats < 3:
        raise ValueError(f"repeats must be at least 3 (a median needs several runs), not {repeats}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, not {batch_size}")
    if store is not None and size_gb is not None:
        raise ValueError("give either a store or size_gb (the size of a temporary store), not both")
    if size_gb is not None and size_gb <= 0:
        raise ValueError(f"size_gb must be positive, not {size_gb}")
    if (images is None) != (size is None):
        raise ValueError("images and size go together: a memory plan for IMAGES images of SIZE×SIZE×3")
    if images is not None and (images < 1 or size < 1):
        raise ValueError(f"images and size must be positive, not {images} and {size}")
    for output in (json_path, plot_path):
        if output is not None and not Path(_fspath(output, "output path")).parent.is_dir():
            raise ValueError(f"{output}: its directory does not exist (checked before the run, not after it)")
    if plot_path is not None:
        _require_matplotlib()
    if store is not None:
        store = _fspath(store, "store")
        Store(store).close()  # a bad path fails here, before any stage runs

    import torch

    plan = Plan.for_run(quick)
    progress = Progress(console)
    workdir = tempfile.mkdtemp(prefix="fastload-bench-")
    try:
        if store is None:
            gb = size_gb if size_gb is not None else (0.064 if quick else default_size_gb(workdir))
            progress(f"writing a temporary {gb:.2f} GB store")
            path = str(write_synthetic_store(Path(workdir) / "bench.fastload", int(gb * 1e9)))
        else:
            path = store
        with Store(path) as s:
            if len(s) == 0:
                raise ValueError(f"{path}: the store has no records to benchmark")
            sample = max(1, min(len(s), plan.sample_bytes // s.image_nbytes))
            ctx = Context(
                path=path,
                count=len(s),
                shape=s.shape,
                stride=s._core.stride,
                file_size=s.file_size,
                sample=sample,
                labels=np.array(s.labels[:sample]),
                plan=plan,
                repeats=repeats,
                batch_size=batch_size,
                workdir=workdir,
                cuda=torch.cuda.is_available(),
                resources=ExitStack(),
            )
        results = _measure(ctx, stages, progress)
    finally:
        progress.close()
        shutil.rmtree(workdir, ignore_errors=True)

    memory = memory_plan(images, (size, size, 3)) if images is not None else memory_plan(ctx.count, ctx.shape)
    results.update(
        {
            "machine": describe_machine(),
            "config": {
                "store": None if store is None else str(Path(store).resolve()),
                "temporary_store": store is None,
                "records": ctx.count,
                "shape": list(ctx.shape),
                "image_bytes": ctx.image_nbytes,
                "records_measured": ctx.sample,
                "file_bytes": ctx.file_size,
                "repeats": repeats,
                "batch_size": batch_size,
                "quick": quick,
                "stages": stages,
            },
            "memory_plan": memory,
        }
    )
    results["verdict"] = verdict(results["rows"], memory)
    results["targets"] = _targets(results["rows"], ctx.sample_bytes)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    if plot_path is not None:
        plot(results, plot_path)
    if console:
        print_report(results)
    return results


def _measure(ctx: Context, stages: List[str], progress: Progress) -> dict:
    figures: List[Figure] = []
    skipped: Dict[str, str] = {}
    with ctx.resources:
        for number, name in enumerate(stages, 1):
            progress(f"[{number}/{len(stages)}] setting up {name}")
            try:
                figures.extend(BENCHES[name](ctx))
            except Skip as exc:
                skipped[name] = str(exc)
        _run_rounds(ctx, [f for f in figures if not f.cold], progress)
        for figure in figures:
            if not figure.cold:
                figure.trial = None  # releases what the trial maps before the cold runs
    cold = [f for f in figures if f.cold]
    if cold:
        _run_rounds(ctx, cold, progress)
        note = _cold_note(ctx)
        for figure in cold:
            figure.note, figure.trial = note, None
    by_method = {f.method: f for f in figures}
    memcpy = max((f for f in figures if f.stage == "memcpy"), key=lambda f: f.bytes_per_s, default=None)
    ref = next((by_method[m] for m in FASTLOAD_REFERENCE if m in by_method), None)
    rows = [
        f.as_dict(memcpy.images_per_s if memcpy else None, ref.images_per_s if ref else None) for f in figures
    ]
    noisy = [
        f"{r['method']}: runs spread {r['spread_pct']:.0f}% around the median: the machine was noisy, "
        "rerun on an idle machine (or with more --repeats) before trusting this figure"
        for r in rows
        if r["spread_pct"] > NOISY_SPREAD_PCT
    ]
    stage_status = {
        name: (
            {"status": "skipped", "reason": skipped[name]}
            if name in skipped
            else {"status": "ok", "methods": [r["method"] for r in rows if r["stage"] == name]}
        )
        for name in stages
    }
    return {
        "stages": stage_status,
        "rows": rows,
        "fastload_reference": ref.method if ref else None,
        "memcpy_reference": memcpy.method if memcpy else None,
        "warnings": noisy,
    }


# ---------------------------------------------------------------- output


def _require_matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(f"--plot needs matplotlib: {INSTALL_EXTRA}") from None
    return plt


KIND_COLOURS = {"limit": "#9e9e9e", "fastload": "#2e7d32", "baseline": "#ef6c00"}


def plot(results: dict, path: PathLike) -> Path:
    """A horizontal bar chart of GB/s per method on a log scale (loaders differ by orders of
    magnitude), limits in grey, fastload in green, whiskers from the slowest to the fastest run."""
    plt = _require_matplotlib()
    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.8))
    y = np.arange(len(rows))[::-1]
    rates = np.array([r["gb_per_s"] for r in rows])
    slowest = np.array([r["gb_per_s_min"] for r in rows])
    fastest = np.array([r["gb_per_s_max"] for r in rows])
    ax.barh(y, rates, color=[KIND_COLOURS[r["kind"]] for r in rows])
    ax.errorbar(
        rates, y, xerr=[rates - slowest, fastest - rates], fmt="none", ecolor="black", capsize=2, lw=0.8
    )
    for yi, top, r in zip(y, fastest, rows):
        ax.text(top * 1.08, yi, f"{r['images_per_s']:,.0f} img/s", va="center", fontsize=7)
    memcpy = _memcpy_limit(rows)
    if memcpy:
        ax.axvline(memcpy["gb_per_s"], color="#616161", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlim(min(slowest.min(), 0.01) / 2, fastest.max() * 4)
    ax.set_yticks(y)
    ax.set_yticklabels([r["method"] for r in rows], fontsize=8)
    ax.set_xlabel("GB/s, log scale (median of the runs; whiskers: slowest to fastest; dashed: memcpy limit)")
    machine = results["machine"]
    h, w, c = results["config"]["shape"]
    ax.set_title(
        f"fastload bench: {h}x{w}x{c} uint8 records, {machine['usable_cores']} cores, {machine['gpu'] or 'no GPU'}",
        fontsize=10,
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in KIND_COLOURS.values()]
    ax.legend(handles, list(KIND_COLOURS), loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


COLUMNS = ("method", "img/s", "GB/s", "spread", "x memcpy", "x fastload", "CPU us/img")


def table_rows(results: dict) -> List[Tuple[str, ...]]:
    """The figures as text cells, one tuple per method, in COLUMNS order."""

    def ratio(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.2f}"

    return [
        (
            r["method"],
            f"{r['images_per_s']:,.0f}",
            f"{r['gb_per_s']:.2f}",
            f"{r['spread_pct']:.0f}%",
            ratio(r["vs_memcpy"]),
            ratio(r["vs_fastload"]),
            "-" if r["kind"] == "limit" else f"{r['cpu_us_per_image']:,.0f}",
        )
        for r in results["rows"]
    ]


def report_lines(results: dict) -> List[str]:
    """Everything after the table: skipped stages, memory plan, targets, verdict, warnings."""
    lines = [
        f"skipped {name}: {s['reason']}" for name, s in results["stages"].items() if s["status"] == "skipped"
    ]
    m = results["memory_plan"]
    h, w, c = m["shape"]
    lines.append(
        f"memory plan: {m['images']:,} images of {h}x{w}x{c} take {_gb(m['uint8_bytes'])} as uint8 and "
        f"{_gb(m['float32_bytes'])} as float32; this machine's {_gb(m['ram_bytes'])} RAM holds "
        f"{m['fit_in_ram_uint8']:,} as uint8, {m['fit_in_ram_float32']:,} as float32"
    )
    for t in results["targets"]:
        paired = "" if t.get("paired_ratio") is None else f" (median of per-round ratios {t['paired_ratio']:.2f}x)"
        if t["judged"]:
            outcome = "met" if t["met"] else "MISSED"
        else:
            measured = results["config"]["records_measured"] * results["config"]["image_bytes"]
            outcome = f"not judged: the targets hold for epochs over >= {_gb(TARGET_MIN_BYTES)}, this run read {_gb(measured)}"
        lines.append(f"target {t['target']}: {t['ratio']:.2f}x{paired}, {outcome}")
    lines.append(f"verdict: {results['verdict']}")
    lines.extend(f"warning: {w}" for w in results["warnings"])
    return lines


def print_report(results: dict) -> None:
    cells = table_rows(results)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(row[i]) for row in [COLUMNS, *cells]) for i in range(len(COLUMNS))]
        for row in [COLUMNS, *cells]:
            print(
                "  ".join(
                    cell.ljust(wd) if i == 0 else cell.rjust(wd)
                    for i, (cell, wd) in enumerate(zip(row, widths))
                )
            )
    else:
        table = Table(title="fastload bench (medians)")
        for i, name in enumerate(COLUMNS):
            if i == 0:  # on a narrow terminal the method names wrap, never the figures
                table.add_column(name)
            else:
                table.add_column(name, justify="right", no_wrap=True, min_width=max(len(r[i]) for r in cells))
        for row in cells:
            table.add_row(*row)
        Console(width=None if sys.stdout.isatty() else 160).print(table)
    for line in report_lines(results):
        print(line)
