"""The pipeline of `fastload.pack`: the arguments checked, the folder listed and labelled,
then chunks of files decoded by Rust threads into one of two reused record buffers while a
writer thread appends the previous chunk to the store; and the report of what it did."""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from fastload import _core
from fastload._checks import byte_size, fspath, is_int
from fastload.errors import BadFilesError
from fastload.files import output_target
from fastload.inspect import NO_JPEG_SIMD, raw_ratio
from fastload.options import RESIZE_MODES
from fastload.pack.display import display, listed, named, printable, warned
from fastload.pack.labels import (
    MISSING_SKIPPED,
    NOT_AN_IMAGE_FILE,
    UNLABELLED_SKIPPED,
    find_labels,
    split_unlabelled,
)
from fastload.pack.walk import HIDDEN_FILE, HIDDEN_FOLDER, IMAGE_EXTENSIONS, has_image_extension, walk
from fastload.progress import Progress
from fastload.store import DEFAULT_QUALITY, LABEL_DTYPES, NO_LABELS, PathLike, StoreWriter, check_encoding

#: Records decoded per chunk and thread: enough that threads rarely wait for the chunk's last file.
FILES_PER_THREAD = 16
#: Most records, and most bytes, of one chunk: memory stays bounded on machines with many cores.
MAX_CHUNK_RECORDS = 256
MAX_CHUNK_BYTES = 256 << 20
#: What `strict` does not count as a bad file: choices and rules, not images that cannot be trusted.
CHOSEN_SKIPS = (UNLABELLED_SKIPPED, MISSING_SKIPPED, HIDDEN_FILE, HIDDEN_FOLDER, NOT_AN_IMAGE_FILE)


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
    #: What encoding did (`StoreWriter.encode_stats` and the quality), None for a raw store
    encoding: Optional[dict] = None

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
            f"{printable(str(self.path))} "
            f"({_megabytes(self.store_bytes)}) in {self.seconds:.1f} s: "
            f"{self.files_per_second:,.0f} files/s, {self.mb_per_second:,.1f} MB/s read"
        ]
        if self.encoding is not None:
            e = self.encoding
            raw = self.records - e["encoded"]
            lines.append(
                f"encoded {e['encoded']:,} of {self.records:,} records as JPEG quality {e['quality']} "
                f"(PSNR against the raw records: mean {e['psnr_mean']:.1f} dB, worst {e['psnr_min']:.1f} dB)"
                + (f"; {raw:,} kept raw" if raw else "")
                + (f" ({e['raw_by_budget']:,} by the size budget)" if e["raw_by_budget"] else "")
                + f"; the store is {raw_ratio(self.records, math.prod(self.shape), self.store_bytes):.1f}x "
                "smaller than raw"
            )
        if self.skipped:
            lines.append(
                f"skipped {len(self.skipped):,} file(s) (all listed in the store's meta['skipped']):"
            )
            lines.append(listed(named(self.skipped), limit=50)[1:])
        if self.decode_warnings:
            lines.append(
                f"decoded with warnings: {len(self.decode_warnings):,} damaged image(s), packed as decoded "
                "(listed in the store's meta['decode_warnings']; --strict / strict=True refuses them):"
            )
            lines.append(listed(named([(n, "; ".join(w)) for n, w in self.decode_warnings]), limit=50)[1:])
        return "\n".join(lines)


def _megabytes(n: int) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


@dataclass
class _Decoded:
    """What decoding the chunks gave: the records' source names (as stored), the files that
    failed with why, the damaged images packed with libjpeg's warnings, and the bytes read."""

    sources: List[str] = field(default_factory=list)
    failed: List[Tuple[str, str]] = field(default_factory=list)
    #: (file, record, warnings)
    warned: List[Tuple[str, int, List[str]]] = field(default_factory=list)
    source_bytes: int = 0


def _store_file_name(dest: str) -> str:
    """``dest`` as a store's file name, checked before ``Path`` reads it: ``Path("")`` is the
    current folder and ``Path("newdir/")`` the file ``newdir``, which pack then created."""
    if not dest:
        raise ValueError("dest is an empty path; give the store's file name, e.g. images.fastload")
    if dest.endswith(os.sep):
        raise ValueError(
            f"{dest}: ends with {os.sep!r}, so it names a folder, and a store is a file; "
            f"give its file name, e.g. {dest}images.fastload"
        )
    return dest


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
    if len(pair) != 2 or not all(is_int(s) for s in pair):
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


def _check_options(
    size: Union[int, Sequence[int]],
    fill: Union[int, Sequence[int]],
    resize: str,
    label_dtype: Optional[str],
    workers: Optional[int],
    progress: Optional[Callable[[int, int], None]],
) -> Tuple[int, int, Tuple[int, int, int]]:
    """The record's height and width and the pad fill, after checking the options that need
    no file: each bad one is a ValueError (TypeError for `progress`) naming it."""
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
    return height, width, rgb_fill


def _list_source(
    src: Path, csv_path: Optional[Path], follow_symlinks: bool
) -> Tuple[List[str], List[Tuple[str, str]], List[str]]:
    """`walk` of `src`, leaving out the labels CSV when it lies inside; refuses a folder
    with no image file at all ("no images found", listing what was skipped)."""
    exclude = None
    if csv_path is not None and Path(os.path.realpath(csv_path)).is_relative_to(os.path.realpath(src)):
        exclude = Path(os.path.relpath(os.path.realpath(csv_path), os.path.realpath(src))).as_posix()
    files, skipped, top_folders = walk(src, exclude, follow_symlinks)
    if not any(has_image_extension(f) for f in files):
        found = f"{len(files)} other file(s)" if files else "nothing"
        raise ValueError(
            f"{src}: no images found ({found}; images are files ending in {', '.join(sorted(IMAGE_EXTENSIONS))})"
            + (listed(named(skipped)) if skipped else "")
        )
    return files, skipped, top_folders


def _check_names_fit(src: Path, files: List[str], skipped: List[Tuple[str, str]]) -> None:
    """Every file name goes into the metadata: finds out now, not after hours of decoding, if
    they fit in the store's metadata limit."""
    names_bytes = sum(len(display(f).encode()) + 4 for f in files) + sum(len(n) + 64 for n, _ in skipped)
    if names_bytes > _core.MAX_META_LEN:
        raise ValueError(
            f"{src}: the names of {len(files):,} files take about {names_bytes / 2**20:,.0f} MiB, over the store's "
            f"{_core.MAX_META_LEN >> 20} MiB metadata limit; pack the folder as several stores"
        )


def _pack_meta(
    src: Path,
    csv_path: Optional[Path],
    shape: Tuple[int, int],
    resize: str,
    rgb_fill: Tuple[int, int, int],
    label_dtype: str,
    class_names: Optional[List[str]],
    no_labels: bool,
) -> dict:
    """The store's metadata known before decoding: how it was packed, and the class names."""
    return {
        "pack": {
            "size": list(shape),
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


def _decode_into_store(
    decoder,
    writer: StoreWriter,
    src: Path,
    todo: List[str],
    by_path: Dict[str, Union[int, float]],
    shape: Tuple[int, int],
    bar: Progress,
    progress: Optional[Callable[[int, int], None]],
) -> _Decoded:
    """Decodes `todo` chunk by chunk into `shape` (height, width) records and appends those
    that decoded, with their labels, to `writer`. Two record buffers: the writer thread appends one chunk while the next is
    decoded into the other, so no core idles while a chunk is written (both calls release
    the GIL)."""
    height, width = shape
    chunk = max(
        1,
        min(
            FILES_PER_THREAD * decoder.num_threads, MAX_CHUNK_RECORDS, MAX_CHUNK_BYTES // (height * width * 3)
        ),
    )
    buffers = [np.empty((chunk, height, width, 3), dtype=np.uint8) for _ in range(2)]
    decoded = _Decoded()
    with ThreadPoolExecutor(1, thread_name_prefix="fastload-pack-writer") as io:
        writing = None
        for k, start in enumerate(range(0, len(todo), chunk)):
            names, buffer = todo[start : start + chunk], buffers[k % 2]
            outcomes = decoder.decode_into([str(src / n) for n in names], buffer)
            ok = [i for i, (_, reason, _) in enumerate(outcomes) if reason is None]
            decoded.failed += [
                (names[i], reason) for i, (_, reason, _) in enumerate(outcomes) if reason is not None
            ]
            decoded.warned += [
                (names[i], len(decoded.sources) + j, outcomes[i][2])
                for j, i in enumerate(ok)
                if outcomes[i][2]
            ]
            decoded.source_bytes += sum(read for read, _, _ in outcomes)
            images = buffer[: len(names)] if len(ok) == len(names) else buffer[ok]
            if writing is not None:
                writing.result()  # the previous chunk is written: its buffer is free
            writing = io.submit(writer.extend, images, [by_path[names[i]] for i in ok])
            decoded.sources += [display(names[i]) for i in ok]
            done = start + len(names)
            bar.update(
                done, f"{decoded.source_bytes / 1e6 / bar.elapsed():,.1f} MB/s read", force=done == len(todo)
            )
            if progress is not None:
                progress(done, len(todo))
        if writing is not None:
            writing.result()
    return decoded


def _record_problems(
    writer: StoreWriter,
    src: Path,
    todo: List[str],
    skipped: List[Tuple[str, str]],
    decoded: _Decoded,
    strict: bool,
) -> List[Tuple[str, str]]:
    """Every skipped file, sorted, after refusing the pack (BadFilesError) when `strict` and a
    file could not be packed or decoded with warnings, or (ValueError) when no image could be
    packed; writes the sources, the skipped files and the decode warnings into the metadata."""
    skipped = sorted(skipped + decoded.failed)
    damaged = [(name, warnings) for name, _, warnings in decoded.warned]
    bad = sorted([s for s in skipped if s[1] not in CHOSEN_SKIPS] + warned(damaged))
    if strict and bad:
        raise BadFilesError(
            f"{len(bad)} file(s) in {src} cannot be packed (strict): nothing was written:"
            + listed(named(bad), limit=None),
            bad,
        )
    if not decoded.sources:
        raise ValueError(
            f"{src}: none of the {len(todo)} image(s) could be packed:" + listed(named(decoded.failed))
        )
    writer.meta["sources"] = decoded.sources
    writer.meta["skipped"] = [{"file": display(n), "reason": r} for n, r in skipped]
    writer.meta["decode_warnings"] = [
        {"file": display(n), "record": i, "warnings": w} for n, i, w in decoded.warned
    ]
    return skipped


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
    encoding: Optional[str] = None,
    quality: int = DEFAULT_QUALITY,
    max_size: Union[int, str, None] = None,
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

    `encoding="jpeg"` stores each record as a baseline JPEG of `quality` (1-100; default 90),
    decoded on every read by Rust threads: about a tenth of the raw size at quality 90. A
    record whose JPEG is not shorter stays raw. `max_size` (bytes, or a text such as "150GB")
    bounds the store instead, and implies JPEG: as many records stay raw as fit, drawn with a
    fixed seed so they spread evenly over classes and labels, and the rest are encoded; a
    folder that cannot fit even encoded fails, writing nothing. The report gives the mean and
    worst PSNR of the encoded records against the raw ones (also in `meta["encoding"]`).
    Raw (the default) keeps a store of format 1 that `store.images` views whole.

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
    dest = Path(_store_file_name(fspath(dest, "dest")))
    if labels is not None and not fspath(labels, "labels"):
        raise ValueError("labels is an empty path; give the labels CSV file")
    csv_path = None if labels is None else Path(labels)
    height, width, rgb_fill = _check_options(size, fill, resize, label_dtype, workers, progress)
    if not _core.pack_jpeg_simd():
        warnings.warn(NO_JPEG_SIMD, stacklevel=2)
    if no_labels and csv_path is not None:
        raise ValueError(
            f"no_labels / --no-labels packs without labels: pass it or labels ({csv_path}), not both"
        )
    encoding, max_bytes = _check_encoding(encoding, quality, max_size)
    decoder = _core.PackDecoder(height, width, resize, rgb_fill, workers)
    _check_paths(src, dest, csv_path, overwrite)

    files, skipped, top_folders = _list_source(src, csv_path, follow_symlinks)
    by_path, label_dtype, class_names, unlabelled_hint = find_labels(
        src, csv_path, files, skipped, top_folders, label_dtype, skip_missing, no_labels
    )
    todo, left_out = split_unlabelled(files, by_path, skip_unlabelled, unlabelled_hint)
    skipped += left_out
    if not todo:
        raise ValueError(f"{src}: no images to pack" + (listed(named(skipped)) if skipped else ""))
    _check_names_fit(src, files, skipped)

    meta = _pack_meta(src, csv_path, (height, width), resize, rgb_fill, label_dtype, class_names, no_labels)
    if max_bytes is not None:
        # The sources list is most of the metadata: counted in the budget from the start.
        meta["sources"] = [display(name) for name in todo]
    bar = Progress(not quiet and sys.stderr.isatty(), len(todo), desc="packing", unit=" files")
    try:
        with StoreWriter(
            dest,
            (height, width, 3),
            label_dtype,
            meta=meta,
            overwrite=overwrite,
            encoding=encoding,
            quality=quality,
            max_size=max_bytes,
            expected_count=len(todo),
        ) as writer:
            decoded = _decode_into_store(decoder, writer, src, todo, by_path, (height, width), bar, progress)
            skipped = _record_problems(writer, src, todo, skipped, decoded, strict)
            stats = writer.encode_stats()
    finally:
        bar.close()
    return PackReport(
        path=dest,
        records=len(decoded.sources),
        shape=(height, width, 3),
        skipped=[(display(n), r) for n, r in skipped],
        decode_warnings=[(display(n), w) for n, _, w in decoded.warned],
        seconds=time.perf_counter() - started,
        files_read=len(todo),
        source_bytes=decoded.source_bytes,
        store_bytes=dest.stat().st_size,
        encoding=None if stats is None else {"quality": quality, **stats},
    )


def _check_encoding(
    encoding: Optional[str], quality: int, max_size: Union[int, str, None]
) -> Tuple[str, Optional[int]]:
    """(the encoding, the size budget in bytes or None): `max_size` implies JPEG."""
    max_bytes = None if max_size is None else byte_size(max_size, "max_size")
    if encoding is None:
        encoding = "raw" if max_bytes is None else "jpeg"
    check_encoding(encoding, quality, max_bytes)
    return encoding, max_bytes
