"""`run()`, the single implementation of `fastload bench` (the command only parses its
arguments): the stage registry, the synthetic store, and the run that sets up every stage,
times its figures and hands the rows to the report."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

import numpy as np
import torch

from fastload._checks import fspath, int_in_range, is_int
from fastload.bench.baselines import (
    bench_dataloader,
    bench_jpeg,
    bench_litdata,
    bench_memmap,
    bench_streaming,
)
from fastload.bench.machine import describe_machine
from fastload.bench.measure import Context, Figure, Plan, Skip, cold_note, run_rounds
from fastload.bench.report import (
    FASTLOAD_REFERENCE,
    limit_problem,
    memcpy_limit,
    plot,
    print_report,
    require_matplotlib,
    targets,
    verdict,
)
from fastload.bench.stages import (
    bench_dataset,
    bench_decode,
    bench_disk,
    bench_gather,
    bench_h2d,
    bench_memcpy,
    bench_resident,
    bench_to_device,
)
from fastload.files import output_target, replace_atomically
from fastload.inspect import check_batch_memory, machine_memory, memory_plan, usable_cores
from fastload.progress import Progress
from fastload.store import PathLike, Store, StoreWriter

NOISY_SPREAD_PCT = 20.0
SYNTHETIC_SHAPE = (224, 224, 3)

BENCHES: Dict[str, Callable[[Context], List[Figure]]] = {
    "memcpy": bench_memcpy,
    "disk": bench_disk,
    "h2d": bench_h2d,
    "gather": bench_gather,
    "dataset": bench_dataset,
    "to_device": bench_to_device,
    "resident": bench_resident,
    "decode": bench_decode,
    "memmap": bench_memmap,
    "dataloader": bench_dataloader,
    "jpeg": bench_jpeg,
    "litdata": bench_litdata,
    "streaming": bench_streaming,
}
STAGES = tuple(BENCHES)  # the canonical order
#: The largest image side a memory plan takes: the largest pack makes.
MAX_IMAGE_SIDE = 65535


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


def check_size_gb(size_gb) -> None:
    """Refuses a temporary store's size that is no finite positive number (``inf`` overflowed
    and ``nan`` failed deep inside as a traceback), or more than the disk it goes on holds."""
    if isinstance(size_gb, bool) or not isinstance(size_gb, (int, float)) or not 0 < size_gb < math.inf:
        raise ValueError(f"size_gb must be a finite number of GB above 0, not {size_gb!r}")
    folder = tempfile.gettempdir()
    free = shutil.disk_usage(folder).free
    if size_gb * 1e9 > free:
        raise ValueError(
            f"size_gb {size_gb:g} is more than the {free / 1e9:,.1f} GB free in {folder}, where the "
            "temporary store is written; give a smaller size_gb, or a store of your own"
        )


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
    if not is_int(repeats) or repeats < 3:
        raise ValueError(f"repeats must be at least 3 (a median needs several runs), not {repeats!r}")
    batch_size = int_in_range(batch_size, "batch_size")
    if store is not None and size_gb is not None:
        raise ValueError("give either a store or size_gb (the size of a temporary store), not both")
    if size_gb is not None:
        check_size_gb(size_gb)
    if (images is None) != (size is None):
        raise ValueError("images and size go together: a memory plan for IMAGES images of SIZE×SIZE×3")
    if images is not None:
        images = int_in_range(images, "images")
        if not is_int(size) or not 1 <= size <= MAX_IMAGE_SIDE:
            raise ValueError(
                f"size must be between 1 and {MAX_IMAGE_SIDE} pixels (as pack takes), not {size!r}"
            )
    for output, what in ((json_path, "JSON report"), (plot_path, "plot")):
        if output is not None and not Path(fspath(output, "output path")).parent.is_dir():
            raise ValueError(f"{output}: its directory does not exist (checked before the run, not after it)")
        if output is not None:
            output_target(output, what)  # the output rule, before the run (and again when written)
    if plot_path is not None:
        require_matplotlib()
    if store is not None:
        store = fspath(store, "store")
        Store(store).close()  # a bad path fails here, before any stage runs

    plan = Plan.for_run(quick)
    load_before = os.getloadavg()[0]  # other work on the machine, before this run adds its own
    progress = Progress(console, desc="fastload bench")
    workdir = tempfile.mkdtemp(prefix="fastload-bench-")
    try:
        if store is None:
            gb = size_gb if size_gb is not None else (0.064 if quick else default_size_gb(workdir))
            progress.say(f"writing a temporary {gb:.2f} GB store")
            path = str(write_synthetic_store(Path(workdir) / "bench.fastload", int(gb * 1e9)))
        else:
            path = store
        with Store(path) as s:
            if len(s) == 0:
                raise ValueError(f"{path}: the store has no records to benchmark")
            check_batch_memory(batch_size, s)
            sample = max(1, min(len(s), plan.sample_bytes // s.image_nbytes))
            ctx = Context.for_store(
                s,
                sample=sample,
                plan=plan,
                repeats=repeats,
                batch_size=batch_size,
                workdir=workdir,
                cuda=torch.cuda.is_available(),
            )
        results = _measure(ctx, stages, progress, load_before)
    finally:
        progress.close()
        shutil.rmtree(workdir, ignore_errors=True)

    if images is not None:
        memory = memory_plan(images, (size, size, 3))
    else:
        memory = memory_plan(ctx.count, ctx.shape, store_in_ram=ctx.storage["in_ram"])
    machine = describe_machine()
    if not machine["build"]["jpeg_simd"]:
        results["warnings"].append(machine["build"]["jpeg_simd_note"])
    results.update(
        {
            "machine": machine,
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
                "storage": ctx.storage,
                "load_average_before": load_before,
            },
            "memory_plan": memory,
        }
    )
    results["verdict"] = verdict(results["rows"], memory, ctx.sample_bytes, machine["last_level_cache_bytes"])
    results["targets"] = targets(results["rows"], ctx.sample_bytes)
    if json_path is not None:
        with replace_atomically(json_path, "JSON report") as f:
            f.write((json.dumps(results, indent=2) + "\n").encode("utf-8"))
    if plot_path is not None:
        plot(results, plot_path)
    if console:
        print_report(results)
    return results


def _measure(ctx: Context, stages: List[str], progress: Progress, load_before: float) -> dict:
    figures: List[Figure] = []
    skipped: Dict[str, str] = {}
    with ctx.resources:
        for number, name in enumerate(stages, 1):
            progress.say(f"[{number}/{len(stages)}] setting up {name}")
            try:
                figures.extend(BENCHES[name](ctx))
            except Skip as exc:
                skipped[name] = str(exc)
        in_ram_note = None
        if ctx.storage["in_ram"]:
            cold = [f.method for f in figures if f.cold]
            figures = [f for f in figures if not f.cold]
            if cold:
                in_ram_note = (
                    f"the store is on {ctx.storage['filesystem']} ({ctx.storage['mount_point']}), held in RAM: "
                    f"no epoch is cold, so these rows were not measured: {', '.join(cold)}"
                )
        run_rounds(ctx, [f for f in figures if not f.cold], progress.say)
        for figure in figures:
            if not figure.cold:
                figure.trial = None  # releases what the trial maps before the cold runs
    cold = [f for f in figures if f.cold]
    if cold:
        run_rounds(ctx, cold, progress.say)
        note = cold_note(ctx)
        for figure in cold:
            figure.note, figure.trial = note, None
    by_method = {f.method: f for f in figures}
    ref = next((by_method[m] for m in FASTLOAD_REFERENCE if m in by_method), None)
    rows = [f.as_dict(None, ref.images_per_s if ref else None) for f in figures]
    wrong_limit = limit_problem(rows)
    # No figure is reported as a share of a limit that does not hold.
    limit = None if wrong_limit else memcpy_limit(rows)
    for row in rows:
        row["vs_memcpy"] = row["images_per_s"] / limit["images_per_s"] if limit else None
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
        "memcpy_reference": limit["method"] if limit else None,
        "limit_problem": wrong_limit,
        "not_cold": in_ram_note,
        "warnings": noise_warnings(rows, load_before),
    }


def noise_warnings(rows: List[dict], load_before: float) -> List[str]:
    """The figures whose rounds spread beyond NOISY_SPREAD_PCT, one line each; or one line
    instead of a wall of them, with the load: that the machine was busy (its load average above
    its cores before the run began), or that a third of the figures or more were noisy."""
    noisy = [r for r in rows if r["spread_pct"] > NOISY_SPREAD_PCT]
    cores = usable_cores()
    load = f"load average {load_before:.1f} on {cores} cores before the run"
    spread = f"{len(noisy)} of {len(rows)} figures spread over {NOISY_SPREAD_PCT:.0f}% between rounds"
    advice = "rerun on an idle machine (or with more --repeats) before trusting the figures or the verdict"
    if load_before > cores:
        return [f"the machine was busy: {load}, and {spread}; {advice}"]
    if rows and len(noisy) * 3 > len(rows):
        return [f"the figures were noisy: {spread} ({load}); {advice}"]
    return [
        f"{r['method']}: runs spread {r['spread_pct']:.0f}% around the median: the machine was noisy, "
        "rerun on an idle machine (or with more --repeats) before trusting this figure"
        for r in noisy
    ]
