"""Benchmark of `fastload.fit_many`: N small-cnn runs trained at once on one stream of batches,
against what a user does today, on the same store (records of SIDExSIDEx3, float labels), in
four modes:

- fit_many: one process, `fastload train --runs N` (`fastload.fit_many`);
- fit_many --stack: the same, the runs' forward and backward passes vmapped as one model;
- separate: N `fastload train` processes started at once (each gathers, moves and trains alone);
- one after another: N `fastload train` processes, each started when the previous one ended.

Per mode and N, the median of --repeats:

- model-images/s: the training images of every run's every epoch, over the training time. Each
  process times its own training (its `train_many`: the epochs and their validation; the
  interpreter's start-up, opening the store and building the models are not counted): the one
  process's time for fit_many, the first start to the last end for separate processes, the
  sum for one after another;
- GPU busy: nvidia-smi's utilization.gpu, polled on a thread every 0.2 s and averaged over the
  samples taken while a run trained ("n/a" off CUDA or without nvidia-smi);
- GPU memory per run: each process's torch.cuda.max_memory_allocated over its last epoch
  (train_many resets the peak every epoch), divided by its runs;
- bytes gathered (and moved to the device) per model-image: fit_many gathers each batch once
  for all its runs; peak RSS, summed over processes running at once.

The targets (#25): at N=4, fit_many gives at least 2x the throughput of separate processes;
--stack at N=8 at least 6x its N=1. A child that fails is reported with its command, exit
status and stderr; the other measurements go on and the bench exits 1.

With --amp bf16 the runs train under bf16 autocast; the trainer stacks only runs without amp
(`stacked.stack_key`), so "fit_many --stack" then steps its runs one by one, as fit_many does.
On CUDA the models' convolutions and the batches are always channels_last (the trainer's
layout; there is no option to turn it off).

On a GPU, #25's store of the user's 384x384x3 records (sizes for a 15-minute device budget in
device_check.sh):
    python3 benches/bench_fit_many.py --device cuda --side 384 --size-gb 8 --counts 1,2,4,8 \\
        --epochs 1 --batch-size 256 --repeats 1 --amp bf16 --json fit_many.json
On the CPU:
    python3 benches/bench_fit_many.py [--counts 1,2,4] [--records 2048] [--side 16] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np

MODES = ("fit_many", "fit_many --stack", "separate", "one after another")
POOL = 512  # distinct random images the store's records cycle through
GPU_POLL_S = 0.2

# Run by each child: `fastload train` as the CLI runs it, its training timed (the train_many
# that fit_many calls, and the one fit calls through loop.train), its report written to a
# file of its own (argv[1]) so that nothing the run prints can be mistaken for it.
CHILD = r"""
import json, resource, sys, time
import torch
from fastload import cli, train
from fastload.train import loop

windows = []


def timed(train_many):
    def run(*args, **kwargs):
        started = time.time()
        try:
            return train_many(*args, **kwargs)
        finally:
            windows.append([started, time.time()])

    return run


train.train_many = timed(train.train_many)
loop.train_many = timed(loop.train_many)
rc = cli.main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(
        {
            "rc": rc,
            "windows": windows,
            "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "gpu_memory": torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else None,
        },
        f,
    )
sys.exit(rc)
"""


class ChildFailed(Exception):
    """A benchmark child exited non-zero or without its report; the message shows its command,
    exit status and stderr."""


@dataclass
class Child:
    command: List[str]  # what a user would type: fastload train ...
    proc: subprocess.Popen
    report: Path
    stdout: Path
    stderr: Path


def make_store(path: str, records: int, side: int) -> None:
    """A store of ``records`` SIDExSIDEx3 records cycling through a pool of random images (so a
    store of many GB is written at the disk's speed, not drawn at the generator's); label: the
    image's mean brightness."""
    from fastload.store import StoreWriter

    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, (min(POOL, records), side, side, 3), dtype=np.uint8)
    brightness = pool.reshape(len(pool), -1).mean(1) / 255.0
    with StoreWriter(path, (side, side, 3)) as writer:
        for start in range(0, records, len(pool)):
            n = min(len(pool), records - start)
            writer.extend(pool[:n], brightness[:n])


def start(argv: List[str], workdir: str) -> Child:
    """Starts ``fastload train ARGV`` in a child interpreter (this one: sys.executable), its
    output into files (a pipe left unread could block it)."""
    files = tempfile.mkdtemp(dir=workdir, prefix="child-")
    report, stdout, stderr = (Path(files) / name for name in ("report.json", "stdout", "stderr"))
    with open(stdout, "w") as out, open(stderr, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(report), *argv], stdout=out, stderr=err)
    return Child(["fastload", *argv], proc, report, stdout, stderr)


def finish(child: Child, timeout: Optional[float]) -> dict:
    """Waits for ``child`` (killed after ``timeout`` seconds); its report, with the epoch lines
    it printed (``epochs``). Raises ChildFailed naming its command, exit status and stderr."""
    try:
        status = child.proc.wait(timeout=timeout)
        why = f"exit status {status}"
    except subprocess.TimeoutExpired:
        child.proc.kill()
        status = child.proc.wait()
        why = f"killed after {timeout:g} s (exit status {status})"
    if status != 0 or not child.report.exists():
        stderr = child.stderr.read_text(errors="replace").strip() or "(nothing on stderr)"
        raise ChildFailed(f"command: {shlex.join(child.command)}\n{why}\nstderr:\n{stderr}")
    report = json.loads(child.report.read_text())
    lines = [json.loads(line) for line in child.stdout.read_text().splitlines() if line.startswith("{")]
    report["epochs"] = [line for line in lines if "images_per_s" in line]
    return report


def finish_all(children: List[Child], timeout: Optional[float]) -> List[dict]:
    """Waits for every child, even after one failed; ChildFailed for the failed ones together."""
    reports, failures = [], []
    for child in children:
        try:
            reports.append(finish(child, timeout))
        except ChildFailed as exc:
            failures.append(str(exc))
    if failures:
        raise ChildFailed("\n\n".join(failures))
    return reports


class GpuSampler:
    """nvidia-smi's utilization.gpu of the first GPU, polled on a thread every GPU_POLL_S
    seconds while the ``with`` block runs; nothing where nvidia-smi is missing or fails."""

    COMMAND = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]

    def __init__(self, enabled: bool):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.samples: List[tuple] = []  # (time, percent)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> GpuSampler:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(GPU_POLL_S):
            try:
                done = subprocess.run(self.COMMAND, capture_output=True, text=True, timeout=5)
                self.samples.append((time.time(), float(done.stdout.split()[0])))
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                continue

    def mean_within(self, windows: List[List[float]]) -> Optional[float]:
        """The mean of the samples taken inside any of ``windows`` ((start, end) times); None
        when there is none."""
        inside = [v for t, v in self.samples if any(a <= t <= b for a, b in windows)]
        return statistics.mean(inside) if inside else None


def measure(mode: str, n: int, common: List[str], args, workdir: str) -> dict:
    """One measurement of ``mode`` with ``n`` runs: model-images, training seconds, GPU busy
    share, GPU memory per run and peak RSS. Raises ChildFailed."""
    seeds = ",".join(str(i) for i in range(n))
    with GpuSampler(args.device.startswith("cuda")) as gpu:
        if mode.startswith("fit_many"):
            stack = ["--stack"] if mode == "fit_many --stack" else []
            reports = [
                finish(
                    start(common + ["--runs", str(n), "--seed", seeds] + stack, workdir), args.child_timeout
                )
            ]
        elif mode == "separate":
            children = [start(common + ["--seed", str(i)], workdir) for i in range(n)]
            reports = finish_all(children, args.child_timeout)
        else:
            reports = [
                finish(start(common + ["--seed", str(i)], workdir), args.child_timeout) for i in range(n)
            ]
    windows = [w for r in reports for w in r["windows"]]
    if mode == "one after another":
        seconds = sum(b - a for a, b in windows)
    else:
        seconds = max(b for _, b in windows) - min(a for a, _ in windows)
    model_images = sum(round(e["images_per_s"] * e["seconds"]) for r in reports for e in r["epochs"])
    runs_per_process = n if mode.startswith("fit_many") else 1
    memory = [r["gpu_memory"] / runs_per_process for r in reports if r["gpu_memory"] is not None]
    rss = [r["max_rss"] for r in reports]
    return {
        "model_images": model_images,
        "seconds": seconds,
        "gpu_busy_percent": gpu.mean_within(windows),
        "gpu_memory_per_run": max(memory) if memory else None,
        "peak_rss": max(rss) if mode == "one after another" else sum(rss),
    }


def summarize(mode: str, n: int, runs: List[dict], image_bytes: int) -> dict:
    """The median of ``runs`` of one mode and N."""

    def median(key):
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None

    rates = [r["model_images"] / r["seconds"] for r in runs]
    return {
        "n": n,
        "mode": mode,
        "model_images_per_s": statistics.median(rates),
        "spread_pct": 100 * (max(rates) - min(rates)) / statistics.median(rates),
        "training_seconds": median("seconds"),
        "gpu_busy_percent": median("gpu_busy_percent"),
        "gpu_memory_per_run": median("gpu_memory_per_run"),
        "bytes_per_model_image": image_bytes / (n if mode.startswith("fit_many") else 1),
        "peak_rss": median("peak_rss"),
        "repeats": runs,
    }


def ratios(rows: List[dict]) -> List[str]:
    """The comparisons #25 sets targets for, from the rows measured."""
    rate = {(r["n"], r["mode"]): r["model_images_per_s"] for r in rows if "model_images_per_s" in r}
    lines = []
    for n in sorted({n for n, _ in rate}):
        for mode in ("fit_many", "fit_many --stack"):
            for other in ("separate", "one after another"):
                if (n, mode) in rate and (n, other) in rate:
                    target = " (target at N=4: >= 2x)" if n == 4 and other == "separate" else ""
                    lines.append(f"N={n}: {mode} / {other}: {rate[n, mode] / rate[n, other]:.2f}x{target}")
        for mode in ("fit_many", "fit_many --stack"):
            if n > 1 and (n, mode) in rate and (1, mode) in rate:
                target = (
                    " (target for --stack at N=8: >= 6x)" if n == 8 and mode == "fit_many --stack" else ""
                )
                lines.append(f"N={n}: {mode} / its N=1: {rate[n, mode] / rate[1, mode]:.2f}x{target}")
    return lines


def table(rows: List[dict]) -> List[str]:
    lines = [
        "| N | mode | model-images/s | spread | GPU busy | GPU memory per run | training s "
        "| bytes gathered per model-image | peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['n']} | {r['mode']} | failed | | | | | | |")
            continue
        busy = "n/a" if r["gpu_busy_percent"] is None else f"{r['gpu_busy_percent']:.0f}%"
        memory = "n/a" if r["gpu_memory_per_run"] is None else f"{r['gpu_memory_per_run'] / 2**20:,.0f} MiB"
        lines.append(
            f"| {r['n']} | {r['mode']} | {r['model_images_per_s']:,.0f} | {r['spread_pct']:.0f}% | {busy} "
            f"| {memory} | {r['training_seconds']:.2f} | {r['bytes_per_model_image']:,.0f} "
            f"| {r['peak_rss'] / 2**20:,.0f} MiB |"
        )
    return lines


def machine(device: str) -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else None
    return {
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": gpu,
    }


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2,4", help="numbers of runs, comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    parser.add_argument("--records", type=int, default=2048)
    parser.add_argument("--size-gb", type=float, help="the store's size instead of --records")
    parser.add_argument("--side", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="off", help="off, bf16 or fp16: the runs' autocast")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child-timeout", type=float, help="seconds before a child is killed as hung")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args(argv)
    args.counts = [int(c) for c in args.counts.split(",")]
    args.modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}")
    if args.size_gb is not None:
        args.records = math.ceil(args.size_gb * 1e9 / (args.side * args.side * 3))
    if min(args.counts) < 1 or args.records < 2 or args.repeats < 1:
        parser.error("--counts, --records and --repeats must be positive (and --records at least 2)")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    image_bytes = args.side * args.side * 3
    rows: List[dict] = []
    with tempfile.TemporaryDirectory() as workdir:
        store = os.path.join(workdir, "bench.fastload")
        started = time.perf_counter()
        make_store(store, args.records, args.side)
        print(
            f"store {args.records:,} records of {args.side}x{args.side}x3 ({args.records * image_bytes / 1e9:.2f} GB), "
            f"written in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
        common = ["train", store, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
        common += ["--device", args.device, "--amp", args.amp, "--threads", str(args.threads)]
        common += ["--val-fraction", str(args.val_fraction), "--json"]
        for n in args.counts:
            for mode in args.modes:
                print(f"N={n}: {mode}", file=sys.stderr)
                try:
                    runs = [measure(mode, n, common, args, workdir) for _ in range(args.repeats)]
                except ChildFailed as exc:
                    print(f"bench_fit_many: {mode} with N={n} failed:\n{exc}\n", file=sys.stderr)
                    rows.append({"n": n, "mode": mode, "failed": str(exc)})
                    continue
                rows.append(summarize(mode, n, runs, image_bytes))

    stacked = "stacked" if args.amp == "off" else f"not stacked: amp {args.amp}"
    print(
        f"store {args.records:,} records of {args.side}x{args.side}x3, {args.epochs} epoch(s), batch {args.batch_size}, "
        f"device {args.device}, amp {args.amp} (--stack: {stacked}), {args.threads} thread(s) per process, "
        f"median of {args.repeats}"
    )
    for line in table(rows) + ratios(rows):
        print(line)
    if args.json:
        results = {
            "args": vars(args),
            "machine": machine(args.device),
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    failed = [r for r in rows if "failed" in r]
    if failed:
        print(f"bench_fit_many: {len(failed)} measurement(s) failed, their errors above", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
