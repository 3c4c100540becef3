"""Loader benchmark: one epoch of `FastLoadDataset` side by side with the physical limit
(memcpy of the same bytes), `np.memmap` fancy indexing of the same batches, and the recipe
users have today (a map-style `np.memmap` Dataset in a DataLoader with 2 workers); then cold
reads by order against a plain sequential read of the file.

    python benches/bench_loader.py [--path /tmp/fastload-bench-loader.bin] [--count 5000] [--side 384]

The measurement functions are plain and importable (`fastload bench` reuses them); each
returns seconds for one epoch.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import platform
import statistics
import struct
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fastload import FastLoadDataset, Store, StoreWriter, _core
from fastload.dataset import epoch_order

READ_CHUNK = 8 << 20


def make_store(path: Path, count: int, shape: Tuple[int, int, int], seed: int = 0) -> Path:
    """Writes `count` random-looking images (a few random tiles, rolled per image: fast to
    make, not compressible by accident) unless a store of that size is already there."""
    path = Path(path)
    if path.exists():
        with Store(path) as store:
            if len(store) == count and store.shape == tuple(shape):
                return path
    rng = np.random.default_rng(seed)
    tiles = rng.integers(0, 256, (16, *shape), dtype=np.uint8)
    with StoreWriter(path, shape, label_dtype="int64", overwrite=True) as writer:
        for start in range(0, count, 64):
            n = min(64, count - start)
            chunk = np.roll(tiles[np.arange(start, start + n) % 16], start, axis=1)
            writer.extend(chunk, np.arange(start, start + n) % 1000)
    return path


def read_file(path: Path) -> int:
    """Reads the file sequentially in 8 MiB chunks (warms the page cache; the cold baseline)."""
    buf = memoryview(bytearray(READ_CHUNK))
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                return total
            total += n


def epoch_batches(count: int, batch_size: int, seed: int = 0, epoch: int = 0) -> List[np.ndarray]:
    """The batches of FastLoadDataset's random order for (seed, epoch), so every contender reads the same ones."""
    order = epoch_order(np.arange(count, dtype=np.int64), "random", seed, epoch, 1, 1)
    return [order[i : i + batch_size] for i in range(0, count, batch_size)]


def image_section(path: Path) -> Tuple[int, int]:
    """(offset, stride) of the image section, from the header (docs/FORMAT.md)."""
    with open(path, "rb") as f:
        head = f.read(64)
    stride, offset = struct.unpack_from("<QQ", head, 40)
    return offset, stride


def time_memcpy(store: Store, batches: Sequence[np.ndarray]) -> float:
    """NumPy copies of batch-sized runs of consecutive records from the mapping into one
    preallocated buffer: the same bytes as an epoch, at the speed of a sequential memcpy."""
    images = store.images
    out = np.empty((len(batches[0]), *store.shape), dtype=np.uint8)
    start = time.perf_counter()
    first = 0
    for idx in batches:
        n = len(idx)
        np.copyto(out[:n], images[first : first + n])
        first += n
    return time.perf_counter() - start


def open_memmap(path: Path) -> np.memmap:
    """The store's image section as an N × stride `np.memmap`, as a user would map a raw file."""
    with Store(path) as store:
        count = len(store)
    offset, stride = image_section(path)
    return np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(count, stride))


def time_memmap_fancy(images: np.memmap, batches: Sequence[np.ndarray]) -> float:
    """`images[indices]` for each batch: a fresh array per batch, one thread."""
    start = time.perf_counter()
    for idx in batches:
        images[idx]
    return time.perf_counter() - start


class MemmapImages(Dataset):
    """The recipe users write today: a map-style Dataset over `np.memmap`, one record per item."""

    def __init__(self, path: Path):
        self.path = path
        with Store(path) as store:
            self.count, self.shape = len(store), store.shape
            self.labels = np.array(store.labels)
        self.offset, self.stride = image_section(path)
        self.images: Optional[np.memmap] = None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        if self.images is None:  # opened in each worker
            self.images = np.memmap(
                self.path, dtype=np.uint8, mode="r", offset=self.offset, shape=(self.count, self.stride)
            )
        image = np.array(self.images[i, : int(np.prod(self.shape))]).reshape(self.shape)
        return torch.from_numpy(image), int(self.labels[i])


def time_dataloader_recipe(path: Path, batches: Sequence[np.ndarray], num_workers: int = 2) -> float:
    """One epoch of `MemmapImages` in a DataLoader (default collate, pin_memory when CUDA is
    available), the same batches as a batch sampler; worker start-up included, as users get it."""
    loader = DataLoader(
        MemmapImages(path),
        batch_sampler=[idx.tolist() for idx in batches],
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
    )
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def time_fastload(ds: FastLoadDataset, epoch: int = 0) -> float:
    """One epoch of `ds` through `DataLoader(ds, batch_size=None)` at num_workers=0."""
    ds.set_epoch(epoch)
    start = time.perf_counter()
    for _ in DataLoader(ds, batch_size=None):
        pass
    return time.perf_counter() - start


def timed(fn: Callable, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def evict(path: Path) -> Callable[[], None]:
    """A `prepare` step that drops the store's pages from the page cache (and checks it did)."""

    def prepare() -> None:
        _core.evict(str(path))
        with Store(path) as store:
            resident, size = store.resident_bytes()
        if resident > 0.05 * size:
            raise RuntimeError(f"{path}: {resident / size:.0%} still cached after eviction (still mapped?)")

    return prepare


def cold_fastload(path: Path, batch_size: int, order: str) -> float:
    """One epoch of a freshly opened FastLoadDataset (nothing of the store mapped before)."""
    return time_fastload(FastLoadDataset(path, batch_size, order=order, seed=0))


def interleaved_medians(
    measures: Dict[str, Callable[[], float]], repeat: int, warm_up: bool = True
) -> Dict[str, float]:
    """Median seconds of each measure over `repeat` rounds, after one untimed round when
    `warm_up` (a training run's steady state: store mapped, page tables filled). Each round
    runs every measure in turn, so a shared machine's changing load hits all of them alike."""
    runs: Dict[str, List[float]] = {name: [] for name in measures}
    for round_ in range(repeat + warm_up):
        for name, measure in measures.items():
            seconds = measure()
            if round_ or not warm_up:
                runs[name].append(seconds)
    return {name: statistics.median(r) for name, r in runs.items()}


def warm_figures(path: Path, batches: Sequence[np.ndarray], batch_size: int, repeat: int) -> dict:
    """Steady-state epochs from the page cache; everything mapped here is unmapped on return."""
    read_file(path)
    with Store(path) as store:
        ds = FastLoadDataset(store, batch_size, order="random", seed=0)
        images = open_memmap(path)
        return interleaved_medians(
            {
                "memcpy (numpy, 1 thread)": lambda: time_memcpy(store, batches),
                "FastLoadDataset random": lambda: time_fastload(ds),
                "np.memmap fancy indexing": lambda: time_memmap_fancy(images, batches),
                "DataLoader(memmap Dataset, 2 workers)": lambda: time_dataloader_recipe(path, batches),
            },
            repeat,
        )


def cold_figures(path: Path, batch_size: int, repeat: int) -> dict:
    """Epochs after evicting the store from the page cache, by order, against a plain read."""
    measures = {"plain sequential read": lambda: timed(read_file, path)}
    for order in ("sequential", "block", "random"):
        measures[f"FastLoadDataset {order}"] = functools.partial(cold_fastload, path, batch_size, order)
    prepare = evict(path)

    def after_eviction(measure: Callable[[], float]) -> Callable[[], float]:
        return lambda: (prepare(), measure())[1]

    return interleaved_medians({k: after_eviction(m) for k, m in measures.items()}, repeat, warm_up=False)


def run(path: Path, count: int, side: int, batch_size: int = 64, repeat: int = 3, cold: bool = True) -> dict:
    """Every figure of the loader benchmark: {"warm"/"cold": {name: seconds per epoch}}, sizes."""
    path = make_store(path, count, (side, side, 3))
    batches = epoch_batches(count, batch_size)
    results = {"bytes": count * side * side * 3, "count": count}
    results["warm"] = warm_figures(path, batches, batch_size, repeat)
    gc.collect()  # the kernel keeps pages cached while any mapping holds them
    results["cold"] = cold_figures(path, batch_size, repeat) if cold else {}
    return results


def report(results: dict) -> str:
    """Markdown tables: images/s, GB/s and ratios to the reference of each table."""
    nbytes, count = results["bytes"], results["count"]
    lines = []
    for kind, reference in (("warm", "memcpy (numpy, 1 thread)"), ("cold", "plain sequential read")):
        figures = results[kind]
        if not figures:
            continue
        fast = figures["FastLoadDataset random"]
        lines += [
            f"| {kind} (median s/epoch) | images/s | GB/s | vs {reference} | FastLoadDataset random is |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, seconds in figures.items():
            lines.append(
                f"| {name}: {seconds:.3f} s | {count / seconds:,.0f} | {nbytes / seconds / 1e9:.2f} "
                f"| {figures[reference] / seconds:.2f}x | {seconds / fast:.2f}x faster |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", type=Path, default=Path("/tmp/fastload-bench-loader.bin"))
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--side", type=int, default=384)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-cold", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the store file afterwards")
    args = parser.parse_args()
    results = run(args.path, args.count, args.side, args.batch_size, args.repeat, cold=not args.no_cold)
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs, fastload threads {_core.num_threads()}, "
        f"torch {torch.__version__}, CUDA {torch.cuda.is_available()}; "
        f"{results['count']} images {args.side}x{args.side}x3 = {results['bytes'] / 1e9:.2f} GB, batch {args.batch_size}"
    )
    print(report(results))
    if not args.keep:
        args.path.unlink()


if __name__ == "__main__":
    main()
