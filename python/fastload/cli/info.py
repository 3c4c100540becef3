"""`fastload info STORE`: what a store holds, its size, and whether it fits in memory."""

from __future__ import annotations

import argparse
import json

from fastload import inspect
from fastload.progress import gigabytes


def add_parser(commands) -> None:
    p = commands.add_parser(
        "info",
        help="what a store holds, its size, and whether it fits in memory",
        description="Print what STORE holds (records, image shape, labels: classes with their counts, "
        "or the labels' range), its size on disk and in the page cache, and how many such images this "
        "machine's RAM holds as uint8 and as float32.",
    )
    p.add_argument("store", metavar="STORE", help="a store file written by `fastload pack` or StoreWriter")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    summary = inspect.info(args.store)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    h, w, c = summary["shape"]
    mem = summary["memory"]
    print(f"store      {summary['path']}")
    kind = (
        f"labels {summary['label_dtype']}" if summary["labelled"] else "no labels (packed with --no-labels)"
    )
    print(f"records    {summary['records']:,} images of {h}x{w}x{c} uint8, {kind}")
    labels = summary["labels"]
    if "classes" in labels:
        print("classes    " + ", ".join(f"{k}: {v:,}" for k, v in labels["classes"].items()))
    elif labels:
        print(f"labels     min {labels['min']:.6g}  max {labels['max']:.6g}  mean {labels['mean']:.6g}")
    if "distinct" in labels:
        counts = ", ".join(f"{k}: {v:,}" for k, v in labels.get("values", {}).items())
        print(
            f"values     {labels['distinct']:,} distinct whole numbers{': ' + counts if counts else ''} "
            "(numbers, not classes: the store names no classes)"
        )
    size, resident = summary["file_bytes"], summary["resident_bytes"]
    print(
        f"on disk    {gigabytes(size)}; in page cache now {gigabytes(resident)} ({100 * resident / max(size, 1):.0f}%), "
        "shared by every process that maps it (counted in their RSS, owned by none)"
    )
    print(
        f"as tensors uint8 {gigabytes(mem['uint8_bytes'])} vs cached float32 {gigabytes(mem['float32_bytes'])}; "
        f"this machine's {gigabytes(mem['ram_bytes'])} RAM holds {mem['fit_in_ram_uint8']:,} images as uint8, "
        f"{mem['fit_in_ram_float32']:,} as float32"
    )
    return 0
