"""The `fastload` command: parses arguments and calls the same functions users call from Python.

Exit status: 0 success, 1 failure (bad store, damaged records, failed run), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import List, Optional

from fastload import StoreError, __version__, _core, inspect
from fastload import store as store_mod
from fastload.options import (
    AMP_MODES,
    BACKBONES,
    MAX_LABELS_CSV_BYTES,
    MAX_RUNS_FILE_BYTES,
    RESIZE_MODES,
    SCHEDULES,
    TASKS,
)
from fastload.progress import gigabytes as _gb


def _cmd_info(args: argparse.Namespace) -> int:
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
        f"on disk    {_gb(size)}; in page cache now {_gb(resident)} ({100 * resident / max(size, 1):.0f}%), "
        "shared by every process that maps it (counted in their RSS, owned by none)"
    )
    print(
        f"as tensors uint8 {_gb(mem['uint8_bytes'])} vs cached float32 {_gb(mem['float32_bytes'])}; "
        f"this machine's {_gb(mem['ram_bytes'])} RAM holds {mem['fit_in_ram_uint8']:,} images as uint8, "
        f"{mem['fit_in_ram_float32']:,} as float32"
    )
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    damaged = inspect.verify(args.store, limit=args.limit)
    for index, source in damaged:
        print(f"damaged record {index}" + (f" ({source})" if source else ""))
    if damaged.total > len(damaged):
        print(f"... and {damaged.total - len(damaged):,} more damaged records")
    if damaged.total:
        print(f"{args.store}: {damaged.total:,} damaged record(s)", file=sys.stderr)
        return 1
    print(f"{args.store}: every record matches its checksum")
    return 0


def _parse_positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _fill(text: str) -> tuple:
    """A grey level `N` or a colour `R,G,B`, each 0-255."""
    values = tuple(int(v) for v in text.split(","))
    if len(values) not in (1, 3) or not all(0 <= v <= 255 for v in values):
        raise argparse.ArgumentTypeError(f"expected N or R,G,B with values 0-255, not {text!r}")
    return values if len(values) == 3 else values * 3


def _cmd_pack(args: argparse.Namespace) -> int:
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
        quiet=args.quiet,
    )
    if not args.quiet:
        print(report)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
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


def _augment_spec(text: str) -> str:
    """An augmentation spec, checked as `fit` checks it, so a bad one is a usage error."""
    from fastload.augment import Augment

    try:
        Augment.from_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _train_option(name: str, parse=int):
    """An argparse type checking a train option against fit's own bounds, so the usage error
    names the flag (`argument --workers: must be between 0 and 8 (...), not 500`)."""

    def convert(text: str):
        from fastload import train

        value = parse(text)
        problem = train.option_problem(name, value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = parse.__name__  # argparse: "invalid int value: 'x'"
    return convert


def _train_values(name: str, parse=int, choices=None):
    """An argparse type for a per-run train option: one value or a comma list (one per run of
    --runs), each checked as :func:`_train_option` does or against ``choices``."""
    one = _train_option(name, parse) if choices is None else parse

    def convert(text: str) -> list:
        values = [one(part.strip()) for part in text.split(",")]
        for value in values:
            if choices is not None and value not in choices:
                raise argparse.ArgumentTypeError(f"must be one of {', '.join(choices)}, not {value!r}")
        return values

    convert.__name__ = parse.__name__
    return convert


def _cmd_train(args: argparse.Namespace) -> int:
    # A warning (classes made from unnamed labels, ...) is a line of the command's output, not
    # Python's file:line report.
    with warnings.catch_warnings():
        from fastload.train import explain_warning

        warnings.showwarning = lambda message, *_, **__: print(
            f"fastload train: warning: {explain_warning(str(message))}", file=sys.stderr
        )
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    from fastload import train

    inputs = {
        "store": args.store,
        "--val store": args.val,
        "--monotone-inputs file": args.monotone_inputs,
        "--val-monotone-inputs file": args.val_monotone_inputs,
    }
    train.check_outputs({"--checkpoint": args.checkpoint}, inputs)
    read = {**inputs, "--checkpoint": args.checkpoint, "--resume checkpoint": args.resume}
    train.check_outputs({"--json-log": args.json_log}, read)
    flags = [name for name in train.RUN_OPTIONS if name != "name"]  # the flags --runs takes lists for
    per_run = {name: getattr(args, name) for name in flags if getattr(args, name) is not None}
    many = args.runs is not None or args.runs_file is not None
    count = args.runs or 1
    for name, values in per_run.items():
        if len(values) not in (1, count) or (args.runs_file is not None and len(values) > 1):
            flag = "--" + name.replace("_", "-")
            need = f"--runs {count}: give 1 or {count}" if args.runs else "one run: give 1 (or use --runs)"
            args.parser.error(f"{flag} gives {len(values)} values for {need}")
    shared = {name: values[0] for name, values in per_run.items() if len(values) == 1}
    options = dict(
        task=args.task,
        val=args.val,
        val_fraction=args.val_fraction,
        epochs=args.epochs,
        batch_size=args.batch_size,
        device=args.device,
        amp=args.amp,
        workers=args.workers,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        monotone_inputs=args.monotone_inputs,
        val_monotone_inputs=args.val_monotone_inputs,
        size=args.size,
        max_steps=args.max_steps,
        patience=args.patience,
        augment=args.augment,
        threads=args.threads,
        log=train.epoch_logger(json_lines=args.json, json_log=args.json_log),
        **shared,
    )
    if not many:
        results = [train.fit(args.store, **options)]
    else:
        if args.runs_file is not None:
            runs = train.read_runs_file(args.runs_file)
        else:
            varying = {name: values for name, values in per_run.items() if len(values) > 1}
            runs = [{name: values[i] for name, values in varying.items()} for i in range(count)]
        options["data_seed"] = args.data_seed if args.data_seed is not None else shared.get("seed", 0)
        results = train.fit_many(args.store, runs, stack=args.stack, **options)
        print(train.runs_table(results, runs), file=sys.stderr if args.json else sys.stdout)
    for result in results:
        who = f"run {result.name} " if result.name is not None else ""
        if result.stopped is not None:
            print(
                f"fastload train: {who}stopped after {result.steps} steps: {result.stopped}", file=sys.stderr
            )
        elif not result.completed:
            resume = f"; continue with --resume {args.checkpoint}" if args.checkpoint else ""
            print(
                f"fastload train: {who}stopped after {result.steps} steps (--max-steps){resume}",
                file=sys.stderr,
            )
    diverged = [r for r in results if r.stopped is not None and r.stopped.startswith("diverged")]
    return 1 if len(diverged) == len(results) else 0


def _cmd_demo(args: argparse.Namespace) -> int:
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
    )
    if args.json:
        print(json.dumps(report))
    for problem in report["problems"]:
        print(f"fastload demo: error: {problem}", file=sys.stderr)
    return 0 if report["passed"] else 1


def _cmd_augment_preview(args: argparse.Namespace) -> int:
    from fastload.augment import Augment, save_preview

    augment = Augment.from_spec(args.augment, size=args.size, seed=args.seed)
    width, height = save_preview(args.store, args.output, augment, records=args.records, epochs=args.epochs)
    print(
        f"{args.output}: {args.records} records x {args.epochs} epochs of {augment!r} ({width}x{height} PNG)"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastload",
        description="Pack image folders into one store file and feed PyTorch training from it fast. "
        "Start with `fastload pack`, then read the store with fastload.FastLoadDataset.",
        epilog="exit status: 0 success, 1 failure, 2 usage error. `fastload COMMAND --help` tells more.",
    )
    parser.add_argument("--version", action="version", version=f"fastload {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "info",
        help="what a store holds, its size, and whether it fits in memory",
        description="Print what STORE holds (records, image shape, labels: classes with their counts, "
        "or the labels' range), its size on disk and in the page cache, and how many such images this "
        "machine's RAM holds as uint8 and as float32.",
    )
    p.add_argument("store", metavar="STORE", help="a store file written by `fastload pack` or StoreWriter")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=_cmd_info)

    p = sub.add_parser(
        "verify",
        help="check every record of a store against its checksum",
        description="Recompute the checksum of every record of STORE (image and label) and list the "
        "records that differ, with their source file when the store names it. Exit status 0: every "
        "record matches; 1: damaged records (or not a readable store).",
    )
    p.add_argument("store", metavar="STORE", help="a store file written by `fastload pack` or StoreWriter")
    p.add_argument(
        "--limit",
        type=_parse_positive_int,
        default=store_mod.VERIFY_LIMIT,
        help=f"damaged records to list (default {store_mod.VERIFY_LIMIT})",
    )
    p.set_defaults(run=_cmd_verify)

    p = sub.add_parser(
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
    p.add_argument(
        "--size", type=_parse_positive_int, default=256, help="side of the square records (default 256)"
    )
    p.add_argument("--height", type=_parse_positive_int, help="record height (overrides --size)")
    p.add_argument("--width", type=_parse_positive_int, help="record width (overrides --size)")
    p.add_argument(
        "--resize",
        choices=RESIZE_MODES,
        default="crop",
        help="squash: stretch; crop: scale the short side, cut the centre (default); pad: letterbox with --fill",
    )
    p.add_argument("--fill", type=_fill, default=(0, 0, 0), metavar="N|R,G,B", help="pad colour (default 0)")
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
        type=_parse_positive_int,
        help="decoding threads (default: all cores; at most 4 per core); they share one "
        f"{_core.PACK_DECODE_MEMORY_BUDGET / 2**30:g} GiB decode-memory budget",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail, writing nothing, if any file cannot be packed or a JPEG decodes with warnings "
        "(damaged data); hidden files such as .DS_Store are skipped by rule, not failures",
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
    p.set_defaults(run=_cmd_pack)

    p = sub.add_parser(
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
    p.set_defaults(run=_cmd_bench)

    p = sub.add_parser(
        "train",
        help="train an image regressor or classifier on a store and see whether loading keeps up",
        description="Per epoch: train loss, validation MAE/RMSE (classification: cross-entropy, accuracy "
        "and correct/records per class), images/s and the data-wait fraction (the share of step time "
        "spent waiting for the next batch: near 0 means the loader keeps up).",
    )
    p.add_argument("store")
    p.add_argument(
        "--task",
        choices=TASKS,
        help="regression takes float64 labels, or int64 ones (a CSV of whole numbers) as numbers; "
        "classification takes int64 class indices 0..K-1: class folders (K = the classes the store "
        "lists) or, forced, whole numbers (K = largest label + 1). Default: classification when the "
        "store lists classes (packed from class folders), regression otherwise",
    )
    val = p.add_mutually_exclusive_group()
    val.add_argument("--val", metavar="STORE", help="a separate validation store")
    val.add_argument(
        "--val-fraction",
        type=_train_option("val_fraction", float),
        default=0.1,
        help="share of STORE held out (default 0.1)",
    )
    runs = p.add_mutually_exclusive_group()
    runs.add_argument(
        "--runs",
        type=_parse_positive_int,
        metavar="N",
        help="train N models at once on one stream of batches; per-run flags (--lr, --seed, --schedule, "
        "--weight-decay, --backbone, --num-features, --lattice-size) then take comma lists of N values "
        "(one value applies to every run); --checkpoint and --resume are folders (one file per run)",
    )
    runs.add_argument(
        "--runs-file",
        metavar="JSON",
        help="the runs as a JSON list of objects (keys: name and the per-run options), "
        f"at most {MAX_RUNS_FILE_BYTES >> 20} MiB",
    )
    p.add_argument(
        "--stack",
        action="store_true",
        help="with --runs: runs of one architecture take their forward and backward passes as one "
        "vmapped model (one kernel launch for all; equal to the runs alone within float rounding)",
    )
    p.add_argument(
        "--data-seed",
        type=_train_option("data_seed"),
        metavar="N",
        help="with --runs: seed of the split and batch order shared by the runs (default: the first --seed)",
    )
    p.add_argument(
        "--augment",
        type=_augment_spec,
        default="",
        metavar="SPEC",
        help="augment training batches on the device: crop[=MIN_SCALE], flip, vflip, jitter[=X], rotate[=DEG], "
        "translate[=F], comma-separated; validation is never augmented",
    )
    p.add_argument(
        "--patience",
        type=_train_option("patience"),
        metavar="N",
        help="stop a run after N epochs without a better validation RMSE (classification: loss)",
    )
    p.add_argument("--epochs", type=_train_option("epochs"), default=10, help="default 10")
    p.add_argument("--batch-size", type=_train_option("batch_size"), default=64, help="default 64")
    p.add_argument(
        "--lr",
        type=_train_values("lr", float),
        metavar="LR[,LR...]",
        help="peak AdamW learning rate (default 3e-3)",
    )
    p.add_argument(
        "--schedule",
        type=_train_values("schedule", str, SCHEDULES),
        metavar="|".join(SCHEDULES),
        help="learning-rate schedule (default cosine)",
    )
    p.add_argument(
        "--weight-decay",
        type=_train_values("weight_decay", float),
        metavar="WD[,WD...]",
        help="AdamW weight decay (default 0)",
    )
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    p.add_argument("--amp", choices=AMP_MODES, default="off", help="mixed precision")
    p.add_argument(
        "--workers",
        type=_train_option("workers"),
        default=0,
        help="DataLoader workers; 0 = Rust threads only",
    )
    p.add_argument(
        "--threads", type=_train_option("threads"), help="torch CPU threads (default: torch's choice)"
    )
    p.add_argument(
        "--seed",
        type=_train_values("seed"),
        metavar="N[,N...]",
        help="seed of the model and (alone) of the data (default 0)",
    )
    p.add_argument("--checkpoint", metavar="PATH", help="save here at every epoch end (atomically)")
    p.add_argument(
        "--checkpoint-every",
        type=_train_option("checkpoint_every"),
        metavar="N",
        help="also save every N steps",
    )
    p.add_argument("--resume", metavar="PATH", help="continue a run from its checkpoint, mid-epoch included")
    p.add_argument(
        "--max-steps",
        type=_train_option("max_steps"),
        metavar="N",
        help="stop (and save) after N steps in total",
    )
    p.add_argument(
        "--monotone-inputs",
        metavar="NPY",
        help=".npy of per-record scalars aligned with STORE, shape (N,) or (N, K): the model never "
        "predicts less (classification: no class logit falls) when one of them rises",
    )
    p.add_argument("--val-monotone-inputs", metavar="NPY", help="the same for the --val store")
    p.add_argument(
        "--backbone",
        type=_train_values("backbone", str, BACKBONES),
        metavar="|".join(BACKBONES),
        help="image feature extractor (default small-cnn; resnet18 needs torchvision)",
    )
    p.add_argument(
        "--num-features",
        type=_train_values("num_features"),
        metavar="N[,N...]",
        help="image features (default 8)",
    )
    p.add_argument(
        "--lattice-size",
        type=_train_values("lattice_size"),
        metavar="N[,N...]",
        help="lattice keypoints per input (default 3)",
    )
    p.add_argument(
        "--size",
        type=_train_option("size"),
        help="downscale images to SIZExSIZE on the device before the backbone",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line per epoch instead of text")
    p.add_argument("--json-log", metavar="PATH", help="append one JSON line per epoch to PATH")
    p.set_defaults(run=_cmd_train, parser=p)

    p = sub.add_parser(
        "demo",
        help="pack, load and train on generated photos, checking each step",
        description="Writes photo-like images whose label is a known monotone function of their brightness "
        "and of a per-record exposure, packs them, compares loaders, trains a monotonic regressor and "
        "checks its guarantee. Works in a temporary directory unless --dir is given.",
    )
    p.add_argument("--dir", metavar="DIR", help="work (and keep the files) here")
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
    p.add_argument("--json", action="store_true", help="print the report as one JSON object instead of text")
    p.set_defaults(run=_cmd_demo)

    p = sub.add_parser(
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
    p.add_argument("--size", type=_parse_positive_int, help="output side of each tile (default: the store's)")
    p.add_argument("--records", type=_parse_positive_int, default=4, help="rows (default 4)")
    p.add_argument("--epochs", type=_parse_positive_int, default=8, help="columns (default 8)")
    p.add_argument("--seed", type=int, default=0, help="augmentation seed (default 0)")
    p.set_defaults(run=_cmd_augment_preview)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:
        # The reader of our output went away (`fastload info X | head`): not a failure.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (StoreError, OSError, ValueError, TypeError, ImportError) as exc:
        print(f"fastload {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except MemoryError as exc:  # e.g. a store too large for this machine's RAM
        detail = f": {exc}" if str(exc) else ""
        print(f"fastload {args.command}: error: out of memory{detail}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"fastload {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
