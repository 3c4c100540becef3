"""`fastload bench [STORE]`: how fast this machine feeds training, and what limits it."""

from __future__ import annotations

import argparse


def add_parser(commands) -> None:
    p = commands.add_parser(
        "bench",
        help="measure how fast this machine feeds training, and what limits it",
        description="Cold stages evict the store from the page cache. Without STORE a temporary store is written and removed.",
    )
    p.add_argument("store", nargs="?", help="a store to measure (default: a temporary synthetic one)")
    p.add_argument("--size-gb", type=float, help="size of the temporary store (default: min(2, RAM/8) GB)")
    p.add_argument("--quick", action="store_true", help="a tiny run in seconds (64 MB)")
    p.add_argument("--only", metavar="STAGES", help="comma-separated stages, e.g. memcpy,gather,dataset")
    p.add_argument("--json", metavar="PATH", help="write every figure and the machine's description as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG bar chart (needs fastload[bench])")
    p.add_argument("--images", type=int, help="memory plan for this many images (with --size)")
    p.add_argument("--size", type=int, help="side of the planned SIZExSIZEx3 images (with --images)")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure; figures are medians (default 3)")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--quiet", action="store_true", help="no table and no progress lines")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fastload import bench

    bench.run(
        store=args.store,
        size_gb=args.size_gb,
        quick=args.quick,
        only=args.only,
        json_path=args.json,
        plot_path=args.plot,
        images=args.images,
        size=args.size,
        repeats=args.repeats,
        batch_size=args.batch_size,
        console=not args.quiet,
    )
    return 0
