"""The loaders a user would pick instead of fastload, measured on the same records: np.memmap
fancy indexing, the np.memmap Dataset + DataLoader recipe, a JPEG folder decoded by Pillow,
LitData and MosaicML streaming."""

from __future__ import annotations

import functools
import io
import multiprocessing
import os
import warnings
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch

from fastload.bench.measure import INSTALL_EXTRA, Context, Figure, Skip
from fastload.store import Store


def no_image_array(ctx: Context) -> None:
    """Skips a stage that reads the image section as an array of images, which a compressed
    store does not hold."""
    if ctx.compressed:
        raise Skip("the store's records are compressed: there is no array of images to read this way")


def map_image_section(path: str, offset: int, count: int, stride: int) -> np.memmap:
    """The store's image section (from `offset`, after the header) as a plain N × stride
    np.memmap, the way a user without fastload maps a raw array file."""
    return np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(count, stride))


def bench_memmap(ctx: Context) -> List[Figure]:
    """np.memmap fancy indexing of shuffled batches (a new array per batch, as users write it),
    the mapping kept across runs like fastload's warm runs."""
    no_image_array(ctx)
    batches = ctx.batches(ctx.order())
    # unmapped with the trial, when the warm figures are done
    mapped = map_image_section(ctx.path, ctx.images_offset, ctx.count, ctx.stride)

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

    def __init__(self, store: Store, labels: np.ndarray):
        """The recipe over `store`'s records 0..len(labels)-1 (it keeps the layout, not the handle)."""
        self.path, self.offset, self.count = str(store.path), store.images_offset, len(store)
        self.stride, self.shape, self.labels = store.stride, store.shape, labels
        self._images: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        if self._images is None:
            self._images = map_image_section(self.path, self.offset, self.count, self.stride)
        nbytes = int(np.prod(self.shape))
        return np.array(self._images[i, :nbytes]).reshape(self.shape), self.labels[i]


class JpegBytes:
    """JPEGs held in memory, each decoded with Pillow per item to a uint8 tensor: a Dataset a
    user writes over compressed records without fastload."""

    def __init__(self, jpegs: List[bytes], mode: str):
        self.jpegs, self.mode = jpegs, mode

    def __len__(self) -> int:
        return len(self.jpegs)

    def __getitem__(self, i: int):
        return torch.from_numpy(decode_with_pillow(self.jpegs[i], self.mode).copy()), 0


def decode_with_pillow(jpeg: bytes, mode: str) -> np.ndarray:
    """One JPEG decoded by Pillow (libjpeg-turbo) to an H×W×C uint8 array."""
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as im:
        pixels = np.asarray(im.convert(mode))
    return pixels.reshape(pixels.shape[0], pixels.shape[1], -1)


class JpegFolder:
    """An ImageFolder-style dataset: decode one JPEG with Pillow per item, to a uint8 tensor."""

    def __init__(self, files: List[str], mode: str):
        self.files, self.mode = files, mode

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
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


def dataloader_epoch(ctx: Context, data) -> Callable[[], Tuple[float, int]]:
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
    no_image_array(ctx)
    count = _loader_records(ctx)
    with Store(ctx.path) as store:
        data = MemmapRecords(store, ctx.labels[:count])
    note = f"num_workers=2, default collate, {count:,} records per run" + (", pin_memory" if ctx.cuda else "")
    return [
        Figure(
            "dataloader",
            "np.memmap Dataset + DataLoader, warm",
            "baseline",
            dataloader_epoch(ctx, data),
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
        dataloader_epoch(ctx, JpegFolder(files, mode)),
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
