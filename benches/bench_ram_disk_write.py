"""The store writer on a RAM disk (#35): fastload's writer (O_DIRECT where the filesystem takes
it, buffered where it refuses) against a plain buffered write of the same bytes (write, fsync,
rename), on tmpfs and on the disk, rounds alternating, medians. Each store is verified.

    python benches/bench_ram_disk_write.py [--mb 512] [--rounds 5] [--ram-dir /dev/shm] [--disk-dir .]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import fastload
from fastload.inspect import storage

SHAPE = (384, 384, 3)


def takes_o_direct(folder: str) -> bool:
    """Whether the filesystem of `folder` opens a file with O_DIRECT (tmpfs does from Linux 6.6)."""
    path = os.path.join(folder, ".o_direct_probe")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
        return True
    except OSError:
        return False
    finally:
        if os.path.exists(path):
            os.unlink(path)


def fastload_write(folder: str, images: np.ndarray) -> float:
    path = os.path.join(folder, "store.fastload")
    t0 = time.perf_counter()
    with fastload.StoreWriter(path, SHAPE, overwrite=True) as writer:
        for first in range(0, len(images), 64):
            writer.extend(images[first : first + 64], np.zeros(len(images[first : first + 64])))
    seconds = time.perf_counter() - t0
    with fastload.Store(path) as store:
        assert store.verify(None) == [] and len(store) == len(images)
    os.unlink(path)
    return seconds


def buffered_write(folder: str, images: np.ndarray) -> float:
    path, partial = os.path.join(folder, "plain.bin"), os.path.join(folder, ".plain.bin.partial")
    t0 = time.perf_counter()
    with open(partial, "wb") as f:
        for first in range(0, len(images), 64):
            f.write(images[first : first + 64].tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.rename(partial, path)
    seconds = time.perf_counter() - t0
    os.unlink(path)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ram-dir", default="/dev/shm")
    parser.add_argument("--disk-dir", default=".")
    args = parser.parse_args()
    count = args.mb * 10**6 // int(np.prod(SHAPE))
    images = np.random.default_rng(0).integers(0, 256, (count, *SHAPE), dtype=np.uint8)
    folders = {
        "tmpfs": tempfile.mkdtemp(dir=args.ram_dir, prefix="fastload-bench-"),
        "disk": tempfile.mkdtemp(dir=args.disk_dir, prefix="fastload-bench-"),
    }
    times: dict = {(where, how): [] for where in folders for how in ("fastload", "buffered")}
    try:
        for where, folder in folders.items():
            where_is = storage(folder)
            print(
                f"{where}: {where_is['filesystem']} at {where_is['mount_point']}, in RAM {where_is['in_ram']}, "
                f"O_DIRECT taken {takes_o_direct(folder)}"
            )
        for _ in range(args.rounds):
            for where, folder in folders.items():
                times[(where, "fastload")].append(fastload_write(folder, images))
                times[(where, "buffered")].append(buffered_write(folder, images))
    finally:
        for folder in folders.values():
            os.rmdir(folder)
    nbytes = images.nbytes
    print(
        f"{count} records of {SHAPE}, {nbytes / 1e9:.3f} GB, {args.rounds} rounds alternating, medians (min-max)"
    )
    for (where, how), seconds in times.items():
        rates = [nbytes / s / 1e9 for s in seconds]
        print(
            f"{where:6} {how:9} {statistics.median(seconds):.3f} s  {statistics.median(rates):.2f} GB/s "
            f"({min(rates):.2f}-{max(rates):.2f})"
        )
    for where in folders:
        ratios = [b / f for f, b in zip(times[(where, "fastload")], times[(where, "buffered")])]
        print(
            f"{where:6} fastload speed / buffered speed, per round: median {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
