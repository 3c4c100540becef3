"""`fastload info STORE`: what a store holds, its size, where it lives, and whether it fits in
memory and on this machine's GPU."""

from __future__ import annotations

import argparse
import json
from typing import List

from fastload import inspect
from fastload.pack.display import printable
from fastload.progress import gigabytes


def add_parser(commands) -> None:
    p = commands.add_parser(
        "info",
        help="what a store holds, its size, and whether it fits in memory",
        description="Print what STORE holds (records, image shape, labels: classes with their counts, "
        "or the labels' range), its size on disk and in the page cache, where it lives (a disk, or a RAM "
        "disk: tmpfs, ramfs or zram, with no cold epoch), how many such images this machine's RAM holds "
        "as uint8 and as float32, and whether the store fits on this machine's GPU (--on-device).",
    )
    p.add_argument("store", metavar="STORE", help="a store file written by `fastload pack` or StoreWriter")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    summary = inspect.info(args.store)
    if args.json:
        print(json.dumps(summary, indent=2))  # JSON escapes every control character
        return 0
    for line in summary_lines(summary):  # class names and paths come from the file: escaped,
        print(printable(line))  # a line break among them included, so none can fake a line
    return 0


def summary_lines(summary: dict) -> List[str]:
    """The lines `fastload info` prints for an :func:`~fastload.inspect.info` summary."""
    lines = []
    h, w, c = summary["shape"]
    mem = summary["memory"]
    lines.append(f"store      {summary['path']}")
    kind = (
        f"labels {summary['label_dtype']}" if summary["labelled"] else "no labels (packed with --no-labels)"
    )
    lines.append(f"records    {summary['records']:,} images of {h}x{w}x{c} uint8, {kind}")
    labels = summary["labels"]
    if "classes" in labels:
        lines.append("classes    " + ", ".join(f"{k}: {v:,}" for k, v in labels["classes"].items()))
    elif labels:
        nan = f"{labels['nan']:,} NaN (not a number)" if labels["nan"] else ""
        if labels["min"] is None:
            lines.append(f"labels     all {nan}")
        else:
            numbers = f"min {labels['min']:.6g}  max {labels['max']:.6g}  mean {labels['mean']:.6g}"
            lines.append(f"labels     {numbers}" + (f"; {nan}" if nan else ""))
    if "distinct" in labels:
        counts = ", ".join(f"{k}: {v:,}" for k, v in labels.get("values", {}).items())
        lines.append(
            f"values     {labels['distinct']:,} distinct whole numbers{': ' + counts if counts else ''} "
            "(numbers, not classes: the store names no classes)"
        )
    size, resident = summary["file_bytes"], summary["resident_bytes"]
    where = summary["storage"]
    if where["in_ram"]:
        lines.append(
            f"in RAM     {gigabytes(size)} on {where['filesystem']} ({where['source']} at {where['mount_point']}): "
            "a RAM disk, so no epoch is cold, and its pages are the RAM the store takes (counted once)"
        )
    else:
        lines.append(
            f"on disk    {gigabytes(size)}; in page cache now {gigabytes(resident)} ({100 * resident / max(size, 1):.0f}%), "
            "shared by every process that maps it (counted in their RSS, owned by none)"
        )
        if where["filesystem"] is not None:
            lines.append(f"lives on   {where['filesystem']} ({where['source']} at {where['mount_point']})")
    encoding = summary.get("encoding")
    if encoding is not None:
        cost = (
            f", quality {encoding['quality']}: PSNR mean {encoding['psnr_mean']:.1f} dB, worst {encoding['psnr_min']:.1f} dB"
            if encoding.get("psnr_mean") is not None
            else ""
        )
        lines.append(
            f"encoding   {encoding['jpeg']:,} records JPEG, {encoding['raw']:,} raw{cost}; "
            f"{encoding['ratio']:.1f}x smaller than raw, {encoding['stored_bytes_per_record'] / 1e3:,.1f} KB "
            f"a record on average: this machine's RAM holds {encoding['fit_in_ram_stored']:,} such records"
        )
    lines.append(
        f"as tensors uint8 {gigabytes(mem['uint8_bytes'])} vs cached float32 {gigabytes(mem['float32_bytes'])}; "
        + inspect.memory_plan_line(mem)
    )
    lines.append(gpu_line(summary["gpu"]))
    return lines


def gpu_line(gpu) -> str:
    """Whether the store fits on this machine's GPU, held there as uint8 (--on-device)."""
    if gpu is None:
        return "gpu        none visible here (torch.cuda.is_available() is False)"
    held = (
        f"the store's {gigabytes(gpu['needed_bytes'])} fit"
        if gpu["fits"]
        else f"the store's {gigabytes(gpu['needed_bytes'])} do not fit: at most {gpu['largest_fit']:,} records do"
    )
    return (
        f"gpu        {gpu['name']}: {gigabytes(gpu['free_bytes'])} free, "
        f"{gigabytes(gpu['available_bytes'])} after {gigabytes(gpu['reserve_bytes'])} left for the model; "
        f"{held} resident (fit(on_device=True), --on-device)"
    )
