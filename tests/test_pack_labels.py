"""Labels of `fastload.pack` (`fastload/pack/labels.py`): CSVs of numbers or class names,
class folders, no labels; bad rows named by line (out of range, bad first row, missing files,
paths with a folder too many), CSVs that are named pipes or too large, and escaped names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_pack import ESCAPED, HOSTILE, classes, cli, image, pack_within, photo_folder

import fastload
import fastload.inspect
from fastload.cli import main as cli_main


@pytest.mark.parametrize("header", [True, False])
@pytest.mark.parametrize("encoding, newline", [("utf-8", "\n"), ("utf-8-sig", "\r\n")])
def test_csv_labels_land_on_their_records(tmp_path, header, encoding, newline):
    src = photo_folder(tmp_path / "src", ["b.png", "a.png", "sub/c.png"])
    rows = ["path,target"] * header + ["sub/c.png,2.5", "a.png,-1", "b.png,7.25"]
    (tmp_path / "labels.csv").write_bytes(newline.join(rows).encode(encoding) + newline.encode())
    store = fastload.Store(fastload.pack(src, tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv").path)
    assert store.meta["sources"] == ["a.png", "b.png", "sub/c.png"]
    assert store.label_dtype == np.float64
    assert store.labels.tolist() == [-1.0, 7.25, 2.5]


def test_class_folders_give_class_indices_and_names(tmp_path):
    src = photo_folder(tmp_path / "src", ["dog/1.png", "cat/2.png", "cat/1.png", "emu/x/deep.png"])
    progress = []
    report = fastload.pack(
        src, tmp_path / "s.fl", 8, progress=lambda done, total: progress.append((done, total))
    )
    store = fastload.Store(report.path)
    assert store.meta["class_names"] == ["cat", "dog", "emu"]
    assert store.meta["sources"] == ["cat/1.png", "cat/2.png", "dog/1.png", "emu/x/deep.png"]
    assert store.labels.tolist() == [0, 0, 1, 2] and store.label_dtype == np.int64
    assert store.meta["pack"]["resize"] == "crop" and store.meta["skipped"] == []
    assert progress[-1] == (4, 4) and report.records == 4


@pytest.mark.safety
def test_class_folders_that_read_as_one_name_are_refused(tmp_path):
    """Two folders may differ as bytes yet read the same ('é' as one code point or as e and an
    accent): their classes would show as one."""
    src = photo_folder(tmp_path / "src", ["\u00e9/1.png", "e\u0301/2.png", "x/3.png"])
    with pytest.raises(
        ValueError, match="class folders that read as one name: 'é' .*different Unicode forms"
    ):
        fastload.pack(src, tmp_path / "s.fl", 8)
    assert not (tmp_path / "s.fl").exists()


def test_csv_problems_are_reported_with_line_numbers(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png", "b.png", "c.png", "d.png"])
    (tmp_path / "labels.csv").write_text(
        "path,label\na.png,1\nmissing.png,2\nb.png,abc\nc.png,nan\nd.png,inf\na.png,3\n"
    )
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv")
    message = str(err.value)
    for line, what in [
        (3, "missing.png does not exist"),
        (4, "not a number"),
        (5, "not a finite"),
        (6, "not a finite"),
        (7, "already has a label on line 2"),
    ]:
        assert f"line {line}: " in message and what in message
    assert not (tmp_path / "s.fl").exists()


def test_int64_labels_must_be_whole(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png"])
    (tmp_path / "labels.csv").write_text("a.png,1.5\n")
    with pytest.raises(ValueError, match="line 1: a.png: label '1.5' is not a whole number"):
        fastload.pack(src, tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv", label_dtype="int64")


def test_unlabelled_images_fail_unless_skipped(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png", "b.png"])
    (src / "labels.csv").write_text("a.png,4\n")  # a labels file inside SRC is not an image to pack
    with pytest.raises(ValueError, match=r"1 image\(s\) have no label.*skip_unlabelled.*\n  b.png"):
        fastload.pack(src, tmp_path / "s.fl", 8, labels=src / "labels.csv")
    report = fastload.pack(
        src, tmp_path / "s.fl", 8, labels=src / "labels.csv", skip_unlabelled=True, strict=True
    )
    assert report.records == 1 and report.skipped == [("b.png", "no label (skipped by request)")]
    assert fastload.Store(report.path).labels.tolist() == [4]


def test_no_labels_at_all_explains_both_ways(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png"])
    with pytest.raises(ValueError, match="no labels") as err:
        fastload.pack(src, tmp_path / "s.fl", 8)
    assert "labels" in str(err.value) and "subfolder per class" in str(err.value)


def test_a_flat_folder_packs_without_labels_and_says_so(tmp_path, capsys):
    src = photo_folder(tmp_path / "src", ["b.png", "a.jpg", "sub/c.png"])
    (src / "notes.txt").write_text("not an image")
    report = fastload.pack(src, tmp_path / "s.fl", 8, no_labels=True, strict=True)
    assert report.records == 3 and report.skipped == [
        ("notes.txt", "not an image file (no label, no image extension)")
    ]
    store = fastload.Store(report.path)
    assert store.meta["sources"] == ["a.jpg", "b.png", "sub/c.png"] and store.labels.tolist() == [0, 0, 0]
    assert store.meta["labels"] == "none" and store.meta["pack"]["labels"] == "none" and not store.labelled
    assert "class_names" not in store.meta
    floats = fastload.Store(
        fastload.pack(src, tmp_path / "f.fl", 8, no_labels=True, label_dtype="float64").path
    )
    assert np.isnan(floats.labels).all() and not floats.labelled
    summary = fastload.inspect.info(store.path)
    assert summary["labelled"] is False and summary["labels"] == {}
    assert cli_main(["info", str(store.path)]) == 0
    assert "3 images of 8x8x3 uint8, no labels (packed with --no-labels)" in capsys.readouterr().out
    assert cli_main(["pack", str(src), str(tmp_path / "c.fl"), "--size", "8", "--no-labels", "--quiet"]) == 0
    assert not fastload.Store(tmp_path / "c.fl").labelled
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("a.jpg,1\n")
    with pytest.raises(ValueError, match="not both"):
        fastload.pack(src, tmp_path / "x.fl", 8, no_labels=True, labels=csv_path)
    with pytest.raises(SystemExit) as usage:
        cli_main(["pack", str(src), str(tmp_path / "x.fl"), "--no-labels", "--labels", str(csv_path)])
    assert usage.value.code == 2


def test_without_labels_the_error_offers_no_labels(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png"])
    with pytest.raises(ValueError, match=r"no labels\. .*--no-labels"):
        fastload.pack(src, tmp_path / "s.fl", 8)


def test_csv_rows_for_missing_files_fail_unless_skipped(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png", "b.png"])
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("a.png,1.5\ngone.png,2\nb.png,3\n")
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8, labels=csv_path)
    assert "line 2: gone.png does not exist in" in str(err.value)
    assert str(err.value).count("--skip-missing") == 1  # the advice once, not on every row
    assert not (tmp_path / "s.fl").exists()
    report = fastload.pack(src, tmp_path / "s.fl", 8, labels=csv_path, skip_missing=True, strict=True)
    assert report.records == 2
    assert report.skipped == [("gone.png", "in the labels CSV, but no such file (skipped by request)")]
    assert fastload.Store(report.path).labels.tolist() == [1.5, 3.0]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastload",
            "pack",
            str(src),
            str(tmp_path / "t.fl"),
            "--size",
            "8",
            "--labels",
            str(csv_path),
            "--skip-missing",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "gone.png" in result.stdout and len(fastload.Store(tmp_path / "t.fl")) == 2


def test_csv_paths_with_a_folder_too_many_are_explained_once(tmp_path, capsys):
    names = [f"{c}/{i}.png" for c in ("cat", "dog") for i in range(18)]
    src = photo_folder(tmp_path / "classes", names)
    csv_path = tmp_path / "labels.csv"  # beside SRC, its paths written from there
    csv_path.write_text("path,label\n" + "".join(f"classes/{n},{int(n.startswith('dog'))}\n" for n in names))
    for skip in (False, True):
        with pytest.raises(ValueError) as err:
            fastload.pack(src, tmp_path / "s.fl", 8, labels=csv_path, skip_missing=skip)
        message = str(err.value)
        assert "none of its 36 paths names a file in SRC" in message
        assert "all 36 start with `classes/`: they are relative to the CSV's folder" in message
        assert "without `classes/`), e.g. `cat/0.png`" in message
        assert "skip-missing" not in message and "no images to pack" not in message
        assert len(message.splitlines()) == 1
    assert (
        cli_main(["pack", str(src), str(tmp_path / "s.fl"), "--labels", str(csv_path), "--skip-missing"]) == 1
    )
    assert capsys.readouterr().err.count("classes/") == 2


def test_csv_paths_naming_nothing_say_so_once_with_the_first_rows(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png"])
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("".join(f"elsewhere{i}.png,{i}\n" for i in range(35)))
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8, labels=csv_path)
    message = str(err.value)
    assert "none of its 35 paths names a file in SRC" in message and "skip-missing" not in message
    assert "elsewhere2.png" in message and "elsewhere3.png" not in message and "... and 32 more" in message


def test_class_names_as_csv_labels_become_classes(tmp_path, capsys):
    src = photo_folder(tmp_path / "src", ["a.png", "b.png", "c.png", "d.png"])
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("file,animal\na.png,dogs\nb.png, cats\nc.png,dogs\nd.png,emus\n")
    store = fastload.Store(fastload.pack(src, tmp_path / "s.fl", 8, labels=csv_path).path)
    assert store.meta["class_names"] == ["cats", "dogs", "emus"] and store.label_dtype == np.int64
    assert store.labels.tolist() == [1, 0, 1, 2]
    assert fastload.inspect.info(store.path)["labels"]["classes"] == {"cats": 1, "dogs": 2, "emus": 1}
    # Without a header the first row is data: its name is another row's label.
    csv_path.write_text("a.png,dogs\nb.png,cats\nc.png,dogs\nd.png,dogs\n")
    store = fastload.Store(fastload.pack(src, tmp_path / "t.fl", 8, labels=csv_path).path)
    assert store.labels.tolist() == [1, 0, 1, 1]
    csv_path.write_text("a.png,dogs\nb.png,2\nc.png,dogs\nd.png,1\n")
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "u.fl", 8, labels=csv_path)
    assert "label 'dogs' is not a number" in str(err.value) and "or all of them class names" in str(err.value)
    csv_path.write_text("a.png,dogs\nb.png,cats\nc.png,dogs\nd.png,dogs\n")
    with pytest.raises(ValueError, match="label 'dogs' is not a number"):
        fastload.pack(src, tmp_path / "v.fl", 8, labels=csv_path, label_dtype="float64")


# Hostile or mistaken labels CSVs


def labelled(tmp_path: Path, csv_text: str, **kwargs):
    (tmp_path / "labels.csv").write_text(csv_text)
    return fastload.pack(tmp_path / "src", tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv", **kwargs)


@pytest.mark.safety
def test_a_named_pipe_as_labels_is_refused_without_blocking(tmp_path):
    src = classes(tmp_path / "src")
    os.mkfifo(tmp_path / "labels.csv")
    with pytest.raises(ValueError, match=r"labels\.csv: not a regular file"):
        pack_within(30, src, tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv")


@pytest.mark.safety
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


@pytest.mark.safety
def test_int64_edges_are_kept_exactly(tmp_path):
    image(tmp_path / "src" / "a.png")
    image(tmp_path / "src" / "b.png")
    store = fastload.Store(labelled(tmp_path, "a.png,9223372036854775807\nb.png,-9223372036854775808\n").path)
    assert store.labels.tolist() == [2**63 - 1, -(2**63)]


@pytest.mark.safety
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


@pytest.mark.safety
def test_csv_paths_keep_their_spaces(tmp_path):
    image(tmp_path / "src" / " lead.png", value=10)
    image(tmp_path / "src" / "lead.png", value=250)
    store = fastload.Store(labelled(tmp_path, " lead.png, 7\nlead.png,8 \n").path)
    assert store.meta["sources"] == [" lead.png", "lead.png"]
    assert store.labels.tolist() == [7, 8]
    assert int(np.asarray(store.images[0]).mean()) == 10
    with pytest.raises(ValueError, match="line 2: lead.png  does not exist"):
        labelled(tmp_path, " lead.png,7\nlead.png ,8\n", overwrite=True)


@pytest.mark.safety
def test_an_oversized_csv_is_refused_with_its_size(tmp_path, capsys):
    classes(tmp_path / "src")
    with open(tmp_path / "labels.csv", "wb") as f:
        f.truncate(300 << 20)  # sparse: takes no disk space, and is never read
    with pytest.raises(ValueError, match=r"labels\.csv: 300 MiB, over the 128 MiB limit for a labels CSV"):
        fastload.pack(tmp_path / "src", tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv")
    code, _, err = cli(capsys, tmp_path / "src", tmp_path / "s.fl", "--labels", tmp_path / "labels.csv")
    assert code == 1 and "300 MiB" in err


@pytest.mark.safety
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
