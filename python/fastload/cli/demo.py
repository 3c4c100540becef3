"""`fastload demo`: pack, load and train on generated photos, checking each step."""

from __future__ import annotations

import argparse
import json
import sys

from fastload.options import DEMO_SOURCES


def add_parser(commands) -> None:
    p = commands.add_parser(
        "demo",
        help="pack, load and train on generated photos, checking each step",
        description="Writes photo-like images whose label is a known monotone function of their brightness "
        "and of a per-record exposure, packs them, compares loaders, trains a monotonic regressor and "
        "checks its guarantee. Works in a temporary directory unless --dir is given.",
    )
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="work (and keep the files) here: a new or empty folder, or one an earlier demo made",
    )
    p.add_argument("--images", type=int, help="number of images (default 2400; 600 with --quick)")
    p.add_argument("--size", type=int, help="record side in pixels (default 64; 48 with --quick)")
    p.add_argument("--epochs", type=int, help="training epochs (default 12; 8 with --quick)")
    p.add_argument("--quick", action="store_true", help="a smaller run, under a minute on 2 cores")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the generated photos and their exposures, and of the model and the validation split "
        "(default 0)",
    )
    p.add_argument(
        "--images-from",
        choices=DEMO_SOURCES,
        default="auto",
        help="scikit-image's sample photos (auto: when installed) or procedural textures, the same "
        "run whatever is installed (default auto)",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object instead of text")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fastload import demo

    report = demo.run(
        workdir=args.dir,
        images=args.images,
        size=args.size,
        epochs=args.epochs,
        device=args.device,
        quick=args.quick,
        seed=args.seed,
        quiet=args.json,
        images_from=args.images_from,
    )
    if args.json:
        print(json.dumps(report))
    for problem in report["problems"]:
        print(f"fastload demo: error: {problem}", file=sys.stderr)
    return 0 if report["passed"] else 1
