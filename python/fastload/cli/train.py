"""`fastload train STORE`: train an image regressor or classifier, one run or several at once
(``--runs N`` with comma lists, or ``--runs-file``): the parser, and a handler that hands the
flags to :func:`fastload.train.fit` or :func:`fastload.train.fit_many` and prints their outcome.
How runs are built from comma lists or a runs file, their table and the exit status are
:mod:`fastload.train.runs`'s."""

from __future__ import annotations

import argparse
import sys

from fastload.options import AMP_MODES, BACKBONES, MAX_RUNS, MAX_RUNS_FILE_BYTES, SCHEDULES, TASKS


def augment_spec(text: str):
    """The `Augment` of a spec, parsed here once (TrainConfig keeps it), so a bad one is a
    usage error."""
    from fastload.augment import Augment

    try:
        return Augment.from_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def train_option(name: str, parse=int):
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


def train_values(name: str, parse=int, choices=None):
    """An argparse type for a per-run train option: one value or a comma list (one per run of
    --runs), each checked as :func:`train_option` does or against ``choices``."""
    one = train_option(name, parse) if choices is None else parse

    def convert(text: str) -> list:
        values = [one(part.strip()) for part in text.split(",")]
        for value in values:
            if choices is not None and value not in choices:
                raise argparse.ArgumentTypeError(f"must be one of {', '.join(choices)}, not {value!r}")
        return values

    convert.__name__ = parse.__name__
    return convert


def flag(name: str) -> str:
    """The command line's flag for fit's option ``name``."""
    return "--" + name.replace("_", "-")


def add_parser(commands) -> None:
    p = commands.add_parser(
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
        type=train_option("val_fraction", float),
        default=0.1,
        help="share of STORE held out (default 0.1)",
    )
    add_loop_arguments(p)
    add_model_arguments(p)
    p.set_defaults(run=run, parser=p, explain_warning=explain)


def add_loop_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the runs (one, or a group) and of their training loop."""
    runs = p.add_mutually_exclusive_group()
    runs.add_argument(
        "--runs",
        type=train_option("runs"),
        metavar="N",
        help=f"train N models at once (at most {MAX_RUNS}) on one stream of batches; per-run flags (--lr, --seed, --schedule, "
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
        type=train_option("data_seed"),
        metavar="N",
        help="seed of the split, normalization sample and batch order (with --runs: shared by the runs; "
        "default: --seed when it is one value, else 0)",
    )
    p.add_argument(
        "--augment",
        type=augment_spec,
        default="",
        metavar="SPEC",
        help="augment training batches on the device: crop[=MIN_SCALE], flip, vflip, jitter[=X], rotate[=DEG], "
        "translate[=F], comma-separated; validation is never augmented",
    )
    p.add_argument(
        "--patience",
        type=train_option("patience"),
        metavar="N",
        help="stop a run after N epochs without a better validation RMSE (classification: loss)",
    )
    p.add_argument("--epochs", type=train_option("epochs"), default=10, help="default 10")
    p.add_argument("--batch-size", type=train_option("batch_size"), default=64, help="default 64")
    p.add_argument(
        "--lr",
        type=train_values("lr", float),
        metavar="LR[,LR...]",
        help="peak AdamW learning rate (default 3e-3)",
    )
    p.add_argument(
        "--schedule",
        type=train_values("schedule", str, SCHEDULES),
        metavar="|".join(SCHEDULES),
        help="learning-rate schedule (default cosine)",
    )
    p.add_argument(
        "--weight-decay",
        type=train_values("weight_decay", float),
        metavar="WD[,WD...]",
        help="AdamW weight decay (default 0)",
    )
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    p.add_argument("--amp", choices=AMP_MODES, default="off", help="mixed precision")
    p.add_argument(
        "--workers",
        type=train_option("workers"),
        default=0,
        help="DataLoader workers; 0 = Rust threads only",
    )
    p.add_argument(
        "--on-device",
        action="store_true",
        help="hold the store on the device as uint8 and gather batches there (no copy per epoch)",
    )
    p.add_argument(
        "--threads", type=train_option("threads"), help="torch CPU threads (default: torch's choice)"
    )
    p.add_argument(
        "--seed",
        type=train_values("seed"),
        metavar="N[,N...]",
        help="seed of the model and (alone) of the data (default 0)",
    )
    p.add_argument("--checkpoint", metavar="PATH", help="save here at every epoch end (atomically)")
    p.add_argument(
        "--checkpoint-every",
        type=train_option("checkpoint_every"),
        metavar="N",
        help="also save every N steps",
    )
    p.add_argument("--resume", metavar="PATH", help="continue a run from its checkpoint, mid-epoch included")
    p.add_argument(
        "--max-steps",
        type=train_option("max_steps"),
        metavar="N",
        help="stop (and save) after N steps in total",
    )


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the model's inputs and architecture, and of the epochs' report."""
    p.add_argument(
        "--monotone-inputs",
        metavar="NPY",
        help=".npy of per-record scalars aligned with STORE, shape (N,) or (N, K): the model never "
        "predicts less (classification: no class logit falls) when one of them rises",
    )
    p.add_argument("--val-monotone-inputs", metavar="NPY", help="the same for the --val store")
    p.add_argument(
        "--backbone",
        type=train_values("backbone", str, BACKBONES),
        metavar="|".join(BACKBONES),
        help="image feature extractor (default small-cnn; resnet18 needs torchvision)",
    )
    p.add_argument(
        "--num-features",
        type=train_values("num_features"),
        metavar="N[,N...]",
        help="image features (default 8)",
    )
    p.add_argument(
        "--lattice-size",
        type=train_values("lattice_size"),
        metavar="N[,N...]",
        help="lattice keypoints per input (default 3)",
    )
    p.add_argument(
        "--ordinal",
        action="store_true",
        help="ordered classes (grades, ratings): a cumulative-link head, P(class >= k) monotone in every "
        "monotone input",
    )
    p.add_argument(
        "--size",
        type=train_option("size"),
        help="downscale images to SIZExSIZE on the device before the backbone",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line per epoch instead of text")
    p.add_argument("--json-log", metavar="PATH", help="append one JSON line per epoch to PATH")


def explain(message: str) -> str:
    """A warning raised while training, in fastload's words (`fastload.train.explain_warning`)."""
    from fastload.train import explain_warning

    return explain_warning(message)


def run(args: argparse.Namespace) -> int:
    from fastload import train
    from fastload.train import runs as train_runs

    # The flags' own names in the messages: the API's check (TrainConfig's) names its arguments.
    inputs = {
        "store": args.store,
        "--val store": args.val,
        "--monotone-inputs file": args.monotone_inputs,
        "--val-monotone-inputs file": args.val_monotone_inputs,
    }
    train.check_outputs({"--checkpoint": args.checkpoint}, inputs)
    read = {**inputs, "--checkpoint": args.checkpoint, "--resume checkpoint": args.resume}
    train.check_outputs({"--json-log": args.json_log}, read)
    per_run = [name for name in train.RUN_OPTIONS if name != "name"]  # the flags taking comma lists
    lists = {name: getattr(args, name) for name in per_run if getattr(args, name) is not None}
    try:
        shared, varying = train_runs.split_values(lists, args.runs, spell=flag)
    except ValueError as exc:
        args.parser.error(str(exc))
    grouped = args.runs is not None or args.runs_file is not None
    if args.stack and not grouped:
        args.parser.error("--stack stacks the runs of a group: give --runs N or --runs-file with it")
    if args.checkpoint_every is not None and args.checkpoint is None:
        args.parser.error("--checkpoint-every saves to --checkpoint: give --checkpoint PATH with it")
    options = dict(
        task=args.task,
        val=args.val,
        val_fraction=args.val_fraction,
        epochs=args.epochs,
        batch_size=args.batch_size,
        device=args.device,
        amp=args.amp,
        workers=args.workers,
        on_device=args.on_device,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        monotone_inputs=args.monotone_inputs,
        val_monotone_inputs=args.val_monotone_inputs,
        ordinal=args.ordinal,
        size=args.size,
        max_steps=args.max_steps,
        patience=args.patience,
        augment=args.augment,
        threads=args.threads,
        data_seed=args.data_seed,
        log=train.epoch_logger(json_lines=args.json, json_log=args.json_log),
        **shared,
    )
    if not grouped:
        results = [train.fit(args.store, **options)]
    else:
        if args.runs_file is not None:
            runs = train.read_runs_file(args.runs_file)
        else:
            runs = train_runs.runs_from_values(varying, args.runs)
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
    return train_runs.exit_status(results)
