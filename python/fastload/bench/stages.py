"""The stages that measure the machine's limits (memcpy, disk, host-to-device link) and
fastload itself (Store.gather, FastLoadDataset, DeviceLoader, DeviceStore), on the same records."""

from __future__ import annotations

import functools
from typing import Callable, List, Tuple

import numpy as np
import torch

from fastload import _core
from fastload.bench.baselines import JpegBytes, dataloader_epoch, decode_with_pillow
from fastload.bench.measure import INSTALL_EXTRA, Context, Figure, Skip
from fastload.dataset import FastLoadDataset
from fastload.device import DeviceLoader, to_device
from fastload.resident import DeviceStore
from fastload.store import Store, StoreWriter

#: JPEG quality of the compressed copy the decode stage makes of a raw store's records.
DECODE_QUALITY = 90


def bench_memcpy(ctx: Context) -> List[Figure]:
    """The ceiling for a loader that copies records, measured the way fastload copies: the
    sampled records, each a block of its own size read from the mapped store (in the page
    cache, kept mapped), a batch at a time into one reused batch-sized buffer, on every thread
    of fastload's pool with gather's own chunking (`Store.copy_in_order`). It is gather in its
    ideal order, consecutive records with nothing to look up, so no gather of the same records
    can beat it by more than noise; a numpy copy from Python threads cannot be the limit
    (each piece needs the GIL, and on 16 cores it measured a third of Store.gather). Beside
    it, one core's copy rate: numpy copying from a buffer larger than the CPU caches into a
    reused batch buffer, in pieces of about 256 KiB, whole records each (one multi-megabyte
    memcpy can take the C library's non-temporal path and bypass the cache)."""
    batch_bytes = ctx.batch_size * ctx.image_nbytes
    piece = max(1, (256 << 10) // ctx.image_nbytes) * ctx.image_nbytes
    rows = max(ctx.plan.copy_bytes // batch_bytes, 1)
    src = np.full((rows, batch_bytes), 7, dtype=np.uint8)
    out = np.zeros(batch_bytes, dtype=np.uint8)

    def copy_one() -> Tuple[float, int]:
        for row in src:
            for start in range(0, batch_bytes, piece):
                np.copyto(out[start : start + piece], row[start : start + piece])
        return rows * ctx.batch_size, src.nbytes

    figures = [Figure("memcpy", "memcpy, 1 thread", "limit", copy_one, f"numpy, {src.nbytes >> 20} MiB")]
    if ctx.compressed:  # gather's copy of compressed records decodes them: no copy to time
        return figures
    store = ctx.resources.enter_context(Store(ctx.path))
    batch = np.empty((ctx.batch_size, *ctx.shape), dtype=np.uint8)

    def copy_in_order() -> Tuple[float, int]:
        store.copy_in_order(0, ctx.sample, batch)
        return ctx.sample, ctx.sample_bytes

    threads = _core.num_threads()
    return figures + [
        Figure(
            "memcpy",
            f"memcpy, {threads} threads",
            "limit",
            copy_in_order,
            f"records in order from the mapped store into one batch of {ctx.batch_size}",
        ),
    ]


def bench_disk(ctx: Context) -> List[Figure]:
    """Sequential read of the store's file (the sampled records), cold and from the page cache."""
    length = ctx.images_offset + ctx.sample * ctx.stride
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


def _dataset_epochs(ctx: Context, order: str):
    """Makes trials that iterate a FastLoadDataset over the sampled records, one epoch per call."""
    indices = None if ctx.sample == ctx.count else np.arange(ctx.sample)

    def make_trial(store: Store):
        loader = FastLoadDataset(store, ctx.batch_size, order=order, indices=indices, seed=0)

        def epoch() -> Tuple[float, int]:
            images = 0
            for batch in loader:
                images += len(batch[0])
            return images, images * ctx.image_nbytes

        return epoch

    return make_trial


def _device_loader_epochs(ctx: Context):
    """Makes trials that iterate `DeviceLoader(FastLoadDataset, "cpu")`, one epoch per call: the
    device stage's own cost per batch (the float32 conversion on the CPU included) beside the
    dataset's, with no GPU in the way."""
    indices = None if ctx.sample == ctx.count else np.arange(ctx.sample)

    def make_trial(store: Store):
        dataset = FastLoadDataset(store, ctx.batch_size, order="random", indices=indices, seed=0)
        loader = DeviceLoader(dataset, "cpu")

        def epoch() -> Tuple[float, int]:
            images = sum(len(batch[0]) for batch in loader)
            return images, images * ctx.image_nbytes

        return epoch

    return make_trial


def _gather_and_convert(ctx: Context):
    """Makes trials that do DeviceLoader(cpu)'s work in a plain loop, one epoch per call:
    `Store.gather` of shuffled batches into a reused buffer, then `to_device(batch, "cpu")`.
    DeviceLoader's row over this one is what the stages cost beyond the work they must do."""
    batches = ctx.batches(ctx.order())
    out = np.empty((ctx.batch_size, *ctx.shape), dtype=np.uint8)
    labels = np.empty(ctx.batch_size, dtype=ctx.labels.dtype)
    images = torch.from_numpy(out)

    def make_trial(store: Store):
        def epoch() -> Tuple[float, int]:
            for idx in batches:
                store.gather(idx, out=out[: len(idx)], labels_out=labels[: len(idx)])
                to_device(images[: len(idx)], "cpu")
            return ctx.sample, ctx.sample_bytes

        return epoch

    return make_trial


def bench_dataset(ctx: Context) -> List[Figure]:
    """`FastLoadDataset` epochs over the sampled records: warm in random and block order, and
    cold (first epoch from disk) in every order, to set against a sequential read of the file;
    and `DeviceLoader(..., "cpu")` over it, warm and random, beside the same gather and float32
    conversion in a plain loop."""
    figures = []
    for measure, state, orders in (
        (_warm, "warm", ("random", "block")),
        (_cold, "cold", ("random", "block", "sequential")),
    ):
        for order in orders:
            figures.append(
                measure(ctx, "dataset", f"FastLoadDataset, {state}, {order}", _dataset_epochs(ctx, order))
            )
    figures.append(_warm(ctx, "dataset", "DeviceLoader(cpu), warm, random", _device_loader_epochs(ctx)))
    figures.append(
        _warm(ctx, "dataset", "Store.gather + to_device(cpu), warm, random", _gather_and_convert(ctx))
    )
    return figures


def bench_to_device(ctx: Context) -> List[Figure]:
    """End to end: batches arriving on the GPU as normalized float32 tensors, through the
    public device stage `fastload.DeviceLoader` (copies on their own stream, overlapped). The
    figure's `per_batch_ms` says where each batch's time went (CUDA events per stage, from
    one more epoch run untimed with timing=True after one that warms the buffers)."""
    if not ctx.cuda:
        raise Skip("CUDA is not available (torch.cuda.is_available() is False): no GPU to deliver to")
    channels = ctx.shape[2]
    options = {"mean": [0.5] * channels, "std": [0.25] * channels, "dtype": torch.float32}
    indices = None if ctx.sample == ctx.count else np.arange(ctx.sample)

    def loader(store: Store, timing: bool = False) -> DeviceLoader:
        dataset = FastLoadDataset(store, ctx.batch_size, order="random", indices=indices, seed=0)
        return DeviceLoader(dataset, "cuda", timing=timing, **options)

    def epoch(batches: DeviceLoader) -> Tuple[float, int]:
        images = sum(len(x) for x, _ in batches)
        torch.cuda.synchronize()
        return images, images * ctx.image_nbytes

    figure = _warm(
        ctx,
        "to_device",
        "FastLoadDataset + to_device, float32 on GPU",
        lambda store: functools.partial(epoch, loader(store)),
    )
    figure.note = "warm, random order, through fastload.DeviceLoader, normalized on the GPU"
    with Store(ctx.path) as store:
        timed = loader(store, timing=True)
        epoch(timed)
        epoch(timed)
        figure.extra["per_batch_ms"] = timed.timings()
    return [figure]


def bench_resident(ctx: Context) -> List[Figure]:
    """The sampled records held on the GPU (`fastload.DeviceStore`, uploaded once, untimed) and
    each batch gathered and converted there: what an epoch costs with no bus in the way, beside
    DeviceLoader's row. A sample that does not fit the GPU's free memory is named in the skip."""
    if not ctx.cuda:
        raise Skip("CUDA is not available (torch.cuda.is_available() is False): no GPU to hold the store")
    return [resident_figure(ctx, "cuda")]


def resident_figure(ctx: Context, device: str) -> Figure:
    """bench_resident's figure on `device` (the CPU stands in for the GPU in tests)."""
    channels = ctx.shape[2]
    indices = None if ctx.sample == ctx.count else np.arange(ctx.sample)
    store = ctx.resources.enter_context(Store(ctx.path))
    try:
        resident = DeviceStore(store, device, indices=indices, progress=False)
    except MemoryError as exc:
        raise Skip(str(exc)) from None
    dataset = FastLoadDataset(store, ctx.batch_size, order="random", indices=indices, seed=0)
    loader = resident.loader(dataset, mean=[0.5] * channels, std=[0.25] * channels)

    def epoch() -> Tuple[float, int]:
        images = sum(len(x) for x, _ in loader)
        if device == "cuda":
            torch.cuda.synchronize()
        return images, images * ctx.image_nbytes

    note = "random order, fastload.DeviceStore: uploaded once as uint8, normalized on the device"
    return Figure("resident", "resident, gather on device, float32", "fastload", epoch, note)


def _compressed_records(ctx: Context) -> Tuple[str, int]:
    """(a compressed store, how many of its first records the decode stage reads): the store
    itself when it is compressed, else a JPEG copy of quality DECODE_QUALITY of the sampled
    records (evenly spaced, at most the per-item loaders' count) written in the work folder."""
    count = min(ctx.sample, ctx.plan.loader_records)
    if ctx.compressed:
        return ctx.path, count
    path = f"{ctx.workdir}/compressed.fastload"
    picked = np.linspace(0, ctx.sample - 1, count).astype(np.int64)
    with (
        Store(ctx.path) as store,
        StoreWriter(path, ctx.shape, "int64", encoding="jpeg", quality=DECODE_QUALITY) as w,
    ):
        for start in range(0, count, 256):
            images, _ = store.gather(picked[start : start + 256])
            w.extend(images, np.zeros(len(images), dtype=np.int64))
    return path, count


def bench_decode(ctx: Context) -> List[Figure]:
    """Compressed records: `Store.gather` decoding JPEG records on its Rust threads into the
    batch, against the machine's decode limit, libjpeg-turbo decoding the same records on one
    thread (`Store.read_serially`; the limit is that rate times gather's threads), and
    against what a user writes without fastload: Pillow (also libjpeg-turbo) decoding the same
    bytes on one thread, and a Dataset doing so in a DataLoader of 2 workers. A raw store is judged on a JPEG copy of
    quality 90 of its records; a compressed one on its own records, and then decoding is in
    the path the verdict names."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise Skip(f"Pillow is not installed: {INSTALL_EXTRA} (or pip install pillow)") from None
    if ctx.shape[2] == 4:
        raise Skip("JPEG cannot hold 4-channel images")
    path, count = _compressed_records(ctx)
    store = ctx.resources.enter_context(Store(path))
    stored = [store.stored(i) for i in range(count)]
    jpegs = [bytes(data) for encoding, data in stored if encoding == "jpeg"]
    if not jpegs:
        raise Skip("the store's measured records are all raw: nothing to decode")
    mode = "L" if ctx.shape[2] == 1 else "RGB"
    batches = ctx.batches(np.random.default_rng(0).permutation(count))
    out = np.empty((ctx.batch_size, *ctx.shape), dtype=np.uint8)
    labels = np.empty(ctx.batch_size, dtype=store.label_dtype)
    threads = _core.num_threads()

    def gather_epoch() -> Tuple[float, int]:
        for idx in batches:
            store.gather(idx, out=out[: len(idx)], labels_out=labels[: len(idx)])
        return count, count * ctx.image_nbytes

    def decode_one_thread() -> Tuple[float, int]:
        # gather's work on one thread: the same batches, into the same batch buffer.
        for idx in batches:
            store.read_serially(idx, out[: len(idx)])
        return count, count * ctx.image_nbytes

    def pillow_one_thread() -> Tuple[float, int]:
        for jpeg in jpegs:
            decode_with_pillow(jpeg, mode)
        return len(jpegs), len(jpegs) * ctx.image_nbytes

    mean_kb = sum(map(len, jpegs)) / len(jpegs) / 1024
    source = "the store's own records" if ctx.compressed else f"a JPEG copy of quality {DECODE_QUALITY}"
    gather = Figure(
        "decode",
        "Store.gather, JPEG records, warm, random",
        "fastload",
        gather_epoch,
        f"{count:,} records of {source}, {len(jpegs):,} of them JPEG of {mean_kb:.0f} KiB mean; {threads} threads",
    )
    gather.extra.update({"decode_threads": threads, "judges_this_store": ctx.compressed, "records": count})
    return [
        Figure(
            "decode",
            "libjpeg-turbo, 1 thread",
            "limit",
            decode_one_thread,
            "fastload's decoder (libjpeg-turbo) on the calling thread: the same batches into the same buffer",
        ),
        Figure(
            "decode",
            "Pillow decode, 1 thread",
            "baseline",
            pillow_one_thread,
            f"Pillow {PIL.__version__} decoding the same JPEG bytes one after another",
        ),
        gather,
        Figure(
            "decode",
            "JPEG bytes + Pillow + DataLoader",
            "baseline",
            dataloader_epoch(ctx, JpegBytes(jpegs, mode)),
            "the same JPEG bytes decoded by Pillow in a Dataset, num_workers=2, default collate",
        ),
    ]
