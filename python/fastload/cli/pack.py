"""`fastload pack SRC DEST`: a folder of images (and their labels) into a store."""

from __future__ import annotations

import argparse

from fastload import _core
from fastload import store as store_mod
from fastload.cli.args import positive_int
from fastload.options import MAX_LABELS_CSV_BYTES, RESIZE_MODES


def fill_colour(text: str) -> tuple:
    """A grey level `N` or a colour `R,G,B`, each 0-255."""
    values = tuple(int(v) for v in text.split(","))
    if len(values) not in (1, 3) or not all(0 <= v <= 255 for v in values):
        raise argparse.ArgumentTypeError(f"expected N or R,G,B with values 0-255, not {text!r}")
    return values if len(values) == 3 else values * 3


fill_colour.__name__ = "fill colour"  # argparse's "invalid fill colour value: 'x'"


def jpeg_quality(text: str) -> int:
    """A JPEG quality, 1-100."""
    if not text.strip().isdigit() or not 1 <= int(text) <= 100:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 100, not {text!r}")
    return int(text)


jpeg_quality.__name__ = "quality"


def add_parser(commands) -> None:
    p = commands.add_parser(
        "pack",
        help="turn a folder of images (and their labels) into a store",
        description="Pack every image under SRC into a new store DEST, in sorted path order. Labels come "
        "from --labels or from class subfolders (SRC/CLASS/...), or there are none (--no-labels). Unreadable "
        "files are skipped and listed, and damaged JPEGs that still decode are packed and listed as decoded "
        "with warnings (--strict refuses both). "
        "Images (JPEG, PNG, WebP, BMP, TIFF, GIF's first frame; recognised by content) are turned upright by "
        "their EXIF orientation, composited on white where transparent, and resized with Lanczos3; images "
        f"over {_core.PACK_MAX_PIXELS // 10**6} megapixels are refused as decompression bombs.",
        epilog="exit status: 0 packed (skipped files are listed, not fatal); 1 failed (bad files with "
        "--strict, unreadable SRC, no images, bad labels, DEST exists); 2 usage error. Nothing is written "
        "at DEST unless the pack succeeds.",
    )
    p.add_argument("src", metavar="SRC", help="folder of images")
    p.add_argument("dest", metavar="DEST", help="store file to create (outside SRC)")
    p.add_argument("--size", type=positive_int, default=256, help="side of the square records (default 256)")
    p.add_argument("--height", type=positive_int, help="record height (overrides --size)")
    p.add_argument("--width", type=positive_int, help="record width (overrides --size)")
    p.add_argument(
        "--resize",
        choices=RESIZE_MODES,
        default="crop",
        help="squash: stretch; crop: scale the short side, cut the centre (default); pad: letterbox with --fill",
    )
    p.add_argument(
        "--fill", type=fill_colour, default=(0, 0, 0), metavar="N|R,G,B", help="pad colour (default 0)"
    )
    labels = p.add_mutually_exclusive_group()
    labels.add_argument(
        "--labels",
        metavar="FILE.csv",
        help=f"CSV of relative/path,label rows, at most {MAX_LABELS_CSV_BYTES >> 20} MiB; paths are relative to SRC, "
        "taken as written (spaces included); labels are numbers, or all class names (classes in sorted "
        "order); the first row is a header only if its label is not a number and its path names no file",
    )
    labels.add_argument(
        "--no-labels",
        action="store_true",
        help="pack every image under SRC without labels (to embed, score or pre-train): each label is 0 "
        "(NaN with --label-dtype float64) and the store says it has none; `fastload train` refuses it",
    )
    p.add_argument(
        "--label-dtype", choices=store_mod.LABEL_DTYPES, help="default: int64 for classes and integer CSVs"
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        help="decoding threads (default: all cores; at most 4 per core); they share one "
        f"{_core.PACK_DECODE_MEMORY_BUDGET / 2**30:g} GiB decode-memory budget",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail, writing nothing, if any file cannot be packed or a JPEG decodes with warnings "
        "(damaged data); hidden files such as .DS_Store are skipped by rule, not failures",
    )
    p.add_argument(
        "--encoding",
        choices=store_mod.ENCODINGS,
        help="raw: uint8 pixels (default); jpeg: each record a baseline JPEG of --quality, decoded "
        "by Rust threads on every read (about a tenth of the size at quality 90)",
    )
    p.add_argument(
        "--quality",
        type=jpeg_quality,
        default=store_mod.DEFAULT_QUALITY,
        help=f"JPEG quality 1-100 of --encoding jpeg (default {store_mod.DEFAULT_QUALITY}); "
        "pack reports the PSNR it cost",
    )
    p.add_argument(
        "--max-size",
        metavar="SIZE",
        help="bound the store's size (such as 150GB or 2.5GiB; implies --encoding jpeg): as many records "
        "stay raw as fit, drawn evenly over the store, and the rest are encoded",
    )
    p.add_argument("--overwrite", action="store_true", help="replace DEST if it exists")
    p.add_argument("--skip-unlabelled", action="store_true", help="leave out images without a label")
    p.add_argument(
        "--skip-missing",
        action="store_true",
        help="leave out labels CSV rows whose file does not exist (listed)",
    )
    p.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="follow symbolic links that point outside SRC (links into SRC are always followed; "
        "a link to a folder containing SRC, such as /, never is)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fastload.pack import pack

    report = pack(
        args.src,
        args.dest,
        (args.height or args.size, args.width or args.size),
        resize=args.resize,
        fill=args.fill,
        labels=args.labels,
        label_dtype=args.label_dtype,
        workers=args.workers,
        strict=args.strict,
        overwrite=args.overwrite,
        skip_unlabelled=args.skip_unlabelled,
        skip_missing=args.skip_missing,
        no_labels=args.no_labels,
        follow_symlinks=args.follow_symlinks,
        encoding=args.encoding,
        quality=args.quality,
        max_size=args.max_size,
        quiet=args.quiet,
    )
    if not args.quiet:
        print(report)
    return 0
