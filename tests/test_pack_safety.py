"""`fastload pack` under hostile folders and slips: bounded workers and record sizes, files
swapped for named pipes, Ctrl-C during a long chunk, out-of-range or misplaced CSV labels,
control characters in names, and symbolic links out of SRC."""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload import _core
from fastload.cli import main as cli_main
from fastload.pack import LINK_OUTSIDE_SRC


def image(path: Path, side: int = 8, value: int = 100) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((side, side, 3), value, np.uint8)).save(path)
    return path


def classes(src: Path) -> Path:
    image(src / "cat" / "a.png")
    image(src / "dog" / "b.png", value=200)
    return src


def cli(capsys, *args) -> tuple:
    code = cli_main(["pack", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def pack_within(seconds: float, *args, **kwargs):
    """`pack` in a thread that must finish within `seconds` (a blocked decode fails the test)."""
    result = {}

    def run():
        try:
            result["report"] = fastload.pack(*args, **kwargs)
        except Exception as exc:  # handed to the test
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"pack did not finish within {seconds} s"
    if "error" in result:
        raise result["error"]
    return result["report"]


# 5: bounded workers and chunk memory


def test_workers_are_bounded_by_the_cores(tmp_path, capsys):
    src = classes(tmp_path / "src")
    cores = os.cpu_count()
    bound = f"workers must be between 1 and {_core.PACK_MAX_WORKERS} (this machine has"
    with pytest.raises(ValueError, match=re.escape(bound) + r" \d+ cores\), not 100000"):
        fastload.pack(src, tmp_path / "s.fl", 8, workers=100_000)
    for wrong in (-3, 10**26):  # one message, however far out (not an OverflowError)
        with pytest.raises(ValueError, match=re.escape(bound) + rf" \d+ cores\), not {wrong}"):
            fastload.pack(src, tmp_path / "s.fl", 8, workers=wrong)
    code, _, err = cli(capsys, src, tmp_path / "s.fl", "--size", 8, "--workers", 100_000)
    assert code == 1 and bound in err and "Traceback" not in err
    assert not (tmp_path / "s.fl").exists()
    assert 4 <= _core.PACK_MAX_WORKERS <= 4 * cores
    assert (
        len(fastload.Store(fastload.pack(src, tmp_path / "s.fl", 8, workers=_core.PACK_MAX_WORKERS).path))
        == 2
    )


def test_a_record_larger_than_a_chunk_may_hold_is_refused(tmp_path, capsys):
    src = classes(tmp_path / "src")
    with pytest.raises(ValueError, match=r"size 10000x10000: one record takes 286 MiB, over the 256 MiB"):
        fastload.pack(src, tmp_path / "s.fl", 10000)
    code, _, err = cli(capsys, src, tmp_path / "s.fl", "--height", 9000, "--width", 12000)
    assert code == 1 and "over the 256 MiB" in err
    with pytest.raises(ValueError, match="between 1 and 65535"):
        fastload.pack(src, tmp_path / "s.fl", (1, 70000))
    assert not (tmp_path / "s.fl").exists()
    assert _core.PACK_DECODE_MEMORY_BUDGET == 2 << 30


# 6: named pipes and Ctrl-C


def test_a_file_replaced_by_a_named_pipe_after_the_walk_is_reported(tmp_path, monkeypatch):
    src = classes(tmp_path / "src")
    pack_module = importlib.import_module("fastload.pack")  # `fastload.pack` is the function
    walk = pack_module._walk

    def walk_then_swap(*args):
        listing = walk(*args)
        os.remove(src / "dog" / "b.png")
        os.mkfifo(src / "dog" / "b.png")
        return listing

    monkeypatch.setattr(pack_module, "_walk", walk_then_swap)
    report = pack_within(30, src, tmp_path / "s.fl", 8, workers=1)
    assert report.records == 1
    assert ("dog/b.png", "not a regular file (a named pipe)") in report.skipped


def test_a_named_pipe_as_labels_is_refused_without_blocking(tmp_path):
    src = classes(tmp_path / "src")
    os.mkfifo(tmp_path / "labels.csv")
    with pytest.raises(ValueError, match=r"labels\.csv: not a regular file"):
        pack_within(30, src, tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv")


def test_ctrl_c_stops_a_long_chunk_within_a_second_and_leaves_nothing(tmp_path):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    y, x = np.mgrid[0:4000, 0:4000]
    big = np.stack([x % 256, y % 256, (x + y) % 256], axis=-1).astype(np.uint8)
    Image.fromarray(big).save(src / "0.jpg", quality=90)
    for i in range(1, 16):  # one chunk of 16 files, seconds of decoding on one thread
        os.link(src / "0.jpg", src / f"{i}.jpg")
    dest = tmp_path / "s.fl"
    proc = subprocess.Popen(  # 2048: over half the side, so JPEGs decode at full scale (no DCT shortcut)
        [
            sys.executable,
            "-m",
            "fastload",
            "pack",
            str(tmp_path / "src"),
            str(dest),
            "--size",
            "2048",
            "--workers",
            "1",
            "--quiet",
        ],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not any(p.name.endswith(".fastload-partial") for p in tmp_path.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    time.sleep(0.5)  # inside the first chunk's decoding
    assert proc.poll() is None, "the pack finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=30)
    waited = time.monotonic() - sent
    assert proc.returncode == 130 and b"interrupted" in err
    assert waited < 1.5, f"Ctrl-C took {waited:.1f} s"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


# 13: labels CSV


def labelled(tmp_path: Path, csv_text: str, **kwargs):
    (tmp_path / "labels.csv").write_text(csv_text)
    return fastload.pack(tmp_path / "src", tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv", **kwargs)


@pytest.mark.parametrize(
    "label, dtype, reason",
    [
        ("99999999999999999999", None, "label '99999999999999999999' is out of int64 range"),
        ("-9223372036854775809", "int64", "label '-9223372036854775809' is out of int64 range"),
        ("1e30", "int64", "label '1e30' is out of int64 range"),
        ("1e400", None, "label '1e400' is out of float64 range"),
        ("-1e400", "float64", "label '-1e400' is out of float64 range"),
        ("inf", None, "label 'inf' is not a finite number"),
    ],
)
def test_a_label_out_of_range_names_its_line(tmp_path, label, dtype, reason):
    image(tmp_path / "src" / "a.png")
    image(tmp_path / "src" / "b.png")
    with pytest.raises(ValueError, match=r"labels\.csv: 1 bad row") as info:
        labelled(tmp_path, f"path,label\na.png,1\nb.png,{label}\n", label_dtype=dtype)
    assert f"line 3: b.png: {reason}" in str(info.value)
    assert not (tmp_path / "s.fl").exists()


def test_int64_edges_are_kept_exactly(tmp_path):
    image(tmp_path / "src" / "a.png")
    image(tmp_path / "src" / "b.png")
    store = fastload.Store(labelled(tmp_path, "a.png,9223372036854775807\nb.png,-9223372036854775808\n").path)
    assert store.labels.tolist() == [2**63 - 1, -(2**63)]


def test_a_bad_first_row_is_reported_not_taken_for_a_header(tmp_path, capsys):
    image(tmp_path / "src" / "a.png")
    image(tmp_path / "src" / "b.png")
    with pytest.raises(ValueError, match="line 1: a.png: label 'cat' is not a number"):
        labelled(tmp_path, "a.png,cat\nb.png,2\n")
    code, _, err = cli(capsys, tmp_path / "src", tmp_path / "s.fl", "--labels", tmp_path / "labels.csv")
    assert code == 1 and "line 1: a.png: label 'cat' is not a number" in err
    # A header names no file: it is skipped whatever its words.
    store = fastload.Store(labelled(tmp_path, "filename,breed score\na.png,1\nb.png,2\n").path)
    assert store.labels.tolist() == [1, 2]


def test_csv_paths_keep_their_spaces(tmp_path):
    image(tmp_path / "src" / " lead.png", value=10)
    image(tmp_path / "src" / "lead.png", value=250)
    store = fastload.Store(labelled(tmp_path, " lead.png, 7\nlead.png,8 \n").path)
    assert store.meta["sources"] == [" lead.png", "lead.png"]
    assert store.labels.tolist() == [7, 8]
    assert int(np.asarray(store.images[0]).mean()) == 10
    with pytest.raises(ValueError, match="line 2: lead.png  does not exist"):
        labelled(tmp_path, " lead.png,7\nlead.png ,8\n", overwrite=True)


def test_an_oversized_csv_is_refused_with_its_size(tmp_path, capsys):
    classes(tmp_path / "src")
    with open(tmp_path / "labels.csv", "wb") as f:
        f.truncate(300 << 20)  # sparse: takes no disk space, and is never read
    with pytest.raises(ValueError, match=r"labels\.csv: 300 MiB, over the 128 MiB limit for a labels CSV"):
        fastload.pack(tmp_path / "src", tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv")
    code, _, err = cli(capsys, tmp_path / "src", tmp_path / "s.fl", "--labels", tmp_path / "labels.csv")
    assert code == 1 and "300 MiB" in err


# 14: control characters in names

HOSTILE = "a\x1b[31mred\r\n.jpg"
ESCAPED = "a\\x1b[31mred\\r\\n.jpg"


def test_control_characters_in_names_are_printed_escaped(tmp_path, capsys):
    src = classes(tmp_path / "src")
    (src / "cat" / HOSTILE).write_bytes(b"not an image")
    (src / "cat" / "bidi\u202egpj.exe.png").write_bytes(b"not an image either")
    report = fastload.pack(src, tmp_path / "s.fl", 8)
    assert (f"cat/{HOSTILE}", "not an image (unrecognised file format)") in report.skipped
    text = str(report)
    assert f"cat/{ESCAPED}: not an image" in text and "cat/bidi\\u202egpj.exe.png" in text
    assert not any(c in text for c in "\x1b\r\u202e")
    store = fastload.Store(tmp_path / "s.fl")
    assert f"cat/{HOSTILE}" in [s["file"] for s in store.meta["skipped"]]  # the metadata keeps the name

    code, out, err = cli(capsys, src, tmp_path / "t.fl", "--size", 8)
    assert code == 0 and f"cat/{ESCAPED}" in out
    code, out, err = cli(capsys, src, tmp_path / "u.fl", "--size", 8, "--strict")
    assert code == 1 and f"cat/{ESCAPED}" in err
    for printed in (out, err):
        assert "\x1b" not in printed and "\r" not in printed


def test_control_characters_are_escaped_in_label_errors(tmp_path, capsys):
    image(tmp_path / "src" / HOSTILE)
    with pytest.raises(ValueError, match="have no label") as info:
        labelled(tmp_path, "path,label\n")
    assert ESCAPED in str(info.value) and "\x1b" not in str(info.value)
    with pytest.raises(ValueError) as info:
        labelled(tmp_path, f'"{HOSTILE}",x\n"{HOSTILE}x",1\n')
    assert f"{ESCAPED}: label 'x' is not a number" in str(info.value)
    assert f"{ESCAPED}x does not exist" in str(info.value)
    assert "\x1b" not in str(info.value)


# 15: symbolic links


def test_symbolic_links_out_of_src_are_skipped_unless_asked(tmp_path, capsys):
    src = classes(tmp_path / "src")
    outside = image(tmp_path / "elsewhere" / "out.png")
    image(tmp_path / "elsewhere" / "more" / "deep.png")
    image(src / ".store" / "hidden_target.png")
    os.symlink(outside, src / "cat" / "out.png")
    os.symlink(tmp_path / "elsewhere" / "more", src / "cat" / "outdir")
    os.symlink("/", src / "cat" / "root")
    os.symlink(tmp_path, src / "dog" / "parent")
    os.symlink("../dog/b.png", src / "cat" / "in.png")  # inside: packed as today
    os.symlink("../.store", src / "cat" / "indir")

    loop = "symbolic link to a folder that contains SRC (a loop; never followed)"
    report = pack_within(60, src, tmp_path / "s.fl", 8)
    assert fastload.Store(report.path).meta["sources"] == [
        "cat/a.png",
        "cat/in.png",
        "cat/indir/hidden_target.png",
        "dog/b.png",
    ]
    skipped = dict(report.skipped)
    assert skipped["cat/out.png"] == LINK_OUTSIDE_SRC and skipped["cat/outdir"] == LINK_OUTSIDE_SRC
    assert skipped["cat/root"] == loop and skipped["dog/parent"] == loop

    report = pack_within(60, src, tmp_path / "t.fl", 8, follow_symlinks=True)
    assert fastload.Store(report.path).meta["sources"] == [
        "cat/a.png",
        "cat/in.png",
        "cat/indir/hidden_target.png",
        "cat/out.png",
        "cat/outdir/deep.png",
        "dog/b.png",
    ]
    assert dict(report.skipped)["cat/root"] == loop and dict(report.skipped)["dog/parent"] == loop

    code, out, _ = cli(capsys, src, tmp_path / "u.fl", "--size", 8, "--follow-symlinks")
    assert code == 0 and "packed 6 images" in out
