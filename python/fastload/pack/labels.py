"""Labels of `fastload.pack`: from a `path,label` CSV (numbers, or class names), from class
folders (`SRC/CLASS/...`), or the placeholder of `no_labels`; each bad CSV row reported with
its line, and unlabelled images refused unless skipped."""

from __future__ import annotations

import copy
import csv
import io
import math
import os
import posixpath
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from fastload.files import read_regular_file
from fastload.options import MAX_LABELS_CSV_BYTES
from fastload.pack.display import listed, printable
from fastload.pack.walk import has_image_extension
from fastload.store import shared_class_names

#: Labels of an int64 store.
INT64_RANGE = range(-(2**63), 2**63)
#: Reason recorded for images left out by `skip_unlabelled`: a choice, so not a bad file for `strict`.
UNLABELLED_SKIPPED = "no label (skipped by request)"
#: Reason recorded for CSV rows naming no file, left out by `skip_missing`: a choice too.
MISSING_SKIPPED = "in the labels CSV, but no such file (skipped by request)"
#: Reason of files left out by rule, never read: neither labelled nor named like an image (a
#: README beside the images of a labels CSV).
NOT_AN_IMAGE_FILE = "not an image file (no label, no image extension)"


def parse_label(text: str, dtype: str) -> Union[int, float]:
    """A label from its CSV text; ValueError says why it is not one."""
    text = text.strip()
    if not text:
        raise ValueError("empty label")
    out_of_int64 = (
        f"label {text!r} is out of int64 range (pass label_dtype='float64' / --label-dtype float64)"
    )
    if dtype == "int64":
        try:
            whole = int(text)
        except ValueError:
            pass
        else:
            if whole not in INT64_RANGE:
                raise ValueError(out_of_int64)
            return whole
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"label {text!r} is not a number") from None
    if math.isinf(value) and text.lstrip("+-").lower() not in ("inf", "infinity"):
        raise ValueError(f"label {text!r} is out of float64 range")
    if not math.isfinite(value):
        raise ValueError(f"label {text!r} is not a finite number")
    if dtype == "int64":
        if not value.is_integer():
            raise ValueError(f"label {text!r} is not a whole number (label_dtype int64)")
        if int(value) not in INT64_RANGE:
            raise ValueError(out_of_int64)
        return int(value)
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _is_integer_text(text: str) -> bool:
    try:
        int(text.strip())
        return True
    except ValueError:
        return False


def _name_in_csv(cell: str, src: Path) -> str:
    """The relative POSIX path a CSV path cell names, taken as written (spaces included)."""
    name = os.path.relpath(cell, src) if os.path.isabs(cell) else cell
    return posixpath.normpath(name.replace(os.sep, "/"))


def read_label_csv(
    csv_path: Path, src: Path, files: set, label_dtype: Optional[str], skip_missing: bool = False
) -> Tuple[Dict[str, Union[int, float]], str, List[str], Optional[List[str]]]:
    """Labels by relative path from a `path,label` CSV (header row optional, UTF-8 with or
    without BOM, LF or CRLF), the label dtype, the names of rows whose file does not
    exist when `skip_missing` (otherwise those rows are errors), and the class names when
    the labels are names rather than numbers (each name a class, in sorted order; None
    otherwise). Every bad row is reported with its line; when no row names a file, one
    message says so, and which leading folders the paths have too many.
    The first row is a header only when its label is not a number (nor a label of another
    row) and its path names no file under `src`; any other bad first row is reported like
    the rest."""
    try:
        text = read_regular_file(csv_path, MAX_LABELS_CSV_BYTES, "labels CSV").decode("utf-8-sig")
        shape = _CsvShape(_csv_rows(text))  # the first pass parses every row: CSV errors surface here
    except UnicodeDecodeError as exc:
        raise ValueError(f"{csv_path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except csv.Error as exc:
        raise ValueError(f"{csv_path}: not a CSV file: {exc}") from None
    header = shape.first is not None and shape.first_is_header(_name_in_csv(shape.first[0], src) in files)
    rows = shape.below if header else shape.all
    class_names = None
    if rows.count and rows.named == rows.count and label_dtype != "float64":
        class_names = sorted(rows.words)
        shared = shared_class_names(class_names)
        if shared:
            raise ValueError(f"{csv_path}: class names that read as one name: {'; '.join(shared)}")
        label_dtype = "int64"
    elif label_dtype is None:
        label_dtype = "int64" if rows.integers == rows.count else "float64"
    index = {name: i for i, name in enumerate(class_names or [])}
    labels: Dict[str, Union[int, float]] = {}
    problems: List[Tuple[int, str]] = []
    missing: List[Tuple[int, str]] = []
    repeated: List[Tuple[int, str]] = []
    for line, row in _csv_rows(text, skip_first=header):
        if len(row) != 2:
            problems.append((line, f"line {line}: expected 2 columns (path,label), found {len(row)}"))
            continue
        name = _name_in_csv(row[0], src)
        if name not in files:
            missing.append((line, name))
            continue
        try:
            value = index[row[1].strip()] if class_names else parse_label(row[1], label_dtype)
        except ValueError as exc:
            problems.append((line, f"line {line}: {printable(name)}: {exc}"))
            continue
        if name in labels:
            repeated.append((line, name))
        else:
            labels[name] = value
    if repeated:
        problems += _repeated_rows(text, header, src, repeated)
    if missing and len(missing) == rows.two_columns:
        # No row names a file: leaving the rows out (skip_missing) would leave nothing to pack.
        raise ValueError(_no_row_names_a_file(csv_path, src, files, [name for _, name in missing]))
    advice = ""
    if missing and not skip_missing:
        problems += [
            (line, f"line {line}: {printable(name)} does not exist in {src}") for line, name in missing
        ]
        advice = f" ({len(missing)} name no file: skip_missing=True / --skip-missing leaves those rows out)"
    if 0 < rows.named < rows.count:
        advice += "; labels are numbers, or all of them class names (made classes in sorted order)"
    if problems:
        lines = [text for _, text in sorted(problems)]
        raise ValueError(f"{csv_path}: {len(problems)} bad row(s){advice}:{listed(lines)}")
    return labels, label_dtype, [name for _, name in missing], class_names


def _csv_rows(text: str, skip_first: bool = False) -> Iterator[Tuple[int, List[str]]]:
    """The CSV's rows that hold something, each with the line it starts on, parsed afresh on
    every call: a pack of a million files keeps the CSV's text, not a list of its rows (about
    300 bytes a row as Python objects)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    rows = ((reader.line_num, row) for row in reader if any(cell.strip() for cell in row))
    if skip_first:
        next(rows, None)
    return rows


class _RowCounts:
    """What the label column of some rows holds, counted: rows, rows of two columns, labels
    that are integers, labels that are names (not numbers, not empty), and the distinct labels
    that are not numbers."""

    def __init__(self) -> None:
        self.count = self.two_columns = self.integers = self.named = 0
        self.words: set = set()

    def plus(self, row: List[str]) -> _RowCounts:
        """These counts with one more row, leaving these as they are."""
        counts = copy.copy(self)
        counts.words = set(self.words)
        counts.add(row)
        return counts

    def add(self, row: List[str]) -> None:
        self.count += 1
        if len(row) != 2:
            return
        self.two_columns += 1
        label = row[1]
        if _is_integer_text(label):
            self.integers += 1
        if not _is_number(label):
            self.words.add(label.strip())  # an empty one too: a header's label is checked against it
            self.named += bool(label.strip())


class _CsvShape:
    """One pass over the rows: the counts of the rows below the first, and the first row
    itself, which decide whether that row is a header and what the labels are; the counts of
    every row are those plus the first (each row's label is looked at once)."""

    def __init__(self, rows: Iterator[Tuple[int, List[str]]]) -> None:
        self.first: Optional[List[str]] = None
        self.below = _RowCounts()
        for _, row in rows:
            if self.first is None:
                self.first = row
            else:
                self.below.add(row)
        self.all = self.below if self.first is None else self.below.plus(self.first)

    def first_is_header(self, names_a_file: bool) -> bool:
        """The first row is a header only when its label is not a number, nor a class name
        of another row, and its path names no file."""
        if self.first is None or len(self.first) != 2:
            return False
        label = self.first[1]
        return not _is_number(label) and not names_a_file and label.strip() not in self.below.words


def _repeated_rows(
    text: str, header: bool, src: Path, repeated: List[Tuple[int, str]]
) -> List[Tuple[int, str]]:
    """The problem of each row whose file already has a label, naming the line of the first
    label: found by one more pass, only when a file is labelled twice."""
    names = {name for _, name in repeated}
    first_line: Dict[str, int] = {}
    for line, row in _csv_rows(text, skip_first=header):
        if len(row) == 2:
            name = _name_in_csv(row[0], src)
            if name in names:
                first_line.setdefault(name, line)
    return [
        (line, f"line {line}: {printable(name)} already has a label on line {first_line[name]}")
        for line, name in repeated
    ]


def _extra_prefix(names: Sequence[str], files: set) -> Optional[str]:
    """The leading folders every one of `names` has beyond a file of SRC (`classes/` when
    `classes/cat/1.jpg` is `cat/1.jpg` in SRC), or None when they share none."""
    prefixes = set()
    for name in names:
        parts = name.split("/")
        found = next((k for k in range(1, len(parts)) if "/".join(parts[k:]) in files), None)
        if found is None:
            return None
        prefixes.add("/".join(parts[:found]) + "/")
        if len(prefixes) > 1:
            return None
    return prefixes.pop() if prefixes else None


def _no_row_names_a_file(csv_path: Path, src: Path, files: set, names: List[str]) -> str:
    """Why not one row of the labels CSV names a file of SRC, said once: the folders the paths
    have too many, and where they would name files (the CSV's folder, SRC's parent)."""
    head = (
        f"{csv_path}: its one row's path {printable(names[0])} does not exist in SRC ({src})"
        if len(names) == 1
        else f"{csv_path}: none of its {len(names)} paths names a file in SRC ({src})"
    ) + "; paths are read relative to SRC"
    bases = [("the CSV's folder", csv_path.parent), ("SRC's parent", src.parent)]
    where = next(
        (f"{what} ({folder})" for what, folder in bases if all((folder / n).is_file() for n in names)), None
    )
    prefix = _extra_prefix(names, files)
    if prefix is not None:
        shown = printable(prefix)
        there = f": they are relative to {where}" if where else ""
        return (
            f"{head}, and all {len(names)} start with `{shown}`{there}. Write them relative to SRC "
            f"(without `{shown}`), e.g. `{printable(names[0][len(prefix) :])}`"
        )
    there = f"; they name files relative to {where}: write them relative to SRC" if where else ""
    return f"{head} (`cat/1.jpg` for {src}/cat/1.jpg){there}. The first rows name:" + listed(
        [printable(n) for n in names], limit=3
    )


def find_labels(
    src: Path,
    csv_path: Optional[Path],
    files: List[str],
    skipped: List[Tuple[str, str]],
    top_folders: List[str],
    label_dtype: Optional[str],
    skip_missing: bool = False,
    no_labels: bool = False,
) -> Tuple[Dict[str, Union[int, float]], str, Optional[List[str]], str]:
    """Labels by relative path (from the CSV, else from the class folders `top_folders`;
    with `no_labels`, the placeholder 0 or NaN for every image file), the label dtype, the
    class names (None for a CSV of numbers), and where a missing label should have come from. CSV rows
    for files that do not exist are added to `skipped` when `skip_missing`."""
    if no_labels:
        label_dtype = label_dtype or "int64"
        placeholder = 0 if label_dtype == "int64" else math.nan
        images = [f for f in files if has_image_extension(f)]
        return {f: placeholder for f in images}, label_dtype, None, ""
    if csv_path is not None:
        known = set(files).union(name for name, _ in skipped)
        by_path, label_dtype, missing, class_names = read_label_csv(
            csv_path, src, known, label_dtype, skip_missing
        )
        skipped.extend((name, MISSING_SKIPPED) for name in missing)
        return by_path, label_dtype, class_names, f"{csv_path.name} has no row for them"
    class_names = top_folders
    if not class_names:
        raise ValueError(
            f"{src}: no labels. Either pass a CSV of `relative/path,label` rows "
            "(labels=... / --labels FILE.csv), or put the images in one subfolder per class "
            f"({src}/CLASS_NAME/image.jpg; labels are class indices in sorted name order), or pack "
            "them without labels (no_labels=True / --no-labels: every label 0, NaN for float64)"
        )
    shared = shared_class_names(class_names)  # folders differ as bytes, but may read the same
    if shared:
        raise ValueError(
            f"{src}: class folders that read as one name: {'; '.join(shared)}; rename them apart"
        )
    index = {name: i for i, name in enumerate(class_names)}
    by_path = {f: index[f.split("/", 1)[0]] for f in files if "/" in f}
    return (
        by_path,
        label_dtype or "int64",
        class_names,
        f"they lie directly in {src}, outside any class folder",
    )


def split_unlabelled(
    files: List[str], by_path: dict, skip_unlabelled: bool, hint: str
) -> Tuple[List[str], List[Tuple[str, str]]]:
    """The labelled files to decode, and the unlabelled ones with why they are left out.
    An unlabelled file with an image extension is an error unless `skip_unlabelled`."""
    todo, left_out, unlabelled = [], [], []
    for f in files:
        if f in by_path:
            todo.append(f)
        elif has_image_extension(f):
            unlabelled.append(f)
            left_out.append((f, UNLABELLED_SKIPPED))
        else:
            left_out.append((f, NOT_AN_IMAGE_FILE))
    if unlabelled and not skip_unlabelled:
        raise ValueError(
            f"{len(unlabelled)} image(s) have no label: {hint}. Label them, or pass "
            f"skip_unlabelled=True (--skip-unlabelled) to leave them out:{listed([printable(f) for f in unlabelled])}"
        )
    return todo, left_out
