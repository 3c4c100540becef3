"""`fastload COMMAND`: what every subcommand prints and the status it exits with, pinned byte for
byte against the transcripts in tests/cli_outputs/ (one file per case).

A transcript holds the command, its exit status, its stdout and its stderr. Only what changes
from run to run or machine to machine is masked before comparing: the test's temporary folders
(``<files>``, ``<tmp>``), timings and speeds, this machine's RAM and page cache, timestamps and
the package version. Everything else (wording, layout, numbers of the models trained, which
stream a line goes to) must stay exactly as it is, so the command line can be reorganised
without its users noticing. Integers and words are compared digit for digit; floats within
``FLOAT_TOLERANCE``: a float that training computed differs in its last digits from one x86-64
CPU to another (float32 sums in another order, another SIMD width), which must not fail a run
of the suite on an Intel host for transcripts written on an AMD one.

A usage error prints its parser's usage block before the `error:` line; a transcript writes that
block as ``<usage of fastload train>``, the block itself pinned once, in the parser's help screen
(``train-help.txt``), so adding a flag rewrites one transcript, not every usage error's. argparse
lays out help screens differently from one Python version to the next, and some versions quote
the choices of an invalid choice and others do not: on a Python other than the one the
transcripts were written with, a help screen is compared by the options it lists, in order, and
choices without their quotes; everything else (exit status, stdout, the `error:` lines) is
compared as on that Python.

After an intended change of the output, rewrite the transcripts with
``FASTLOAD_CLI_TRANSCRIPTS=write pytest tests/test_cli.py`` and read the diff.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import cli
from fastload.pack import pack
from fastload.store import StoreWriter
from fastload.train import config as train_config

TRANSCRIPTS = Path(__file__).parent / "cli_outputs"
WRITE = os.environ.get("FASTLOAD_CLI_TRANSCRIPTS") == "write"
#: The Python whose argparse laid out the help screens of the transcripts.
ARGPARSE_PYTHON = (3, 11)
#: The torch whose kernels computed the training figures in the transcripts (losses, errors,
#: accuracies); with another, a float's digits may differ, so floats are compared as "F".
TRAINED_WITH_TORCH = "2.15.0"
FLOAT = r"(?<![\w.])-?\d+\.\d+(?:e[+-]?\d+)?"
#: Train on one thread, small batches, on the CPU: fast and the same figures at every run.
TRAIN = "--device cpu --threads 1 --batch-size 8 --epochs 2"
#: How far apart two printed floats may be and still be the same figure: relative, plus one unit
#: of the last printed digit (a figure printed to 4 places can round either way). float32
#: reordering moves a loss by about 1e-7 of itself per step; 1e-4 holds a few hundred steps and
#: still fails on any change to what is trained.
FLOAT_TOLERANCE = 1e-4
NUMBER = r"(?<!\w)-?\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]?\d+)?"

#: Fields that change between runs or machines; the numbers inside a match become N.
MASKED = [
    # timings and speeds
    rf"{NUMBER} img/s",
    rf"\({NUMBER} all runs\)",
    rf"data wait {NUMBER}%",
    rf'"(?:seconds|images_per_s|images_per_s_all_runs|data_wait_fraction)": {NUMBER}',
    rf"in {NUMBER} s: {NUMBER} files/s, {NUMBER} MB/s read",
    # this machine's memory and page cache
    rf"in page cache now {NUMBER} GB \({NUMBER}%\)",
    rf"this machine's {NUMBER} GB RAM holds {NUMBER} images as uint8, {NUMBER} as float32",
    rf'"(?:resident_bytes|ram_bytes|fit_in_ram_uint8|fit_in_ram_float32)": {NUMBER}',
    # the size of a packed store: its metadata names the source folder, a temporary one
    rf'"file_bytes": {NUMBER}',
]
#: The same, replaced whole: when a store was written, how many of a diverged parameter's values
#: went non-finite (overflow spreads through float32 sums in an order the CPU chooses), where the
#: store lives and this machine's GPU.
REPLACED = [
    (r'"created": "[^"]*"', '"created": "<time>"'),
    (r"\((\d+) of (\d+)\)", r"(N of \2)"),
    # where the store lives and this machine's GPU (tests/test_inspect.py checks both)
    (r"(?m)^lives on   .*$", "lives on   <this machine's filesystem>"),
    (r'"storage": \{[^}]*\}', '"storage": <this machine\'s filesystem>'),
    (r"(?m)^gpu        .*$", "gpu        <this machine's GPU>"),
    (r'"gpu": (?:null|\{[^}]*\})', '"gpu": <this machine\'s GPU>'),
]


def normalise(text: str, folders: dict, all_numbers: bool = False) -> str:
    """``text`` with the folders named by their placeholders and run-dependent figures masked."""
    for placeholder, folder in folders.items():
        text = text.replace(os.fspath(folder), placeholder)
    text = text.replace(fastload.__version__, "<version>")
    if all_numbers:
        return re.sub(r"\d+(?:[.,]\d+)*(?:e[+-]?\d+)?", "N", text)
    for pattern in MASKED:
        text = re.sub(pattern, lambda m: re.sub(NUMBER, "N", m.group(0)), text)
    for pattern, replacement in REPLACED:
        text = re.sub(pattern, replacement, text)
    return text


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The inputs every case reads: a regression store, a class store packed from folders, a
    damaged copy, runs files and an unlabelled store."""
    root = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 8, 8, 3), dtype=np.uint8)
    with StoreWriter(root / "bright.fastload", (8, 8, 3)) as writer:
        writer.extend(images, images.reshape(40, -1).mean(1) / 255.0)
    with StoreWriter(root / "unlabelled.fastload", (8, 8, 3), "int64", meta={"labels": "none"}) as writer:
        writer.extend(images[:4], np.zeros(4, np.int64))
    from PIL import Image

    for name in ("cat", "dog"):
        (root / "photos" / name).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8) // (2 if name == "cat" else 1)
            Image.fromarray(pixels).save(root / "photos" / name / f"{i:02}.png")
    pack(root / "photos", root / "pets.fastload", 8, quiet=True)
    (root / "junk").mkdir()
    for name, data in {"a.png": b"not an image", "b.txt": b"notes"}.items():
        (root / "junk" / name).write_bytes(data)
    Image.fromarray(images[0]).save(root / "junk" / "c.png")
    data = bytearray((root / "bright.fastload").read_bytes())
    for offset in (-100, -300, -500):  # inside the last records' bytes
        data[offset] ^= 0xFF
    (root / "damaged.fastload").write_bytes(bytes(data))
    runs = [{"name": "slow", "lr": 1e-3, "seed": 1}, {"name": "fast", "lr": 3e-2, "schedule": "constant"}]
    with StoreWriter(root / "counts.fastload", (8, 8, 3), "int64") as writer:
        writer.extend(images[:20], np.arange(20) % 3)
    (root / "runs.json").write_text(json.dumps(runs))
    (root / "not-json.json").write_text("[{")
    (root / "bad-key.json").write_text(json.dumps([{"name": "a", "epochs": 3}]))
    return root


# (case name, the command line after `fastload`: {files} and {tmp} are the folders, {train} the
# options every training case takes)
CASES = [
    ("help", "--help"),
    ("version", "--version"),
    ("no-command", ""),
    ("unknown-command", "frobnicate"),
    ("info", "info {files}/pets.fastload"),
    ("info-regression", "info {files}/bright.fastload"),
    ("info-unlabelled", "info {files}/unlabelled.fastload"),
    ("info-json", "info {files}/pets.fastload --json"),
    ("info-missing", "info {files}/nope.fastload"),
    ("info-not-a-store", "info {files}/runs.json"),
    ("info-help", "info --help"),
    ("verify", "verify {files}/bright.fastload"),
    ("verify-damaged", "verify {files}/damaged.fastload"),
    ("verify-damaged-limit", "verify {files}/damaged.fastload --limit 1"),
    ("verify-limit-0", "verify {files}/bright.fastload --limit 0"),
    ("verify-limit-word", "verify {files}/bright.fastload --limit all"),
    ("verify-help", "verify --help"),
    ("pack", "pack {files}/photos {tmp}/pets.fastload --size 8"),
    ("pack-quiet", "pack {files}/photos {tmp}/pets.fastload --quiet"),
    ("pack-skips", "pack {files}/junk {tmp}/junk.fastload --size 8 --no-labels"),
    ("pack-strict", "pack {files}/junk {tmp}/junk.fastload --no-labels --strict"),
    ("pack-exists", "pack {files}/photos {files}/pets.fastload"),
    ("pack-pad", "pack {files}/photos {tmp}/p.fastload --height 6 --resize pad --fill 9,8,7"),
    ("pack-bad-fill", "pack {files}/photos {tmp}/p.fastload --fill 300"),
    ("pack-bad-resize", "pack {files}/photos {tmp}/p.fastload --resize stretch"),
    ("pack-bad-size", "pack {files}/photos {tmp}/p.fastload --size 0"),
    ("pack-labels-and-no-labels", "pack {files}/photos {tmp}/p.fastload --labels x.csv --no-labels"),
    ("pack-help", "pack --help"),
    ("bench-quiet", "bench {files}/bright.fastload --quick --only memcpy --quiet"),
    ("bench-bad-repeats", "bench {files}/bright.fastload --repeats 1"),
    ("bench-bad-stage", "bench {files}/bright.fastload --only nope"),
    ("bench-help", "bench --help"),
    ("train", "train {files}/bright.fastload {train}"),
    ("train-classes", "train {files}/pets.fastload {train} --epochs 1"),
    (
        "train-json-max-steps",
        "train {files}/bright.fastload {train} --json --max-steps 7 --checkpoint {tmp}/run.ckpt",
    ),
    ("train-classes-unnamed", "train {files}/counts.fastload {train} --epochs 1 --task classification"),
    ("train-max-steps", "train {files}/bright.fastload {train} --max-steps 2"),
    ("train-runs", "train {files}/bright.fastload {train} --runs 2 --lr 1e-3,3e-2 --seed 3"),
    (
        "train-runs-lists",
        "train {files}/bright.fastload {train} --runs 2 --seed 4,5 --weight-decay 0,0.01 --schedule constant --num-features 4,8 --lattice-size 2 --data-seed 7",
    ),
    ("train-runs-stack", "train {files}/bright.fastload {train} --runs 2 --seed 1,2 --stack"),
    ("train-runs-classes", "train {files}/pets.fastload {train} --epochs 1 --runs 2 --lr 1e-3,3e-2"),
    ("train-runs-one-diverges", "train {files}/bright.fastload {train} --runs 2 --lr 3e-3,1e30"),
    ("train-runs-all-diverge", "train {files}/bright.fastload {train} --runs 2 --lr 1e30"),
    (
        "train-runs-max-steps",
        "train {files}/bright.fastload {train} --runs 2 --max-steps 3 --checkpoint {tmp}/group",
    ),
    ("train-runs-file", "train {files}/bright.fastload {train} --runs-file {files}/runs.json --lr 0.01"),
    ("train-runs-file-json", "train {files}/bright.fastload {train} --runs-file {files}/runs.json --json"),
    (
        "train-runs-file-not-json",
        "train {files}/bright.fastload {train} --runs-file {files}/not-json.json --json-log {tmp}/log",
    ),
    ("train-runs-file-bad-key", "train {files}/bright.fastload {train} --runs-file {files}/bad-key.json"),
    ("train-runs-file-missing", "train {files}/bright.fastload {train} --runs-file {files}/none.json"),
    ("train-runs-file-list", "train {files}/bright.fastload --runs-file {files}/runs.json --lr 1,2"),
    ("train-list-without-runs", "train {files}/bright.fastload --lr 1e-3,3e-3"),
    ("train-list-too-long", "train {files}/bright.fastload --runs 2 --seed 1,2,3"),
    ("train-runs-and-runs-file", "train {files}/bright.fastload --runs 2 --runs-file r.json"),
    ("train-runs-0", "train {files}/bright.fastload --runs 0"),
    ("train-bad-lr", "train {files}/bright.fastload --lr 0"),
    ("train-bad-lr-word", "train {files}/bright.fastload --lr fast"),
    ("train-bad-lr-in-list", "train {files}/bright.fastload --runs 2 --lr 1e-3,-1"),
    ("train-bad-schedule", "train {files}/bright.fastload --runs 2 --schedule cosine,linear"),
    ("train-bad-backbone", "train {files}/bright.fastload --backbone vgg"),
    ("train-bad-epochs", "train {files}/bright.fastload --epochs 0"),
    ("train-bad-seed", "train {files}/bright.fastload --seed -1"),
    ("train-bad-data-seed", "train {files}/bright.fastload --data-seed x"),
    ("train-bad-val-fraction", "train {files}/bright.fastload --val-fraction 1"),
    ("train-bad-task", "train {files}/bright.fastload --task ranking"),
    ("train-bad-amp", "train {files}/bright.fastload --amp fp8"),
    ("train-bad-augment", "train {files}/bright.fastload --augment spin"),
    ("train-val-and-val-fraction", "train {files}/bright.fastload --val v --val-fraction 0.2"),
    ("train-missing-store", "train {files}/nope.fastload {train}"),
    ("train-unlabelled", "train {files}/unlabelled.fastload {train}"),
    (
        "train-checkpoint-is-store",
        "train {files}/bright.fastload {train} --checkpoint {files}/bright.fastload",
    ),
    (
        "train-runs-checkpoint-is-store",
        "train {files}/bright.fastload {train} --runs 2 --checkpoint {files}/bright.fastload",
    ),
    ("train-json-log-is-store", "train {files}/bright.fastload {train} --json-log {files}/bright.fastload"),
    (
        "train-json-log-is-checkpoint",
        "train {files}/bright.fastload {train} --checkpoint {tmp}/c --json-log {tmp}/c",
    ),
    ("train-json-log-is-resume", "train {files}/bright.fastload {train} --resume {tmp}/c --json-log {tmp}/c"),
    ("train-resume-missing", "train {files}/bright.fastload {train} --resume {tmp}/none.ckpt"),
    ("train-runs-resume-missing", "train {files}/bright.fastload {train} --runs 2 --resume {tmp}/none"),
    ("train-help", "train --help"),
    ("demo-bad-images", "demo --images 40 --device cpu"),
    ("demo-help", "demo --help"),
    ("augment-preview", "augment-preview {files}/bright.fastload -o {tmp}/grid.png --records 2 --epochs 3"),
    (
        "augment-preview-spec",
        "augment-preview {files}/bright.fastload -o {tmp}/grid.png --augment flip,rotate=10 --size 6",
    ),
    ("augment-preview-bad-spec", "augment-preview {files}/bright.fastload -o {tmp}/g.png --augment spin"),
    ("augment-preview-missing-store", "augment-preview {files}/nope.fastload -o {tmp}/g.png"),
    ("augment-preview-no-output", "augment-preview {files}/bright.fastload"),
    ("augment-preview-bad-records", "augment-preview {files}/bright.fastload -o {tmp}/g.png --records 0"),
    ("augment-preview-help", "augment-preview --help"),
]
#: Cases run with fit's learning-rate bound raised, so that a run can diverge.
DIVERGING = {"train-runs-one-diverges", "train-runs-all-diverge"}
#: Cases run as `python -m fastload` (demo.run binds sys.stdout when it is imported, so in this
#: process it would write to a stream capsys has closed), whose every number is masked and whose
#: files are not listed: the demo's report is all timings and measured figures, and it writes
#: hundreds of images.
# The textures: the same run whether or not scikit-image (fastload[bench]) is installed (#42).
SLOW_CASES = [
    ("demo", "demo --images 100 --size 16 --epochs 1 --device cpu --images-from textures --dir {tmp}/demo")
]


def run(argv: list, capsys, subprocess_: bool = False) -> tuple:
    """(exit status, stdout, stderr) of ``fastload ARGV`` run in this process, argparse's exits
    (usage errors, --help, --version) included; or run as ``python -m fastload`` in a process
    of its own."""
    if subprocess_:
        done = subprocess.run(
            [sys.executable, "-m", "fastload", *argv], capture_output=True, text=True, timeout=600
        )
        return done.returncode, done.stdout, done.stderr
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def within_tolerance(got: str, expected: str) -> bool:
    """Whether two printed floats are the same figure within ``FLOAT_TOLERANCE``."""
    last_digit = max(10.0 ** -len(text.split("e")[0].split(".")[1]) for text in (got, expected))
    exponent = min(int(text.split("e")[1]) if "e" in text else 0 for text in (got, expected))
    slack = last_digit * 10.0**exponent
    a, b = float(got), float(expected)
    return abs(a - b) <= FLOAT_TOLERANCE * max(abs(a), abs(b)) + slack


def with_close_floats_as_expected(got: str, expected: str) -> str:
    """``got`` with each float that is within tolerance of its place in ``expected`` written as
    there, so that what is left to compare is every string, every integer and each float that is
    too far off (and a failure shows just those)."""
    got_parts, expected_parts = re.split(f"({FLOAT})", got), re.split(f"({FLOAT})", expected)
    if len(got_parts) != len(expected_parts):
        return got
    for i in range(1, len(got_parts), 2):  # re.split puts each float at an odd index
        if within_tolerance(got_parts[i], expected_parts[i]):
            got_parts[i] = expected_parts[i]
    return "".join(got_parts)


def usage_blocks() -> dict:
    """The usage block of ``fastload`` and of each subcommand, as a usage error prints it, by
    the placeholder a transcript writes instead (``<usage of fastload train>``)."""
    parser = cli.build_parser()
    parsers = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers += action.choices.values()
    return {f"<usage of {p.prog}>\n": p.format_usage() for p in parsers}


def with_usage_named(err: str) -> str:
    """``err`` with a usage block written as its placeholder."""
    for placeholder, block in usage_blocks().items():
        if err.startswith(block):
            return placeholder + err[len(block) :]
    return err


def layout_free(text: str, help_screen: bool) -> str:
    """What of a transcript argparse writes alike on every Python: a help screen's options in the
    order it lists them (not its layout), and an invalid choice's choices without quotes."""
    text = re.sub(r"\(choose from ([^)]*)\)", lambda m: m.group(0).replace("'", ""), text)
    if not help_screen:
        return text
    head, rest = text.split("--- stdout\n", 1)
    out, tail = rest.split("--- stderr\n", 1)
    options = dict.fromkeys(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", out))
    return f"{head}--- stdout\noptions: {' '.join(options)}\n--- stderr\n{tail}"


def transcript(argv: list, status, out: str, err: str, written: str = "") -> str:
    text = f"$ fastload {' '.join(argv)}\nexit status {status}\n--- stdout\n{out}--- stderr\n{err}"
    return text + (f"--- files written\n{written}" if written else "")


def files_in(folder: Path) -> str:
    """The files under ``folder``, one relative path a line, sorted."""
    return "".join(f"{p.relative_to(folder)}\n" for p in sorted(folder.rglob("*")) if p.is_file())


def check_case(name, argv, files, tmp_path, capsys, monkeypatch, slow=False):
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps help and usage to the terminal's width
    monkeypatch.chdir(tmp_path)
    if name in DIVERGING:
        monkeypatch.setattr(train_config, "MAX_LR", 1e31)
    argv = argv.format(files=files, tmp=tmp_path, train=TRAIN).split()
    status, out, err = run(argv, capsys, subprocess_=slow)
    placeholders = {"<files>": files, "<tmp>": tmp_path}
    shown = [normalise(arg, placeholders) for arg in argv]
    out, err = (normalise(text, placeholders, all_numbers=slow) for text in (out, err))
    help_screen = "--help" in argv
    if not help_screen:
        err = with_usage_named(err)
    got = transcript(shown, status, out, err, "" if slow else files_in(tmp_path))
    path = TRANSCRIPTS / f"{name}.txt"
    if WRITE:
        TRANSCRIPTS.mkdir(exist_ok=True)
        path.write_text(got)
    expected = path.read_text()
    if sys.version_info[:2] != ARGPARSE_PYTHON:
        got, expected = (layout_free(text, help_screen) for text in (got, expected))
    if name.startswith("train") and torch.__version__.split("+")[0] != TRAINED_WITH_TORCH:
        got, expected = (re.sub(FLOAT, "F", text) for text in (got, expected))
    got = with_close_floats_as_expected(got, expected)
    assert got == expected, f"{name}: the output differs from {path}"


@pytest.mark.parametrize("name, argv", CASES, ids=[c[0] for c in CASES])
def test_cli_output_is_unchanged(name, argv, files, tmp_path, capsys, monkeypatch):
    check_case(name, argv, files, tmp_path, capsys, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("name, argv", SLOW_CASES, ids=[c[0] for c in SLOW_CASES])
def test_cli_output_of_slow_commands_is_unchanged(name, argv, files, tmp_path, capsys, monkeypatch):
    check_case(name, argv, files, tmp_path, capsys, monkeypatch, slow=True)


def test_floats_from_another_cpu_match_and_any_other_change_does_not():
    # #35: printed on an Intel host, for a transcript written on an AMD one.
    expected = '{"step": 5, "train_loss": 0.0004428232334450715, "val_mae": 0.0114}'
    intel = '{"step": 5, "train_loss": 0.00044282313643230335, "val_mae": 0.0115}'
    assert with_close_floats_as_expected(intel, expected) == expected
    for changed in (
        '{"step": 6, "train_loss": 0.0004428232334450715, "val_mae": 0.0114}',  # an integer
        '{"step": 5, "train_loss": 0.0004438232334450715, "val_mae": 0.0114}',  # a loss, by 2e-3
        '{"step": 5, "train_loss": 0.0004428232334450715, "val_mae": 0.0116}',  # two last digits
        '{"step": 5, "tra1n_loss": 0.0004428232334450715, "val_mae": 0.0114}',  # a word
    ):
        assert with_close_floats_as_expected(changed, expected) != expected, changed
    assert within_tolerance("1.5e-05", "1.6e-05") and not within_tolerance("1.5e-05", "1.7e-05")


def test_every_transcript_has_its_case():
    names = {name for name, _ in CASES + SLOW_CASES}
    assert sorted(p.stem for p in TRANSCRIPTS.glob("*.txt") if p.stem not in names) == []


def test_python_m_fastload_is_the_same_command(files, tmp_path):
    """`python -m fastload` (and the `fastload` script, which calls the same main) exits with
    main's status and prints the same output."""
    done = subprocess.run(
        [sys.executable, "-m", "fastload", "verify", os.fspath(files / "damaged.fastload"), "--limit", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    argv = ["verify", "<files>/damaged.fastload", "--limit", "1"]
    out, err = (normalise(text, {"<files>": files}) for text in (done.stdout, done.stderr))
    assert (
        transcript(argv, done.returncode, out, err) == (TRANSCRIPTS / "verify-damaged-limit.txt").read_text()
    )


def test_another_pythons_argparse_layout_matches_and_a_changed_option_or_error_does_not():
    """On a Python other than ARGPARSE_PYTHON a help screen compares by the options it lists and
    an invalid choice by its choices: argparse 3.13 writes `-o, --output PNG` where 3.11 wrote
    `-o PNG, --output PNG`, and some versions drop the choices' quotes."""
    expected = (TRANSCRIPTS / "augment-preview-help.txt").read_text()
    relaid = expected.replace("-o PNG, --output PNG", "-o, --output PNG").replace("  ", " ")
    assert relaid != expected and layout_free(relaid, True) == layout_free(expected, True)
    assert layout_free(expected.replace("--records", "--rows"), True) != layout_free(expected, True)
    error = (TRANSCRIPTS / "train-bad-task.txt").read_text()
    unquoted = error.replace("'regression', 'classification'", "regression, classification")
    assert layout_free(unquoted, False) == layout_free(error, False)
    for changed in (error.replace("ranking'", "rank'"), error.replace("exit status 2", "exit status 1")):
        assert layout_free(changed, False) != layout_free(error, False)


def test_a_usage_error_names_its_parsers_usage_block_and_nothing_else():
    usage = usage_blocks()["<usage of fastload train>\n"]
    assert usage.startswith("usage: fastload train [-h]") and usage.endswith("store\n")
    err = "fastload train: error: argument --epochs: must be at least 1, not 0\n"
    assert with_usage_named(usage + err) == "<usage of fastload train>\n" + err
    assert with_usage_named(usage.replace("--stack", "--stacked") + err).startswith("usage: fastload train")
