"""`fastload augment-preview STORE -o PNG`: a grid of augmented records, what the model sees."""

from __future__ import annotations

import argparse

from fastload.cli.args import positive_int


def add_parser(commands) -> None:
    p = commands.add_parser(
        "augment-preview",
        help="write a PNG grid of augmented records: what the model sees over epochs",
        description="One row per record (spread evenly over STORE), one column per epoch, each tile "
        "augmented as to_device(..., augment=) would augment it in that epoch. Needs Pillow.",
    )
    p.add_argument("store")
    p.add_argument(
        "--augment",
        default="crop,flip,jitter",
        metavar="SPEC",
        help="comma-separated: crop[=MIN_SCALE], flip, vflip, jitter[=X], rotate[=DEG], translate[=F] "
        "(default crop,flip,jitter)",
    )
    p.add_argument("-o", "--output", required=True, metavar="PNG", help="where to write the grid")
    p.add_argument("--size", type=positive_int, help="output side of each tile (default: the store's)")
    p.add_argument("--records", type=positive_int, default=4, help="rows (default 4)")
    p.add_argument("--epochs", type=positive_int, default=8, help="columns (default 8)")
    p.add_argument("--seed", type=int, default=0, help="augmentation seed (default 0)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fastload.augment import Augment
    from fastload.preview import save_preview

    augment = Augment.from_spec(args.augment, size=args.size, seed=args.seed)
    width, height = save_preview(args.store, args.output, augment, records=args.records, epochs=args.epochs)
    print(
        f"{args.output}: {args.records} records x {args.epochs} epochs of {augment!r} ({width}x{height} PNG)"
    )
    return 0
