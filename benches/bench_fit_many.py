"""Benchmark of `fastload.fit_many`: N small-cnn runs trained at once on one stream of batches,
against what a user does today, on the same store (records of SIDExSIDEx3, float labels):

- fit_many: one process, `fastload train --runs N` (`fastload.fit_many`); with `--stack` too;
- separate: N `fastload train` processes started at once (each gathers, moves and trains alone);
- one after another: N `fastload train` processes, each started when the previous one ended.

Per mode and N, median of `--repeats`: total model-images per second (N x the training images
of every epoch, over the wall time from the first start to the last end, process start-up
included), bytes gathered and bytes moved to the device per model-image (from the batch counts:
fit_many gathers and moves each batch once for all runs), and peak RSS (the sum over processes
running at once; the largest process for one after another). The target: at N=4, fit_many
gives at least 2x the throughput of 4 separate processes.

    python benches/bench_fit_many.py [--counts 1,2,4] [--records 2048] [--side 16] [--epochs 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CHILD = r"""
import json, resource, sys
from fastload import cli
rc = cli.main(sys.argv[1:])
print(json.dumps({"rc": rc, "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), file=sys.stderr)
"""


def _make_store(path: str, records: int, side: int) -> None:
    from fastload.store import StoreWriter

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (records, side, side, 3), dtype=np.uint8)
    with StoreWriter(path, (side, side, 3)) as writer:
        writer.extend(images, images.reshape(records, -1).mean(1) / 255.0)


def _start(argv: list) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: subprocess.Popen) -> int:
    """Waits for a child; its peak RSS in bytes."""
    err = proc.communicate()[1]
    report = json.loads(err.strip().splitlines()[-1])
    if report["rc"] != 0:
        raise RuntimeError(f"a benchmark run failed: {err}")
    return report["max_rss"]


def _measure(mode: str, n: int, common: list) -> tuple:
    """(wall seconds, peak RSS bytes) of one mode with n runs."""
    seeds = ",".join(str(i) for i in range(n))
    started = time.perf_counter()
    if mode.startswith("fit_many"):
        stack = ["--stack"] if mode == "fit_many --stack" else []
        rss = _finish(_start(common + ["--runs", str(n), "--seed", seeds] + stack))
    elif mode == "separate":
        procs = [_start(common + ["--seed", str(i)]) for i in range(n)]
        rss = sum(_finish(p) for p in procs)
    else:
        rss = max(_finish(_start(common + ["--seed", str(i)])) for i in range(n))
    return time.perf_counter() - started, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2,4", help="numbers of runs, comma-separated")
    parser.add_argument("--records", type=int, default=2048)
    parser.add_argument("--side", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "bench.fastload")
        _make_store(store, args.records, args.side)
        common = ["train", store, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
        common += ["--device", args.device, "--threads", str(args.threads), "--val-fraction", "0.1", "--json"]
        train_images = args.records - round(0.1 * args.records)
        steps = -(-train_images // args.batch_size) * args.epochs
        image_bytes = args.side * args.side * 3
        rows = []
        for n in [int(c) for c in args.counts.split(",")]:
            model_images = n * train_images * args.epochs
            results = {}
            for mode in ("fit_many", "fit_many --stack", "separate", "one after another"):
                runs = [_measure(mode, n, common) for _ in range(args.repeats)]
                wall = statistics.median(r[0] for r in runs)
                rss = statistics.median(r[1] for r in runs)
                copies = 1 if mode.startswith("fit_many") else n  # times each batch is gathered and moved
                per_model_image = copies * steps * args.batch_size * image_bytes / model_images
                results[mode] = model_images / wall
                rows.append((n, mode, model_images / wall, per_model_image, rss / 2**20))
            for mode in ("fit_many", "fit_many --stack"):
                by_separate = results[mode] / results["separate"]
                rows.append(
                    (
                        n,
                        f"{mode}: / separate, / one after another",
                        by_separate,
                        results[mode] / results["one after another"],
                        None,
                    )
                )

    print(
        f"store {args.records} records of {args.side}x{args.side}x3, {args.epochs} epochs, batch {args.batch_size}, "
        f"device {args.device}, {args.threads} thread(s) per process, median of {args.repeats}"
    )
    print("| N | mode | model-images/s | bytes gathered = bytes moved per model-image | peak RSS MiB |")
    print("|---|---|---:|---:|---:|")
    for n, mode, rate, per_image, rss in rows:
        if rss is None:
            print(f"| {n} | {mode} | {rate:.2f}x | {per_image:.2f}x | |")
        else:
            print(f"| {n} | {mode} | {rate:,.0f} | {per_image:,.0f} | {rss:,.0f} |")


if __name__ == "__main__":
    main()
