"""The whole path at the seed's scale, proved by parts on a 24 GB / 2-core machine.

`small`: for each record count (default 25,000 and 250,000 records of 32x32x3), a folder of that
many PNG files: hard links to as many distinct PNGs as the smallest count (written by a process
pool; file i links to PNG i % distinct, so the 250,000 files hold 25,000 distinct images, each
10 times), then times, each in its own process (peak RSS from `os.wait4`): `fastload pack`,
`fastload info`, `fastload verify`, one epoch of FastLoadDataset in each order, the DDP plan of
8 ranks (one epoch of every rank, checked disjoint and covering), `fastload train --max-steps`,
and the tracemalloc peak per record of opening, planning an epoch, info and verify. Prints the
ratio of the largest count's figures to the smallest's: linear growth gives the count ratio for
times, much less for RSS (the interpreter is a fixed cost).

`large`: a store larger than RAM (384x384x3 records written by StoreWriter from 16 random
images, real bytes and checksums), then cold passes (the file evicted with `_core.evict` and
checked uncached first): a plain sequential read of the file in 8 MiB blocks, FastLoadDataset
epochs in sequential, block and random order, each bounded by bytes and seconds; GB/s, the
store's page-cache residency (max and last, sampled) and the process's RSS.

    PYTHONPATH=python python benches/scale.py small --json small.json [--counts 25000,250000]
    PYTHONPATH=python python benches/scale.py large --json large.json [--gb 28] [--seconds 120]

Work files go to --workdir (default ./scale-work) and are deleted at the end (--keep keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

SIDE = 32  # records of the small part: SIDE x SIDE x 3
FILES_PER_FOLDER = 1000
ORDERS = ("random", "block", "sequential")
LARGE_SHAPE = (384, 384, 3)
FREE_MARGIN = 27e9  # disk left free while the large store exists: at least 25 GB, with a margin


def run_child(argv: list) -> dict:
    """Runs `argv` to its end; wall seconds, peak RSS (os.wait4) and stdout. Fails loudly."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        code = proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait again
        out.seek(0)
        err.seek(0)
        if code != 0:
            raise SystemExit(f"{' '.join(map(str, argv))} failed ({code}):\n{err.read()[-3000:]}")
        return {
            "seconds": round(seconds, 3),
            # CPU seconds of the child and its threads: what the step costs, whatever else runs.
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
            "max_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "stdout": out.read(),
        }


def median_of(repeats: int, child, *args) -> dict:
    """The run with the median wall time of `repeats` runs of `child(*args)` (this machine is shared),
    with every run's wall time."""
    runs = sorted((child(*args) for _ in range(repeats)), key=lambda r: r["seconds"])
    return {**runs[len(runs) // 2], "runs_seconds": [r["seconds"] for r in runs]}


def python_child(code: str, *args) -> dict:
    """`run_child` of a Python snippet whose last stdout line is a JSON object (merged in)."""
    result = run_child([sys.executable, "-c", textwrap.dedent(code), *map(str, args)])
    lines = result.pop("stdout").strip().splitlines()
    return {**result, **(json.loads(lines[-1]) if lines else {})}


def fastload_child(*args) -> dict:
    """`run_child` of the fastload command; the JSON lines it prints (train --json) are kept."""
    result = run_child([sys.executable, "-m", "fastload", *map(str, args)])
    lines = [json.loads(line) for line in result.pop("stdout").splitlines() if line.startswith("{")]
    return {**result, **({"json_lines": lines} if lines else {})}


def startup_costs() -> dict:
    """What a child costs before it does anything: the fastload command (no torch) and a Python
    process importing FastLoadDataset (torch); subtracted from the children's wall times."""
    cli = fastload_child("--version")
    torch = python_child("import json; from fastload import FastLoadDataset; print(json.dumps({}))")
    return {"cli": cli, "torch": torch, "seconds": cli["seconds"] + torch["seconds"]}


# ---------------------------------------------------------------- small records, many of them


def _write_pngs(job: tuple) -> None:
    """Files `start`..`stop` (distinct: a gradient plus noise seeded by the file's number)."""
    from PIL import Image

    root, start, stop = job
    ramp = np.linspace(0, 160, SIDE, dtype=np.float32)[None, :, None]
    for i in range(start, stop):
        rng = np.random.default_rng(i)
        pixels = ramp + rng.integers(0, 96, (SIDE, SIDE, 3)) + (i % 7) * 4
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(
            Path(root) / f"{i:07}.png", compress_level=1
        )


def make_folders(work: Path, counts: list, distinct: int) -> dict:
    """One source folder and label CSV per count: file i is a hard link to generated PNG
    i % distinct. Labels are float64 (so `fastload train` runs) and follow the brightness."""
    originals = work / "png"
    originals.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = [(str(originals), s, min(s + 2500, distinct)) for s in range(0, distinct, 2500)]
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(_write_pngs, jobs))
    generated = time.perf_counter() - started
    started = time.perf_counter()
    folders = {}
    for count in counts:
        src = work / f"src{count}"
        for k in range(-(-count // FILES_PER_FOLDER)):
            (src / f"{k:04}").mkdir(parents=True, exist_ok=True)
        names = [f"{i // FILES_PER_FOLDER:04}/{i:07}.png" for i in range(count)]
        for i, name in enumerate(names):
            os.link(originals / f"{i % distinct:07}.png", src / name)
        csv = work / f"labels{count}.csv"
        csv.write_text("".join(f"{n},{(i % distinct % 7) / 7:.4f}\n" for i, n in enumerate(names)))
        folders[count] = (src, csv)
    # Written data still dirty would be flushed by the first store's fsync, inside pack's time.
    os.sync()
    return {
        "folders": folders,
        "generate_seconds": round(generated, 2),
        "link_and_sync_seconds": round(time.perf_counter() - started, 2),
    }


EPOCH = """
import json, sys, time
import numpy as np
from fastload import FastLoadDataset
path, order, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
ds = FastLoadDataset(path, batch, order=order, pin_memory=False)
started, cpu = time.perf_counter(), time.process_time()
seen = 0
for images, labels in ds:
    seen += len(labels)
seconds = time.perf_counter() - started
print(json.dumps({"records": seen, "epoch_seconds": round(seconds, 3), "epoch_cpu_seconds": round(time.process_time() - cpu, 3),
                  "img_per_s": round(seen / seconds)}))
"""

DDP = """
import json, sys, time
import numpy as np
from fastload import FastLoadDataset
path, world, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
started, cpu = time.perf_counter(), time.process_time()
shares, batches = [], set()
for rank in range(world):
    ds = FastLoadDataset(path, batch, order="block", rank=rank, world_size=world, return_indices=True,
                         pin_memory=False)
    batches.add(len(ds))
    shares.append(np.concatenate([idx.numpy() for _, _, idx in ds]))
seconds = time.perf_counter() - started
count = len(ds.indices)
together = np.concatenate(shares)
covered = np.unique(together)
assert len(batches) == 1, f"ranks yield different numbers of batches: {batches}"
assert len(covered) == count and covered[0] == 0 and covered[-1] == count - 1, "ranks miss records"
assert len(together) - count < world, f"{len(together) - count} padding records"
print(json.dumps({"ranks": world, "batches_per_rank": batches.pop(), "padding": int(len(together) - count),
                  "epoch_seconds": round(seconds, 3), "epoch_cpu_seconds": round(time.process_time() - cpu, 3)}))
"""

# tracemalloc peak of each step that touches every record (compared across counts below).
TRACE = """
import json, sys, tracemalloc
import numpy as np
from fastload import FastLoadDataset, Store, inspect as inspect_mod
from fastload.dataset.plan import epoch_order
path = sys.argv[1]
peaks = {}
def traced(name, fn):
    tracemalloc.start()
    kept = fn()
    peaks[name] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return kept
store = traced("open", lambda: Store(path))
traced("meta", lambda: store.meta)
ds = traced("dataset", lambda: FastLoadDataset(store, 256, order="block", pin_memory=False))
traced("plan_block", lambda: ds.cursor.plan.batches(ds.cursor.plan.pad(epoch_order(ds.indices, "block", 0, 0, ds.block_size,
       ds.window)), range(len(ds))))
traced("plan_random", lambda: ds.cursor.plan.batches(ds.cursor.plan.pad(epoch_order(ds.indices, "random", 0, 0, 1, 1)),
       range(len(ds))))
traced("first_batch", lambda: next(iter(ds)))
traced("info", lambda: inspect_mod.info(path))
traced("verify", lambda: inspect_mod.verify(path))
print(json.dumps({"tracemalloc_peak_bytes": peaks}))
"""


# The same for fastload.pack (the walk, the labels by path, the source names).
TRACE_PACK = """
import json, sys, tracemalloc
from fastload import pack
src, dest, csv = sys.argv[1:4]
tracemalloc.start()
report = pack(src, dest, 32, labels=csv, label_dtype="float64", quiet=True, overwrite=True)
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"tracemalloc_peak_bytes": {"pack": peak}}))
"""
CLI_STEPS = ("pack", "info", "verify")  # the command imports torch only to train


def small_part(work: Path, counts: list, steps: int, batch: int, repeats: int) -> dict:
    made = make_folders(work, counts, min(counts))
    print(f"generated {min(counts):,} PNGs in {made['generate_seconds']} s", flush=True)
    startup = median_of(repeats, startup_costs)
    per_count = {}
    for count in counts:
        src, csv = made["folders"][count]
        store = work / f"store{count}.fl"
        row = {
            "pack": median_of(
                repeats,
                fastload_child,
                "pack",
                src,
                store,
                "--size",
                SIDE,
                "--labels",
                csv,
                "--label-dtype",
                "float64",
                "--quiet",
                "--overwrite",
            )
        }
        row["store_bytes"] = store.stat().st_size
        row["info"] = median_of(repeats, fastload_child, "info", store)
        row["verify"] = median_of(repeats, fastload_child, "verify", store)
        for order in ORDERS:
            row[f"epoch_{order}"] = median_of(repeats, python_child, EPOCH, store, order, batch)
            assert row[f"epoch_{order}"]["records"] == count, row[f"epoch_{order}"]
        row["ddp_8_ranks"] = median_of(repeats, python_child, DDP, store, 8, batch)
        row["train"] = fastload_child(
            "train",
            store,
            "--max-steps",
            steps,
            "--epochs",
            1,
            "--batch-size",
            batch,
            "--device",
            "cpu",
            "--threads",
            1,
            "--json",
        )
        row["trace"] = python_child(TRACE, store)
        row["trace_pack"] = python_child(TRACE_PACK, src, work / "traced.fl", csv)
        for step, figures in row.items():
            if isinstance(figures, dict) and "seconds" in figures and not step.startswith("trace"):
                base = startup["cli" if step in CLI_STEPS else "torch"]["seconds"]
                base_cpu = startup["cli" if step in CLI_STEPS else "torch"]["cpu_seconds"]
                figures["net_seconds"] = round(figures.get("epoch_seconds", figures["seconds"] - base), 3)
                figures["net_cpu_seconds"] = round(
                    figures.get("epoch_cpu_seconds", figures["cpu_seconds"] - base_cpu), 3
                )
        per_count[count] = row
        print(
            f"{count:,} records: "
            + json.dumps({k: v.get("seconds") for k, v in row.items() if isinstance(v, dict)}),
            flush=True,
        )
    low, high = min(counts), max(counts)
    ratios = {}
    for step, figures in per_count[high].items():
        if isinstance(figures, dict) and "net_seconds" in figures:
            below, below_cpu = per_count[low][step]["net_seconds"], per_count[low][step]["net_cpu_seconds"]
            ratios[step] = {
                # Under 50 ms a ratio is noise: the step is a fixed cost there.
                "net_seconds": round(figures["net_seconds"] / below, 2) if below >= 0.05 else None,
                "net_cpu_seconds": round(figures["net_cpu_seconds"] / below_cpu, 2)
                if below_cpu >= 0.05
                else None,
                "max_rss": round(figures["max_rss_mb"] / per_count[low][step]["max_rss_mb"], 2),
            }
    # Python heap that each further record costs: arrays of int64 cost 8 bytes per array alive
    # at once; Python objects per record (str, int, tuple) 30-100 bytes each.
    marginal = {}
    for trace in ("trace", "trace_pack"):
        for step, peak in per_count[high][trace]["tracemalloc_peak_bytes"].items():
            marginal[step] = round(
                (peak - per_count[low][trace]["tracemalloc_peak_bytes"][step]) / (high - low), 1
            )
    return {
        "distinct_files": min(counts),
        "generate_seconds": made["generate_seconds"],
        "link_and_sync_seconds": made["link_and_sync_seconds"],
        "startup": startup,
        "counts": per_count,
        "ratio_high_to_low": ratios,
        "count_ratio": high / low,
        "tracemalloc_marginal_bytes_per_record": marginal,
    }


# ---------------------------------------------------------------- a store larger than RAM


def write_large(path: Path, records: int) -> dict:
    import fastload

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (16, *LARGE_SHAPE), dtype=np.uint8)
    started = time.perf_counter()
    with fastload.StoreWriter(path, LARGE_SHAPE, "float64", overwrite=True) as writer:
        for start in range(0, records, 16):
            n = min(16, records - start)
            images[:, 0, 0, 0] = np.arange(start, start + 16) % 251  # every record differs
            writer.extend(images[:n], np.arange(start, start + n, dtype=np.float64))
    seconds = time.perf_counter() - started
    size = path.stat().st_size
    return {
        "records": records,
        "bytes": size,
        "seconds": round(seconds, 1),
        "gb_per_s": round(size / seconds / 1e9, 3),
    }


COLD = """
import json, os, sys, time
import numpy as np
from fastload import FastLoadDataset, Store, _core
path, mode, limit, seconds_cap, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
_core.evict(path)
store = Store(path)
resident, size = store.resident_bytes()
# Opening reads the header, metadata and label sections (and the kernel reads ahead of them).
assert resident < max(0.01 * size, 16 << 20), f"not cold: {resident / size:.1%} cached after eviction"
samples, last_sample = [], 0.0
def sample(now):
    global last_sample
    if now - last_sample >= 2.0:
        samples.append(store.resident_bytes()[0])
        last_sample = now
started = time.perf_counter()
done = 0
if mode == "read":
    block = bytearray(8 << 20)
    with open(path, "rb", buffering=0) as f:
        while done < limit and time.perf_counter() - started < seconds_cap:
            n = f.readinto(block)
            if not n:
                break
            done += n
            sample(time.perf_counter())
else:
    for images, labels in FastLoadDataset(store, batch, order=mode, pin_memory=False):
        done += images.numel() + labels.numel() * 8
        now = time.perf_counter()
        sample(now)
        if done >= limit or now - started >= seconds_cap:
            break
seconds = time.perf_counter() - started
samples.append(store.resident_bytes()[0])
status = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith(("VmHWM", "RssAnon", "RssFile")))
print(json.dumps({"mode": mode, "bytes": done, "seconds": round(seconds, 2), "gb_per_s": round(done / seconds / 1e9, 3),
                  "resident_max_gb": round(max(samples) / 1e9, 2), "resident_last_gb": round(samples[-1] / 1e9, 2),
                  "store_gb": round(size / 1e9, 2), **{k: v.strip() for k, v in status.items()}}))
"""


def large_part(
    work: Path, gb: float, limit_gb: float, random_gb: float, seconds_cap: float, batch: int
) -> dict:
    from fastload.inspect import machine_memory

    free = shutil.disk_usage(work).free
    if gb is None:
        gb = min(32.0, (free - FREE_MARGIN) / 1e9)
    if gb * 1e9 > free - FREE_MARGIN:
        raise SystemExit(
            f"a {gb:.1f} GB store would leave under {FREE_MARGIN / 1e9:.0f} GB free ({free / 1e9:.1f} GB free)"
        )
    ram = machine_memory()
    record = int(np.prod(LARGE_SHAPE))
    path = work / "large.fl"
    written = write_large(path, int(gb * 1e9) // record)
    print(
        f"wrote {written['bytes'] / 1e9:.1f} GB in {written['seconds']} s ({written['gb_per_s']} GB/s)",
        flush=True,
    )
    passes = {}
    for mode in ("read", "sequential", "block", "random"):
        limit = (random_gb if mode == "random" else limit_gb) * 1e9
        passes[mode] = python_child(COLD, path, mode, int(limit), seconds_cap, batch)
        print(json.dumps(passes[mode]), flush=True)
    ratio = {m: round(passes[m]["gb_per_s"] / passes["read"]["gb_per_s"], 2) for m in passes}
    return {
        "ram_bytes": ram,
        "store": written,
        "store_over_ram": round(written["bytes"] / ram, 2),
        "passes": passes,
        "x_sequential_read": ratio,
    }


def machine() -> dict:
    from fastload.inspect import machine_memory

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "ram_gb": round(machine_memory() / 1e9, 1),
        "loadavg": os.getloadavg(),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("small", "large"))
    parser.add_argument("--workdir", default="scale-work")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the work files")
    parser.add_argument("--counts", default="25000,250000", help="record counts of the small part")
    parser.add_argument("--steps", type=int, default=40, help="fastload train --max-steps (small part)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="runs per small-part figure (median)")
    parser.add_argument("--gb", type=float, help="large store size (default: min(32, free disk - 27) GB)")
    parser.add_argument("--limit-gb", type=float, default=1e9, help="bytes read per cold pass (default: all)")
    parser.add_argument("--random-gb", type=float, default=4.0, help="bytes read by the cold random pass")
    parser.add_argument("--seconds", type=float, default=150.0, help="time cap per cold pass")
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine()}
    try:
        if args.part == "small":
            counts = sorted(int(c) for c in args.counts.split(","))
            report["small"] = small_part(work, counts, args.steps, args.batch_size, args.repeats)
        else:
            report["large"] = large_part(work, args.gb, args.limit_gb, args.random_gb, args.seconds, 64)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report["machine"]["finished_utc"] = time.strftime("%H:%M:%S", time.gmtime())
    text = json.dumps(report, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
