"""What a bench stage is made of and how it is timed: the run's `Plan`, the benchmarked store's
`Context`, one `Figure` per method measured, and the interleaved rounds that time them."""

from __future__ import annotations

import math
import resource
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from fastload import _core
from fastload.inspect import storage
from fastload.store import PathLike, Store

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
    (mappings, pools), closed before the cold figures run (a mapped page cannot be evicted).
    `storage`: where the store lives (`fastload.inspect.storage`); on a RAM disk no epoch is
    cold, so no cold figure is measured."""

    path: str
    count: int
    shape: Tuple[int, int, int]
    stride: int
    images_offset: int  # where the image section starts in the file
    file_size: int
    sample: int  # records 0..sample-1 are the bytes every stage reads
    labels: np.ndarray
    plan: Plan
    repeats: int
    batch_size: int
    workdir: str
    cuda: bool
    resources: ExitStack
    storage: Dict[str, Any] = field(default_factory=lambda: {"in_ram": False})
    #: The store's records are encoded (format 2): every read decodes, and the stages that
    #: read the image section as an array of images (np.memmap, the copy limit) do not apply.
    compressed: bool = False

    @classmethod
    def for_store(
        cls, store: Store, *, sample: int, plan: Plan, repeats: int, batch_size: int, workdir: str, cuda: bool
    ) -> Context:
        """The context of the open `store`, for a run that reads its first `sample` records."""
        return cls(
            path=str(store.path),
            count=len(store),
            shape=store.shape,
            stride=store.stride,
            images_offset=store.images_offset,
            file_size=store.file_size,
            sample=sample,
            labels=np.array(store.labels[:sample]),
            plan=plan,
            repeats=repeats,
            batch_size=batch_size,
            workdir=workdir,
            cuda=cuda,
            resources=ExitStack(),
            storage=storage(store.path),
            compressed=store.compressed,
        )

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


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (DataLoader workers), all threads."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_rounds(ctx: Context, figures: List[Figure], progress: Callable[[str], None]) -> None:
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


def cold_note(ctx: Context) -> str:
    """Checks that eviction works for this file (nothing maps it any more, not tmpfs)."""
    _core.evict(ctx.path)
    left = resident_fraction(ctx.path)
    if left > 0.1:
        return (
            f"after eviction {100 * left:.0f}% of the file was still cached: not truly cold (a file smaller "
            "than the kernel's read-ahead comes back whole when opened; tmpfs cannot be evicted)"
        )
    return "page cache evicted before each run"
