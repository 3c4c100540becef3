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
from pack_helpers import ESCAPED, HOSTILE, classes, cli, image, pack_within, photo_folder

import fastload
import fastload.inspect
from fastload.cli import main as cli_main
from fastload.pack.labels import find_labels, read_label_csv


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


# The labels module on its own: messages word for word, CSV edge cases


def read_csv(tmp_path: Path, text, files, label_dtype=None, **kwargs):
    """`read_label_csv` of a CSV written in `tmp_path` (bytes as given, or text), SRC `tmp_path/src`."""
    csv_path = tmp_path / "labels.csv"
    csv_path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return read_label_csv(csv_path, tmp_path / "src", set(files), label_dtype, **kwargs)


def csv_error(tmp_path: Path, text, files, label_dtype=None, **kwargs) -> str:
    with pytest.raises(ValueError) as err:
        read_csv(tmp_path, text, files, label_dtype, **kwargs)
    return str(err.value)


def test_csv_rows_are_reported_word_for_word(tmp_path):
    csv_path = tmp_path / "labels.csv"
    message = csv_error(
        tmp_path, "a.png,1,2\nb.png, \nc.png,1\nd.png\n", ["a.png", "b.png", "c.png", "d.png"]
    )
    assert message == (
        f"{csv_path}: 3 bad row(s):\n"
        "  line 1: expected 2 columns (path,label), found 3\n"
        "  line 2: b.png: empty label\n"
        "  line 4: expected 2 columns (path,label), found 1"
    )
    # A row for a missing file (not skipped) and a mix of names and numbers: both advices.
    message = csv_error(tmp_path, "a.png,cat\nb.png,1\ngone.png,2\n", ["a.png", "b.png"])
    assert message == (
        f"{csv_path}: 2 bad row(s) (1 name no file: skip_missing=True / --skip-missing leaves those rows "
        "out); labels are numbers, or all of them class names (made classes in sorted order):\n"
        "  line 1: a.png: label 'cat' is not a number\n"
        f"  line 3: gone.png does not exist in {tmp_path / 'src'}"
    )


def test_csv_that_is_not_utf8_or_not_csv_is_named(tmp_path):
    csv_path = tmp_path / "labels.csv"
    assert csv_error(tmp_path, b"a.png,1\n\xff.png,2\n", ["a.png"]) == (
        f"{csv_path}: not UTF-8 text (invalid start byte at byte 8)"
    )
    assert csv_error(tmp_path, "a.png," + "1" * 200_000 + "\n", ["a.png"]) == (
        f"{csv_path}: not a CSV file: field larger than field limit (131072)"
    )


def test_a_csv_of_numbers_gives_no_class_names_and_whole_floats_become_int64(tmp_path):
    files = ["a.png", "b.png", "c.png"]
    assert read_csv(tmp_path, "a.png,1\nb.png,2\n", files) == ({"a.png": 1, "b.png": 2}, "int64", [], None)
    labels, dtype, missing, class_names = read_csv(tmp_path, "a.png,2.0\nb.png,1e3\n", files, "int64")
    assert labels == {"a.png": 2, "b.png": 1000} and dtype == "int64" and class_names is None
    src = photo_folder(tmp_path / "src", files)
    (tmp_path / "numbers.csv").write_text("a.png,1\nb.png,2\nc.png,3\n")
    store = fastload.Store(fastload.pack(src, tmp_path / "s.fl", 8, labels=tmp_path / "numbers.csv").path)
    assert "class_names" not in store.meta and store.labels.tolist() == [1, 2, 3]


@pytest.mark.parametrize("label", ["+inf", "-inf", "-Infinity", "INFINITY", "nan"])
def test_an_infinite_label_written_as_such_is_not_finite_not_out_of_range(tmp_path, label):
    message = csv_error(tmp_path, f"a.png,{label}\n", ["a.png"])
    assert message.endswith(f"line 1: a.png: label '{label}' is not a finite number")


def test_absolute_csv_paths_name_files_under_src(tmp_path):
    src = tmp_path / "src"
    files = ["cat/a.png", "dog/b.png"]
    text = f"{src / 'cat' / 'a.png'},cats\n{src / 'dog' / 'b.png'},dogs\n"
    labels, dtype, _, class_names = read_csv(tmp_path, text, files)  # the first row is data, not a header
    assert labels == {"cat/a.png": 0, "dog/b.png": 1} and class_names == ["cats", "dogs"]


def test_a_first_row_naming_no_file_is_data_when_its_label_is_a_class_below(tmp_path):
    files = ["b.png", "c.png"]
    message = csv_error(tmp_path, "gone.png,dogs\nb.png,dogs\nc.png,cats\n", files)
    assert message.endswith(f"line 1: gone.png does not exist in {tmp_path / 'src'}")
    # A header's label is no class: the row is left out.
    labels, _, missing, class_names = read_csv(tmp_path, "file,animal\nb.png,dogs\nc.png,cats\n", files)
    assert labels == {"b.png": 1, "c.png": 0} and missing == [] and class_names == ["cats", "dogs"]


def test_a_missing_row_is_an_error_unless_skip_missing(tmp_path):
    files = ["a.png"]
    assert "gone.png does not exist" in csv_error(tmp_path, "a.png,1\ngone.png,2\n", files)
    assert read_csv(tmp_path, "a.png,1\ngone.png,2\n", files, skip_missing=True)[2] == ["gone.png"]


def test_csv_class_names_that_read_as_one_name_are_refused(tmp_path):
    text = "a.png,\u00e9\nb.png,e\u0301\nc.png,\u00c5\nd.png,A\u030a\n"
    message = csv_error(tmp_path, text, ["a.png", "b.png", "c.png", "d.png"])
    assert message == (
        f"{tmp_path / 'labels.csv'}: class names that read as one name: "
        "'Å' (labels 0 as 'A\\u030a', 2 as '\\xc5': one text in different Unicode forms); "
        "'é' (labels 1 as 'e\\u0301', 3 as '\\xe9': one text in different Unicode forms)"
    )


@pytest.mark.safety
def test_a_file_name_with_a_carriage_return_is_labelled_from_a_quoted_cell(tmp_path):
    labels, *_ = read_csv(tmp_path, 'path,label\n"x\ry.png",1\n"a\r\nb.png",2\n', ["x\ry.png", "a\r\nb.png"])
    assert labels == {"x\ry.png": 1, "a\r\nb.png": 2}


def test_an_empty_csv_labels_nothing(tmp_path):
    image(tmp_path / "src" / "a.png")
    with pytest.raises(ValueError, match=r"^1 image\(s\) have no label: labels\.csv has no row for them"):
        labelled(tmp_path, "\n\n")


# When no row names a file: one message, where the paths would name files


def no_row_message(tmp_path: Path, rows, src_files, csv_folder=None, real=()) -> str:
    """The error for a CSV of `rows` (paths) none naming a file of SRC; `real` files are made
    (relative to tmp_path) so that a folder names them."""
    for name in real:
        image(tmp_path / name)
    csv_path = (csv_folder or tmp_path) / "labels.csv"
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    csv_path.write_text("".join(f"{r},1\n" for r in rows))
    with pytest.raises(ValueError) as err:
        read_label_csv(csv_path, tmp_path / "src", set(src_files), None)
    return str(err.value)


def test_one_row_naming_no_file_is_named(tmp_path):
    csv_path, src = tmp_path / "labels.csv", tmp_path / "src"
    assert no_row_message(tmp_path, ["gone.png"], ["a.png"]) == (
        f"{csv_path}: its one row's path gone.png does not exist in SRC ({src}); paths are read relative "
        f"to SRC (`cat/1.jpg` for {src}/cat/1.jpg). The first rows name:\n  gone.png"
    )


def test_paths_naming_files_of_the_csv_folder_are_said_to(tmp_path):
    csv_path, src = tmp_path / "labels.csv", tmp_path / "src"
    message = no_row_message(
        tmp_path, ["other/x.png", "other/y.png"], ["a.png"], real=["other/x.png", "other/y.png"]
    )
    assert message == (
        f"{csv_path}: none of its 2 paths names a file in SRC ({src}); paths are read relative to SRC "
        f"(`cat/1.jpg` for {src}/cat/1.jpg); they name files relative to the CSV's folder ({tmp_path}): "
        "write them relative to SRC. The first rows name:\n  other/x.png\n  other/y.png"
    )
    message = no_row_message(tmp_path, ["nowhere/x.png", "nowhere/y.png"], ["a.png"])
    assert "they name files" not in message and message.endswith(
        "The first rows name:\n  nowhere/x.png\n  nowhere/y.png"
    )


def test_a_prefix_of_two_folders_relative_to_src_parent_is_named(tmp_path):
    csv_path, src = tmp_path / "lists" / "labels.csv", tmp_path / "src"
    rows = ["src/sub/cat/1.png", "src/sub/dog/2.png"]
    files = ["sub/cat/1.png", "sub/dog/2.png", "cat/1.png", "dog/2.png"]
    message = no_row_message(tmp_path, rows, files[2:], csv_folder=tmp_path / "lists", real=rows)
    assert message == (
        f"{csv_path}: none of its 2 paths names a file in SRC ({src}); paths are read relative to SRC, "
        f"and all 2 start with `src/sub/`: they are relative to SRC's parent ({tmp_path}). Write them "
        "relative to SRC (without `src/sub/`), e.g. `cat/1.png`"
    )
    message = no_row_message(
        tmp_path, ["x/y/cat/1.png", "x/y/dog/2.png"], files[2:], csv_folder=tmp_path / "lists"
    )
    assert message.endswith(
        "and all 2 start with `x/y/`. Write them relative to SRC (without `x/y/`), e.g. `cat/1.png`"
    )


def test_paths_with_different_extra_folders_name_no_prefix(tmp_path):
    message = no_row_message(tmp_path, ["x/cat/1.png", "y/dog/2.png"], ["cat/1.png", "dog/2.png"])
    assert "start with" not in message and message.endswith(
        "The first rows name:\n  x/cat/1.png\n  y/dog/2.png"
    )


# find_labels on its own


def test_find_labels_by_default_reads_class_folders_and_refuses_missing_rows(tmp_path):
    src = tmp_path / "src"
    files = ["cat/a.png", "dog/b.png", "dog/x/c.png", "top.png"]
    by_path, dtype, class_names, hint = find_labels(src, None, files, [], ["cat", "dog"], None)
    assert by_path == {"cat/a.png": 0, "dog/b.png": 1, "dog/x/c.png": 1} and dtype == "int64"
    assert class_names == ["cat", "dog"] and hint == f"they lie directly in {src}, outside any class folder"
    (tmp_path / "labels.csv").write_text("cat/a.png,1\ngone.png,2\n")
    with pytest.raises(ValueError, match="gone.png does not exist"):
        find_labels(src, tmp_path / "labels.csv", files, [], [], None)


def test_no_labels_is_explained_word_for_word(tmp_path):
    src = tmp_path / "src"
    with pytest.raises(ValueError) as err:
        find_labels(src, None, ["a.png"], [], [], None)
    assert str(err.value) == (
        f"{src}: no labels. Either pass a CSV of `relative/path,label` rows (labels=... / --labels FILE.csv), "
        f"or put the images in one subfolder per class ({src}/CLASS_NAME/image.jpg; labels are class "
        "indices in sorted name order), or pack them without labels (no_labels=True / --no-labels: every "
        "label 0, NaN for float64)"
    )


def test_class_folders_that_read_as_one_name_are_all_listed(tmp_path):
    folders = ["A\u030a", "e\u0301", "\u00c5", "\u00e9"]
    with pytest.raises(ValueError) as err:
        find_labels(tmp_path, None, [f"{f}/1.png" for f in folders], [], folders, None)
    assert str(err.value) == (
        f"{tmp_path}: class folders that read as one name: "
        "'Å' (labels 0 as 'A\\u030a', 2 as '\\xc5': one text in different Unicode forms); "
        "'é' (labels 1 as 'e\\u0301', 3 as '\\xe9': one text in different Unicode forms); rename them apart"
    )


def test_a_missing_labels_csv_is_named_as_the_labels_csv(tmp_path, capsys):
    """It was a raw `[Errno 2] No such file or directory: 'labels.csv'`."""
    src = classes(tmp_path / "src")
    missing = tmp_path / "labels.csv"
    code, out, err = cli(capsys, src, tmp_path / "s.fl", "--labels", missing)
    assert code == 1 and err == f"fastload pack: error: labels CSV {missing}: No such file or directory\n"
