"""Packing a folder of images into a store: `fastload.pack(src, dest)` and `fastload pack SRC DEST`.

Python lists the files and reads the labels; Rust threads decode and resize each chunk of
files straight into one of two reused record buffers, without the GIL, while a writer
thread appends the previous chunk to the store from the other.
Decoding choices (format sniffed from the bytes, EXIF orientation applied, alpha on
white, Lanczos3 antialiased resampling like Pillow's `Image.LANCZOS`, a 100-megapixel /
1 GiB limit against decompression bombs, one decode-memory budget shared by all threads,
named pipes and devices refused without blocking, libjpeg's warnings about damaged data kept)
are documented in `rust/pack.rs`.
"""

from __future__ import annotations

import csv
import io
import math
import os
import posixpath
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from fastload import _core
from fastload._checks import fspath
from fastload.errors import BadFilesError
from fastload.files import output_target, read_regular_file
from fastload.options import MAX_LABELS_CSV_BYTES, RESIZE_MODES
from fastload.progress import Progress
from fastload.store import LABEL_DTYPES, NO_LABELS, PathLike, StoreWriter, shared_class_names

#: Extensions taken for images when a file has no label (other unlabelled files are not images).
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".bmp", ".dib", ".tif", ".tiff", ".gif"}
)
#: Records decoded per chunk and thread: enough that threads rarely wait for the chunk's last file.
FILES_PER_THREAD = 16
#: Most records, and most bytes, of one chunk: memory stays bounded on machines with many cores.
MAX_CHUNK_RECORDS = 256
MAX_CHUNK_BYTES = 256 << 20
#: Problems listed in one error message before the rest are only counted.
MAX_LISTED = 20
#: Labels of an int64 store.
INT64_RANGE = range(-(2**63), 2**63)
#: Why a symbolic link out of SRC is not followed by default.
LINK_OUTSIDE_SRC = "symbolic link to outside SRC (pass follow_symlinks=True / --follow-symlinks to follow)"
#: Characters never printed raw: C0 and C1 controls, DEL, line and paragraph separators,
#: and the bidirectional overrides that reorder what a terminal shows.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@dataclass
class PackReport:
    """What `pack` did: records written, files skipped with their reasons, and the speed."""

    path: Path
    records: int
    shape: Tuple[int, int, int]
    skipped: List[Tuple[str, str]] = field(default_factory=list)
    #: (file, libjpeg's warnings) of the images packed although damaged (`strict` refuses them)
    decode_warnings: List[Tuple[str, List[str]]] = field(default_factory=list)
    seconds: float = 0.0
    files_read: int = 0
    source_bytes: int = 0
    store_bytes: int = 0

    @property
    def files_per_second(self) -> float:
        """Files read and decoded (packed or found bad) per second."""
        return self.files_read / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_second(self) -> float:
        """Megabytes of source files read per second."""
        return self.source_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        h, w, c = self.shape
        lines = [
            f"packed {self.records:,} image{'' if self.records == 1 else 's'} ({h}x{w}x{c}) into "
            f"{_printable(str(self.path))} "
            f"({_megabytes(self.store_bytes)}) in {self.seconds:.1f} s: "
            f"{self.files_per_second:,.0f} files/s, {self.mb_per_second:,.1f} MB/s read"
        ]
        if self.skipped:
            lines.append(
                f"skipped {len(self.skipped):,} file(s) (all listed in the store's meta['skipped']):"
            )
            lines.append(_listed(_named(self.skipped), limit=50)[1:])
        if self.decode_warnings:
            lines.append(
                f"decoded with warnings: {len(self.decode_warnings):,} damaged image(s), packed as decoded "
                "(listed in the store's meta['decode_warnings']; --strict / strict=True refuses them):"
            )
            lines.append(_listed(_named([(n, "; ".join(w)) for n, w in self.decode_warnings]), limit=50)[1:])
        return "\n".join(lines)


#: Reason recorded for images left out by `skip_unlabelled`: a choice, so not a bad file for `strict`.
UNLABELLED_SKIPPED = "no label (skipped by request)"
#: Reason recorded for CSV rows naming no file, left out by `skip_missing`: a choice too.
MISSING_SKIPPED = "in the labels CSV, but no such file (skipped by request)"
#: Reasons of files left out by rule, never read: hidden ones (`.DS_Store`), and files that are
#: neither labelled nor named like an image (a README beside the images of a labels CSV).
HIDDEN_FILE, HIDDEN_FOLDER = "hidden file", "hidden folder"
NOT_AN_IMAGE_FILE = "not an image file (no label, no image extension)"
#: What `strict` does not count as a bad file: choices and rules, not images that cannot be trusted.
CHOSEN_SKIPS = (UNLABELLED_SKIPPED, MISSING_SKIPPED, HIDDEN_FILE, HIDDEN_FOLDER, NOT_AN_IMAGE_FILE)


def _megabytes(n: int) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def _display(name: str) -> str:
    """A file name that JSON accepts (undecodable bytes become U+FFFD), as stored in the metadata."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _printable(name: str) -> str:
    """A file name safe to print to a terminal: `_display`, with control characters
    escaped as `repr` does (\\x1b, \\r, \\n), so a name cannot move the cursor or recolour."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), _display(name))


def _named(problems: Sequence[Tuple[str, str]]) -> List[str]:
    """`file: reason` lines, the names made printable."""
    return [f"{_printable(name)}: {reason}" for name, reason in problems]


def _warned(decode_warnings: Sequence[Tuple[str, List[str]]]) -> List[Tuple[str, str]]:
    """(file, "decoded with warnings: ...") of each image libjpeg warned about."""
    return [(name, "decoded with warnings: " + "; ".join(warnings)) for name, warnings in decode_warnings]


def _listed(problems: Sequence[str], limit: Optional[int] = MAX_LISTED) -> str:
    """One problem a line; past `limit` (None: no limit) the rest are only counted."""
    limit = len(problems) if limit is None else limit
    shown = "\n  ".join(problems[:limit])
    more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
    return f"\n  {shown}{more}"


def _link_refusal(link: str, real_src: Path, follow_symlinks: bool) -> Optional[str]:
    """Why the symbolic link `link` is not followed, or None. A link into SRC is followed;
    one to a folder containing SRC (`/`, a parent) never, as it would walk SRC's
    surroundings; any other link out of SRC only with `follow_symlinks`. A broken link
    gets its own reason from the walk."""
    target = Path(os.path.realpath(link))
    if target.is_relative_to(real_src) or not target.exists():
        return None
    if real_src.is_relative_to(target):
        return "symbolic link to a folder that contains SRC (a loop; never followed)"
    return None if follow_symlinks else LINK_OUTSIDE_SRC


def _walk(
    src: Path, exclude: Optional[str], follow_symlinks: bool = False
) -> Tuple[List[str], List[Tuple[str, str]], List[str]]:
    """Every regular file under `src` as a relative POSIX path (sorted), the entries that
    cannot be images with the reason, and the top-level folders (candidate classes)."""
    real_src = Path(os.path.realpath(src))
    files: List[str] = []
    skipped: List[Tuple[str, str]] = []
    top_folders: List[str] = []
    visited = {(src.stat().st_dev, src.stat().st_ino)}
    pending = [(str(src), "")]
    while pending:
        folder, prefix = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            if not prefix:
                raise
            skipped.append((prefix[:-1], f"cannot list this folder: {exc.strerror}"))
            continue
        for entry in entries:
            rel = prefix + entry.name
            try:
                is_dir = entry.is_dir()
                is_file = not is_dir and entry.is_file()
            except OSError as exc:
                skipped.append((rel, f"not a regular file: {exc.strerror}"))
                continue
            refusal = entry.is_symlink() and _link_refusal(entry.path, real_src, follow_symlinks)
            if entry.name.startswith("."):
                skipped.append((rel, HIDDEN_FOLDER if is_dir else HIDDEN_FILE))
            elif refusal:
                skipped.append((rel, refusal))
            elif is_dir:
                st = entry.stat()
                if os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS:
                    skipped.append((rel, "a folder, not an image file"))
                elif (st.st_dev, st.st_ino) in visited:
                    skipped.append((rel, "a folder already visited (symbolic link loop)"))
                else:
                    visited.add((st.st_dev, st.st_ino))
                    pending.append((entry.path, rel + "/"))
                    if not prefix:
                        top_folders.append(entry.name)
            elif is_file:
                if rel != exclude:
                    files.append(rel)
            else:
                broken = entry.is_symlink() and not os.path.exists(entry.path)
                skipped.append((rel, "not a regular file" + (" (broken symbolic link)" if broken else "")))
    return sorted(files), sorted(skipped), sorted(top_folders)


def _parse_label(text: str, dtype: str) -> Union[int, float]:
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


def _read_label_csv(
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
        reader = csv.reader(io.StringIO(text, newline=""))
        rows = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    except UnicodeDecodeError as exc:
        raise ValueError(f"{csv_path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except csv.Error as exc:
        raise ValueError(f"{csv_path}: not a CSV file: {exc}") from None
    if rows and len(rows[0][1]) == 2:
        path, label = rows[0][1]
        names_below = {r[1].strip() for _, r in rows[1:] if len(r) == 2}  # a class name is data
        if (
            not _is_number(label)
            and _name_in_csv(path, src) not in files
            and label.strip() not in names_below
        ):
            rows = rows[1:]  # a header row
    named = [len(r) == 2 and bool(r[1].strip()) and not _is_number(r[1]) for _, r in rows]
    class_names = None
    if rows and all(named) and label_dtype != "float64":
        class_names = sorted({r[1].strip() for _, r in rows})
        shared = shared_class_names(class_names)
        if shared:
            raise ValueError(f"{csv_path}: class names that read as one name: {'; '.join(shared)}")
        label_dtype = "int64"
    elif label_dtype is None:
        label_dtype = "int64" if all(len(r) == 2 and _is_integer_text(r[1]) for _, r in rows) else "float64"
    index = {name: i for i, name in enumerate(class_names or [])}
    labels: Dict[str, Union[int, float]] = {}
    first_line: Dict[str, int] = {}
    problems: List[Tuple[int, str]] = []
    missing: List[Tuple[int, str]] = []
    for line, row in rows:
        if len(row) != 2:
            problems.append((line, f"line {line}: expected 2 columns (path,label), found {len(row)}"))
            continue
        name = _name_in_csv(row[0], src)
        shown = _printable(name)
        if name not in files:
            missing.append((line, name))
            continue
        try:
            value = index[row[1].strip()] if class_names else _parse_label(row[1], label_dtype)
        except ValueError as exc:
            problems.append((line, f"line {line}: {shown}: {exc}"))
            continue
        if name in first_line:
            problems.append((line, f"line {line}: {shown} already has a label on line {first_line[name]}"))
        else:
            first_line[name] = line
            labels[name] = value
    if missing and len(missing) == sum(len(r) == 2 for _, r in rows):
        # No row names a file: leaving the rows out (skip_missing) would leave nothing to pack.
        raise ValueError(_no_row_names_a_file(csv_path, src, files, [name for _, name in missing]))
    advice = ""
    if missing and not skip_missing:
        problems += [
            (line, f"line {line}: {_printable(name)} does not exist in {src}") for line, name in missing
        ]
        advice = f" ({len(missing)} name no file: skip_missing=True / --skip-missing leaves those rows out)"
    if any(named) and not all(named):
        advice += "; labels are numbers, or all of them class names (made classes in sorted order)"
    if problems:
        listed = [text for _, text in sorted(problems)]
        raise ValueError(f"{csv_path}: {len(problems)} bad row(s){advice}:{_listed(listed)}")
    return labels, label_dtype, [name for _, name in missing], class_names


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
        f"{csv_path}: its one row's path {_printable(names[0])} does not exist in SRC ({src})"
        if len(names) == 1
        else f"{csv_path}: none of its {len(names)} paths names a file in SRC ({src})"
    ) + "; paths are read relative to SRC"
    bases = [("the CSV's folder", csv_path.parent), ("SRC's parent", src.parent)]
    where = next(
        (f"{what} ({folder})" for what, folder in bases if all((folder / n).is_file() for n in names)), None
    )
    prefix = _extra_prefix(names, files)
    if prefix is not None:
        shown = _printable(prefix)
        there = f": they are relative to {where}" if where else ""
        return (
            f"{head}, and all {len(names)} start with `{shown}`{there}. Write them relative to SRC "
            f"(without `{shown}`), e.g. `{_printable(names[0][len(prefix) :])}`"
        )
    there = f"; they name files relative to {where}: write them relative to SRC" if where else ""
    return f"{head} (`cat/1.jpg` for {src}/cat/1.jpg){there}. The first rows name:" + _listed(
        [_printable(n) for n in names], limit=3
    )


def _find_labels(
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
        images = [f for f in files if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS]
        return {f: placeholder for f in images}, label_dtype, None, ""
    if csv_path is not None:
        listed = set(files).union(name for name, _ in skipped)
        by_path, label_dtype, missing, class_names = _read_label_csv(
            csv_path, src, listed, label_dtype, skip_missing
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


def _split_unlabelled(
    files: List[str], by_path: dict, skip_unlabelled: bool, hint: str
) -> Tuple[List[str], List[Tuple[str, str]]]:
    """The labelled files to decode, and the unlabelled ones with why they are left out.
    An unlabelled file with an image extension is an error unless `skip_unlabelled`."""
    todo, left_out, unlabelled = [], [], []
    for f in files:
        if f in by_path:
            todo.append(f)
        elif os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS:
            unlabelled.append(f)
            left_out.append((f, UNLABELLED_SKIPPED))
        else:
            left_out.append((f, NOT_AN_IMAGE_FILE))
    if unlabelled and not skip_unlabelled:
        raise ValueError(
            f"{len(unlabelled)} image(s) have no label: {hint}. Label them, or pass "
            f"skip_unlabelled=True (--skip-unlabelled) to leave them out:{_listed([_printable(f) for f in unlabelled])}"
        )
    return todo, left_out


def _check_paths(src: Path, dest: Path, labels: Optional[Path], overwrite: bool) -> None:
    """Refuses, before any work: a missing source, a store written inside the folder it packs
    or over its labels, a destination the output rule refuses (a directory, device or named
    pipe; the writer checks again when it starts and before it renames), and an existing store
    without `overwrite`."""
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such folder")
    if not src.is_dir():
        raise NotADirectoryError(f"{src}: not a folder (pack takes a folder of images)")
    real_src = Path(os.path.realpath(src))
    real_dest = Path(os.path.realpath(dest))
    if real_dest == real_src or real_src in real_dest.parents:
        raise ValueError(
            f"{dest}: the store would be written inside the source folder {src}; write it elsewhere"
        )
    if labels is not None and real_dest == Path(os.path.realpath(labels)):
        raise ValueError(f"{dest}: the store would replace the labels file")
    output_target(dest, "store")
    if not overwrite and os.path.lexists(dest):
        raise FileExistsError(f"{dest}: already exists (pass overwrite=True or --overwrite to replace it)")


def _as_size(size: Union[int, Sequence[int]]) -> Tuple[int, int]:
    pair = (
        (size, size)
        if isinstance(size, (int, np.integer))
        else tuple(np.atleast_1d(np.asarray(size, dtype=object)))
    )
    if len(pair) != 2 or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in pair):
        raise ValueError(f"size must be an int or (height, width), not {size!r}")
    if not all(0 < s < 2**16 for s in pair):
        raise ValueError(f"size must be between 1 and 65535 pixels, not {size!r}")
    height, width = int(pair[0]), int(pair[1])
    if height * width * 3 > MAX_CHUNK_BYTES:
        raise ValueError(
            f"size {height}x{width}: one record takes {height * width * 3 / 2**20:,.0f} MiB, over the "
            f"{MAX_CHUNK_BYTES >> 20} MiB one chunk of records may hold; pack at a smaller size"
        )
    return height, width


def _as_fill(fill: Union[int, Sequence[int]]) -> Tuple[int, int, int]:
    rgb = (fill,) * 3 if isinstance(fill, (int, np.integer)) else tuple(fill)
    if len(rgb) != 3 or not all(isinstance(v, (int, np.integer)) and 0 <= v <= 255 for v in rgb):
        raise ValueError(f"fill must be an int 0-255 or an (R, G, B) triple, not {fill!r}")
    return int(rgb[0]), int(rgb[1]), int(rgb[2])


def pack(
    src: PathLike,
    dest: PathLike,
    size: Union[int, Sequence[int]] = 256,
    *,
    resize: str = "crop",
    fill: Union[int, Sequence[int]] = 0,
    labels: Optional[PathLike] = None,
    label_dtype: Optional[str] = None,
    workers: Optional[int] = None,
    strict: bool = False,
    overwrite: bool = False,
    skip_unlabelled: bool = False,
    skip_missing: bool = False,
    no_labels: bool = False,
    follow_symlinks: bool = False,
    quiet: bool = False,
    progress: Optional[Callable[[int, int], None]] = None,
) -> PackReport:
    """Packs every image under the folder `src` into a new store at `dest`.

    Images become `size` (an int for a square, or (height, width)) RGB uint8 records,
    in sorted relative-path order, so packing the same folder twice gives identical
    image and label sections. `resize`: "squash" stretches, "crop" scales the short side
    and cuts the centre, "pad" scales the long side and fills the bars with `fill`.

    Labels come from `labels`, a CSV of `relative/path,label` rows, or else from class
    folders (`src/CLASS/...`: the label is the index of CLASS in sorted order, and the
    names go to `meta["class_names"]`). A CSV's labels are numbers, or all of them class
    names (`cat/1.jpg,cats`), which become classes as folders do: the index of the name in
    sorted order, the names in `meta["class_names"]`. `label_dtype` is "int64" or "float64"
    (default: int64 for classes and all-integer CSVs). An image without a label is an error
    unless `skip_unlabelled`. In the CSV (at most 128 MiB), paths are taken as written,
    spaces included; labels may have spaces around them and must fit their dtype (a
    label out of int64 or float64 range names its line). The first row is a header only
    when its label is not a number and its path names no file; any other bad row,
    the first included, is reported with its line. A row naming a file that does not
    exist is an error unless `skip_missing`, which lists it as skipped instead; when no
    row names a file, one message says so, naming the leading folders (`classes/`) the
    paths have beyond SRC's files and where they would name files. A folder
    with no image files at all is "no images found". With `no_labels` (for embedding,
    scoring or pre-training), every image file under `src` is packed, folders included,
    with the placeholder label 0 (NaN with label_dtype="float64"), and `meta["labels"]`
    is "none" (`Store.labelled` is False), which `fastload train` refuses.

    Files that cannot be packed (not images, corrupt, truncated, hidden, not regular
    files, ...) are skipped and listed with their reason in the report and in
    `meta["skipped"]`. JPEGs that decode with libjpeg warnings (damaged entropy-coded data:
    "corrupt JPEG data", "premature end", "bad Huffman code") are packed as decoded and
    listed with the warnings in the report and in `meta["decode_warnings"]`. With `strict`,
    any file that cannot be packed or decodes with warnings makes the pack fail
    (BadFilesError) naming them all; files left out by rule or by request (hidden files
    such as `.DS_Store`, unlabelled non-image files, `skip_unlabelled`, `skip_missing`)
    do not. Names are printed with control characters escaped. Symbolic links
    into `src` are followed; links out of it are skipped unless `follow_symlinks`, and a
    link to a folder that contains `src` (such as `/`) is never followed.

    `workers` sets the decoding threads (default: all cores; at most 4 per core); all of
    them share one decode-memory budget (2 GiB, `_core.PACK_DECODE_MEMORY_BUDGET`), and
    records are at most 256 MiB. A progress bar goes to stderr when it is a terminal and
    not `quiet`; `progress(done, total)` is called after each chunk. Ctrl-C stops a pack
    within about one file's decoding time. Nothing appears at `dest` unless the whole
    pack succeeds, and an existing `dest` is replaced only with `overwrite`.

    The command `fastload pack` exits 0 on success (skipped files are listed, not
    fatal), 1 on failure (bad files with --strict, unreadable source, no images, bad
    labels, DEST exists) and 2 on usage errors.
    """
    started = time.perf_counter()
    src = Path(fspath(src, "src"))
    dest = Path(fspath(dest, "dest"))
    if labels is not None and not fspath(labels, "labels"):
        raise ValueError("labels is an empty path; give the labels CSV file")
    csv_path = None if labels is None else Path(labels)
    height, width = _as_size(size)
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable (done, total), not {type(progress).__name__}")
    rgb_fill = _as_fill(fill)
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {', '.join(RESIZE_MODES)}, not {resize!r}")
    if label_dtype is not None and label_dtype not in LABEL_DTYPES:
        raise ValueError(f"label_dtype must be {' or '.join(map(repr, LABEL_DTYPES))}, not {label_dtype!r}")
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool)):
        raise ValueError(f"workers must be an int, not {workers!r}")
    if no_labels and csv_path is not None:
        raise ValueError(
            f"no_labels / --no-labels packs without labels: pass it or labels ({csv_path}), not both"
        )
    decoder = _core.PackDecoder(height, width, resize, rgb_fill, workers)
    _check_paths(src, dest, csv_path, overwrite)

    exclude = None
    if csv_path is not None and Path(os.path.realpath(csv_path)).is_relative_to(os.path.realpath(src)):
        exclude = Path(os.path.relpath(os.path.realpath(csv_path), os.path.realpath(src))).as_posix()
    files, skipped, top_folders = _walk(src, exclude, follow_symlinks)
    if not any(os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS for f in files):
        found = f"{len(files)} other file(s)" if files else "nothing"
        raise ValueError(
            f"{src}: no images found ({found}; images are files ending in {', '.join(sorted(IMAGE_EXTENSIONS))})"
            + (_listed(_named(skipped)) if skipped else "")
        )

    by_path, label_dtype, class_names, unlabelled_hint = _find_labels(
        src, csv_path, files, skipped, top_folders, label_dtype, skip_missing, no_labels
    )
    todo, left_out = _split_unlabelled(files, by_path, skip_unlabelled, unlabelled_hint)
    skipped += left_out
    if not todo:
        raise ValueError(f"{src}: no images to pack" + (_listed(_named(skipped)) if skipped else ""))
    # Every file name goes into the metadata: find out now, not after hours of decoding, if they fit.
    names_bytes = sum(len(_display(f).encode()) + 4 for f in files) + sum(len(n) + 64 for n, _ in skipped)
    if names_bytes > _core.MAX_META_LEN:
        raise ValueError(
            f"{src}: the names of {len(files):,} files take about {names_bytes / 2**20:,.0f} MiB, over the store's "
            f"{_core.MAX_META_LEN >> 20} MiB metadata limit; pack the folder as several stores"
        )

    chunk = max(
        1,
        min(
            FILES_PER_THREAD * decoder.num_threads, MAX_CHUNK_RECORDS, MAX_CHUNK_BYTES // (height * width * 3)
        ),
    )
    # Two record buffers: the writer thread appends one chunk while the next is decoded into
    # the other, so no core idles while a chunk is written (both calls release the GIL).
    buffers = [np.empty((chunk, height, width, 3), dtype=np.uint8) for _ in range(2)]
    meta = {
        "pack": {
            "size": [height, width],
            "resize": resize,
            "fill": list(rgb_fill),
            "filter": "lanczos3",
            "alpha_background": list(_core.PACK_ALPHA_BACKGROUND),
            "labels": NO_LABELS if no_labels else str(csv_path) if csv_path is not None else "class folders",
            "label_dtype": label_dtype,
            "source": str(src.resolve()),
        },
        **({"class_names": class_names} if class_names is not None else {}),
        **({"labels": NO_LABELS} if no_labels else {}),
    }
    sources: List[str] = []
    failed: List[Tuple[str, str]] = []
    warned: List[Tuple[str, int, List[str]]] = []  # (file, record, warnings)
    source_bytes = 0
    bar = Progress(not quiet and sys.stderr.isatty(), len(todo), desc="packing", unit=" files")
    try:
        with StoreWriter(dest, (height, width, 3), label_dtype, meta=meta, overwrite=overwrite) as writer:
            with ThreadPoolExecutor(1, thread_name_prefix="fastload-pack-writer") as io:
                writing = None
                for k, start in enumerate(range(0, len(todo), chunk)):
                    names, buffer = todo[start : start + chunk], buffers[k % 2]
                    outcomes = decoder.decode_into([str(src / n) for n in names], buffer)
                    ok = [i for i, (_, reason, _) in enumerate(outcomes) if reason is None]
                    failed += [
                        (names[i], reason) for i, (_, reason, _) in enumerate(outcomes) if reason is not None
                    ]
                    warned += [
                        (names[i], len(sources) + j, outcomes[i][2])
                        for j, i in enumerate(ok)
                        if outcomes[i][2]
                    ]
                    source_bytes += sum(read for read, _, _ in outcomes)
                    images = buffer[: len(names)] if len(ok) == len(names) else buffer[ok]
                    if writing is not None:
                        writing.result()  # the previous chunk is written: its buffer is free
                    writing = io.submit(writer.extend, images, [by_path[names[i]] for i in ok])
                    sources += [_display(names[i]) for i in ok]
                    done = start + len(names)
                    bar.update(
                        done, f"{source_bytes / 1e6 / bar.elapsed():,.1f} MB/s read", force=done == len(todo)
                    )
                    if progress is not None:
                        progress(done, len(todo))
                if writing is not None:
                    writing.result()
            skipped = sorted(skipped + failed)
            damaged = [(name, warnings) for name, _, warnings in warned]
            bad = sorted([s for s in skipped if s[1] not in CHOSEN_SKIPS] + _warned(damaged))
            if strict and bad:
                raise BadFilesError(
                    f"{len(bad)} file(s) in {src} cannot be packed (strict): nothing was written:"
                    + _listed(_named(bad), limit=None),
                    bad,
                )
            if not sources:
                raise ValueError(
                    f"{src}: none of the {len(todo)} image(s) could be packed:" + _listed(_named(failed))
                )
            writer.meta["sources"] = sources
            writer.meta["skipped"] = [{"file": _display(n), "reason": r} for n, r in skipped]
            writer.meta["decode_warnings"] = [
                {"file": _display(n), "record": i, "warnings": w} for n, i, w in warned
            ]
    finally:
        bar.close()
    return PackReport(
        path=dest,
        records=len(sources),
        shape=(height, width, 3),
        skipped=[(_display(n), r) for n, r in skipped],
        decode_warnings=[(_display(n), w) for n, _, w in warned],
        seconds=time.perf_counter() - started,
        files_read=len(todo),
        source_bytes=source_bytes,
        store_bytes=dest.stat().st_size,
    )


__all__ = ["pack", "PackReport", "BadFilesError", "RESIZE_MODES", "IMAGE_EXTENSIONS"]
