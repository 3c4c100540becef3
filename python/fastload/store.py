"""Reading and writing stores: `Store` maps a file and hands out zero-copy views;
`StoreWriter` writes one atomically. The format is specified in docs/FORMAT.md."""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import unicodedata
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from fastload import _core
from fastload._checks import PathLike, fspath, int_in_range, is_int
from fastload._core import StoreError, __version__

LABEL_DTYPES = ("float64", "int64")
#: `meta["labels"]` of a store packed without labels: every label is a placeholder (0, or NaN for float64).
NO_LABELS = "none"
INT64_MAX = np.iinfo(np.int64).max
# Damaged records `verify` lists by default: enough to act on, bounded whatever the damage.
VERIFY_LIMIT = 1000
#: How a store's records can be stored: raw uint8 pixels, or JPEG-encoded (`StoreWriter(encoding=)`).
ENCODINGS = ("raw", "jpeg")
#: JPEG quality when a writer encodes and none is given.
DEFAULT_QUALITY = 90
# Metadata bytes a writer that encodes keeps room for beyond the metadata it was given: the
# "encoding" figures added at commit.
ENCODING_META_BYTES = 512


class DamagedRecords(list):
    """The first damaged records (at most the limit asked for), in record order; `total`
    counts all of them, so a listing can say how many more there are."""

    def __init__(self, records, total: int):
        super().__init__(records)
        self.total = total


def _is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "numpy")


def _as_writable_array(buf: Any, name: str, dtype: np.dtype, shape: Tuple[int, ...]) -> np.ndarray:
    """Checks a caller's output buffer (NumPy array or CPU torch tensor) and returns a NumPy view of it."""
    if _is_tensor(buf):
        if buf.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor (pinned is fine), not on {buf.device}")
        if not buf.is_contiguous():
            raise ValueError(f"{name} must be C-contiguous")
        if buf.requires_grad:
            raise ValueError(f"{name} must not require grad")
        arr = buf.numpy()
    elif isinstance(buf, np.ndarray):
        arr = buf
    else:
        raise TypeError(f"{name} must be a NumPy array or a torch tensor, not {type(buf).__name__}")
    if arr.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, not {arr.dtype}")
    if tuple(arr.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, not {tuple(arr.shape)}")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if not arr.flags.writeable:
        raise ValueError(f"{name} must be writable")
    return arr


def as_indices(indices: Any) -> np.ndarray:
    """Converts a sequence of integers to a contiguous int64 array; rejects floats and booleans."""
    arr = np.asarray(indices)
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if arr.dtype == object and arr.ndim == 1 and all(is_int(i) for i in arr.tolist()):
        raise IndexError(f"index {max(arr.tolist(), key=abs)} is out of range (beyond 64 bits)")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"indices must be integers, not {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"indices must be one-dimensional, not of shape {arr.shape}")
    # Unsigned values past the int64 range would wrap to negative, i.e. count from the end.
    if arr.dtype.kind == "u" and arr.size and arr.max() > INT64_MAX:
        raise IndexError(f"index {arr.max()} is out of range (beyond int64)")
    return np.ascontiguousarray(arr, dtype=np.int64)


class Store:
    """A read-only, memory-mapped store.

    Every view it returns (`images`, `labels`, `store[i]`) points into the mapping
    without copying and keeps the mapping alive on its own, so views stay valid after
    `close()`. Views are read-only: writing to them raises instead of crashing.

    A store whose records are encoded (`compressed`, format 2) has no array of every image:
    `store[i]` and `gather` decode records (in Rust threads, into the batch), `images` is
    refused, and `stored(i)` hands out a record's bytes as stored.
    """

    def __init__(self, path: PathLike):
        self._core = _core.Store(fspath(path))
        self.path = Path(self._core.path)
        self.shape: Tuple[int, int, int] = tuple(self._core.shape)  # (H, W, C)
        self.label_dtype = np.dtype(self._core.label_dtype)
        self._len = self._core.count
        # (device, inode, length, modification time in ns) of the file as opened: equal for two
        # opens of one file, different once it was replaced or rewritten.
        self.identity: Tuple[int, int, int, int] = tuple(self._core.identity)
        #: False for a store of raw records at a fixed stride (format 1), True for one with a
        #: record table (format 2: records JPEG-encoded, or some raw under a size budget).
        self.compressed: bool = not self._core.fixed_stride
        raw, jpeg = self._core.encodings
        #: How many records are stored each way: {"raw": n, "jpeg": n}.
        self.encodings: Dict[str, int] = {"raw": raw, "jpeg": jpeg}
        self._meta: Optional[dict] = None
        self._images: Optional[np.ndarray] = None
        self._labels: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._len} records"
        h, w, c = self.shape
        stored = f", {self.encodings['jpeg']} JPEG-encoded" if self.compressed else ""
        return f"Store({str(self.path)!r}, {state}, {h}x{w}x{c} uint8{stored}, labels {self.label_dtype})"

    @property
    def closed(self) -> bool:
        return self._core.closed

    @property
    def image_nbytes(self) -> int:
        """Bytes of one image (H × W × C)."""
        h, w, c = self.shape
        return h * w * c

    @property
    def file_size(self) -> int:
        return self._core.file_size

    @property
    def stride(self) -> int:
        """Bytes from one record's image to the next (the image size, padded to 64 bytes or not)
        in a store of raw records; in a compressed one, the room one decoded record takes."""
        return self._core.stride

    @property
    def version(self) -> int:
        """The format version of the file (docs/FORMAT.md): 1, or 2 with a record table."""
        return self._core.version

    @property
    def images_offset(self) -> int:
        """Where the image section starts in the file, as its header says (right after the
        header page, docs/FORMAT.md; opening the store checks it), for readers that map the file
        themselves."""
        return self._core.images_offset

    def prefetcher(self, indices: np.ndarray, lengths: Sequence[int]) -> _core.Prefetcher:
        """A Rust prefetcher gathering `indices` (int64), cut into batches of `lengths`, in order
        on a background thread into batch buffers the caller lends (see `fastload.dataset`)."""
        return _core.Prefetcher(self._core, indices, lengths)

    @property
    def meta(self) -> dict:
        """The metadata written with the store (pack options, class names, sources, ...)."""
        if self._meta is None:
            self._meta = json.loads(self._core.meta_json)
        return self._meta

    @property
    def labelled(self) -> bool:
        """False for a store packed without labels (`meta["labels"] == "none"`), whose labels
        are placeholders: 0, or NaN for float64."""
        return self.meta.get("labels") != NO_LABELS

    @property
    def images(self) -> np.ndarray:
        """All images as one N×H×W×C read-only uint8 view of the mapping (a store of raw
        records only: a compressed store's records must be decoded, and ValueError says so)."""
        if self.compressed:
            raise ValueError(
                f"{self.path}: its records are stored compressed ({self.encodings['jpeg']} of "
                f"{self._len} as JPEG), so there is no zero-copy array of every image; read them "
                "with store[i] or store.gather(indices), which decode them"
            )
        if self._images is None:
            stride = self._core.stride
            raw = np.frombuffer(self._core.image_bytes(), dtype=np.uint8)
            h, w, c = self.shape
            # Records may be padded to a 64-byte stride: strided view, still zero-copy.
            self._images = np.lib.stride_tricks.as_strided(
                raw, shape=(self._len, h, w, c), strides=(stride, w * c, c, 1), writeable=False
            )
        return self._images

    @property
    def labels(self) -> np.ndarray:
        """All labels as one read-only view of the label section."""
        if self._labels is None:
            self._labels = np.frombuffer(self._core.label_bytes(), dtype=self.label_dtype)
        return self._labels

    def __getitem__(self, index: int):
        """(image H×W×C, label) of one record; negative indices count from the end. The image
        is a view of the mapping, or in a compressed store the record decoded (a new array)."""
        i = self._core.resolve(self._checked_index(index))
        if self.compressed:
            images, labels = self.gather([i])
            return images[0], labels[0]
        return self.images[i], self.labels[i]

    def stored(self, index: int) -> Tuple[str, np.ndarray]:
        """Record `index` as the file stores it: its encoding ("raw" or "jpeg") and a read-only
        uint8 view of its bytes (a JPEG for an encoded record), for a decoder of one's own,
        such as the GPU's."""
        encoding, data = self._core.stored(self._checked_index(index))
        return encoding, data

    def _checked_index(self, index: Any) -> int:
        """`index` as an int64 (negative from the end); TypeError for a non-integer, IndexError
        beyond int64 (the range itself is checked by the core)."""
        if not is_int(index):
            raise TypeError(f"store indices must be integers, not {type(index).__name__}")
        if not -INT64_MAX - 1 <= int(index) <= INT64_MAX:
            raise IndexError(f"index {index} is out of range for a store of {self._len} records")
        return int(index)

    def __iter__(self):
        for i in range(self._len):
            yield self[i]

    def gather(self, indices: Any, out: Any = None, labels_out: Any = None):
        """Copies the records at `indices` (any order, duplicates allowed) into a batch.

        Returns (images N×H×W×C uint8, labels N). `out` and `labels_out` may be
        caller-owned buffers (NumPy arrays or CPU torch tensors, pinned ones included);
        the result then has the same type. The copy runs on Rust threads without the GIL.
        """
        idx = as_indices(indices)
        n = len(idx)
        shape = (n, *self.shape)
        if out is None:
            images = np.empty(shape, dtype=np.uint8)
            images_np = images
        else:
            images = out
            images_np = _as_writable_array(out, "out", np.dtype(np.uint8), shape)
        if labels_out is None:
            labels = np.empty(n, dtype=self.label_dtype)
            if _is_tensor(out):
                import torch

                labels = torch.from_numpy(labels)
            labels_np = labels if isinstance(labels, np.ndarray) else labels.numpy()
        else:
            labels = labels_out
            labels_np = _as_writable_array(labels_out, "labels_out", self.label_dtype, (n,))
        self._core.gather(
            idx, images_np.reshape(n, self.image_nbytes), labels_np.view(np.uint8).reshape(n, 8)
        )
        return images, labels

    def copy_in_order(self, first: int, count: int, out: np.ndarray) -> None:
        """Copies records `first` .. `first + count - 1`, in order, a batch at a time into the
        one reused uint8 array `out` (a whole number of images), GIL released. The copy `gather`
        makes, in its ideal order and without indices or labels: what `fastload bench` measures
        as the machine's copy limit for a loader."""
        if not (is_int(first) and is_int(count) and first >= 0 and count >= 0):
            raise ValueError(f"first and count must be non-negative integers, not {first!r} and {count!r}")
        if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or not out.flags.c_contiguous:
            raise ValueError("out must be a C-contiguous uint8 NumPy array")
        if not out.flags.writeable:
            raise ValueError("out must be writable")
        self._core.copy_in_order(int(first), int(count), out.reshape(-1))

    def read_serially(self, indices: Any, out: np.ndarray) -> None:
        """Reads the records at `indices` one after another on the calling thread, GIL
        released, into the uint8 array `out` (one image each; decoded when encoded): one
        thread's rate, which `fastload bench` sets `gather`'s threads against."""
        idx = as_indices(indices)
        images = _as_writable_array(out, "out", np.dtype(np.uint8), (len(idx), *self.shape))
        self._core.read_serially(idx, images.reshape(-1))

    def will_need(self, indices: Any) -> None:
        """Asks the kernel to start reading these records into the page cache."""
        self._core.will_need(as_indices(indices))

    def fingerprint(self) -> str:
        """SHA-256 of the header page (which ends with the header's own checksum) and of the
        record checksums, read from this store's mapping: stores with the same fingerprint hold
        the same records and labels (each record checksum covers its image and label)."""
        digest = hashlib.sha256(self._core.header_bytes())
        digest.update(self._core.checksum_bytes())
        return digest.hexdigest()

    def verify(self, limit: Optional[int] = VERIFY_LIMIT, decode: bool = False) -> DamagedRecords:
        """Record numbers whose bytes no longer match their checksum (empty when intact):
        the first `limit` of them (None: all), with `.total` counting every one. Memory is
        bounded by `limit`, not by the store's size. With `decode=True`, every encoded record
        is also decoded, and one that does not decode cleanly counts as damaged."""
        if limit is not None and (not is_int(limit) or limit < 0):
            raise ValueError(f"limit must be a non-negative integer or None, not {limit!r}")
        if not isinstance(decode, bool):
            raise TypeError(f"decode must be True or False, not {decode!r}")
        # A limit above the record count lists them all (and 10**26 fits no machine word).
        first, total = self._core.verify(None if limit is None else min(int(limit), len(self)), decode)
        return DamagedRecords(first, total)

    def resident_bytes(self) -> Tuple[int, int]:
        """(bytes of the file in the page cache now, file size)."""
        return self._core.resident_bytes()

    def check_unchanged(self) -> None:
        """Raises StoreError if the file was truncated or rewritten in place while mapped."""
        self._core.check_unchanged()

    def close(self) -> None:
        """Releases this handle's mapping; views already handed out stay valid."""
        self._core.close()
        self._images = self._labels = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def shared_class_names(names: Sequence[Any]) -> List[str]:
    """Each name that several classes share in `names` (label i is named names[i]), as "'cat'
    (labels 0, 1)": readers count records per name, so two classes of one name would merge. Names
    compare as a reader shows them, as text in Unicode NFC: an 'é' typed two ways is one name."""
    labels: Dict[str, List[int]] = {}
    for label, name in enumerate(names):
        labels.setdefault(unicodedata.normalize("NFC", str(name)), []).append(label)
    shared = []
    for name, group in labels.items():
        if len(group) < 2:
            continue
        forms = [str(names[label]) for label in group]
        if len(set(forms)) == 1:
            shared.append(f"{name!r} (labels {', '.join(map(str, group))})")
        else:
            written = ", ".join(f"{label} as {ascii(form)}" for label, form in zip(group, forms))
            shared.append(f"{name!r} (labels {written}: one text in different Unicode forms)")
    return shared


def check_encoding(encoding: str, quality: int, max_size: Optional[int]) -> None:
    """The encoding options of a store, checked in one place for `StoreWriter` and `pack`:
    an encoding of ENCODINGS, a JPEG quality from 1 to 100, and a size bound (bytes), which
    only a store that encodes can keep."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, not {encoding!r}")
    if not (is_int(quality) and 1 <= quality <= 100):
        raise ValueError(f"quality must be an integer from 1 to 100, not {quality!r}")
    if max_size is not None:
        int_in_range(max_size, "max_size", 1)
        if encoding != "jpeg":
            raise ValueError(
                "max_size keeps as many records raw as fit and encodes the rest: give encoding='jpeg'"
            )


def _meta_problem(value: Any, where: str, depth: int, seen: list) -> Optional[str]:
    """The first reason `value` cannot be stored as metadata a reader accepts, naming where
    it is (NaN, infinity, a lone surrogate, nesting or size beyond the reader's bounds).
    `seen` is a one-item list: the count of values walked so far, shared by the whole walk."""
    seen[0] += 1
    if seen[0] > _core.MAX_META_VALUES:
        return f"metadata has more than {_core.MAX_META_VALUES} elements (at {where})"
    if depth > _core.MAX_META_DEPTH:
        return f"{where} is nested {depth} levels deep, more than {_core.MAX_META_DEPTH} (or is a reference cycle)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value}: JSON has no NaN or infinity (store None or a string)"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"{where} holds a lone surrogate {value[e.start]!r} that UTF-8 cannot encode"
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = (
                _meta_problem(key, f"the key {key!r} of {where}", depth, [0])
                if isinstance(key, (str, float))
                else None
            )
            problem = problem or _meta_problem(item, f"{where}[{key!r}]", depth + 1, seen)
            if problem:
                return problem
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = _meta_problem(item, f"{where}[{i}]", depth + 1, seen)
            if problem:
                return problem
    return None


class StoreWriter:
    """Writes a store atomically: into a temporary file beside `path`, fsynced and put in
    place by `commit()` (hard-linked, so an existing file is never replaced, or renamed over
    it with overwrite=True; docs/FORMAT.md). As a context manager it commits on success and
    discards on an exception, so an interrupted write leaves nothing at `path`.

    Each writer owns its temporary file, so two writers for one `path` (two processes, or a
    notebook cell run twice) never mix records: the first commit wins, a later one raises
    FileExistsError (or, with overwrite=True, replaces it whole, keeping its mode). By the
    output rule (docs/RELIABILITY.md), a `path` that is not a regular file (a directory, a
    device, a named pipe, a socket) is refused with ValueError, when the writer is made and
    again just before the rename; when `path` is a symbolic link to a store, overwrite=True
    replaces the file it points to and keeps the link; a link to nothing is refused. Metadata is checked here, not at commit: it must be JSON a
    reader accepts (no NaN or infinity, no lone surrogates, at most MAX_META_LEN bytes,
    MAX_META_VALUES elements and MAX_META_DEPTH levels), and a `class_names` list must give
    each class a name of its own.

    `encoding="jpeg"` stores each record (1 or 3 channels) as a baseline JPEG of `quality`
    (1-100), decoded again on every read: a store about a tenth of the raw size at quality 90
    (format 2). A record whose JPEG is not shorter stays raw. `max_size` (bytes) bounds the
    whole file instead: as many records stay raw as fit, drawn with `seed` so they spread
    evenly over the store, and the rest are encoded; it needs `expected_count`, the number of
    records that will be written, and a store that cannot fit fails at commit, leaving
    nothing. `encode_stats` says what encoding did; the metadata records it as "encoding"."""

    def __init__(
        self,
        path: PathLike,
        shape: Sequence[int],
        label_dtype: str = "float64",
        meta: Optional[dict] = None,
        overwrite: bool = False,
        encoding: str = "raw",
        quality: int = DEFAULT_QUALITY,
        max_size: Optional[int] = None,
        expected_count: Optional[int] = None,
        seed: int = 0,
    ):
        path = fspath(path)
        shape = tuple(shape)
        if len(shape) == 2:
            shape = (*shape, 1)
        if len(shape) != 3 or not all(is_int(s) for s in shape):
            raise ValueError(f"shape must be (height, width, channels), not {shape!r}")
        if any(s <= 0 for s in shape) or any(s >= 2**32 for s in shape):
            raise ValueError(f"shape must have positive sides, not {shape!r}")
        if str(label_dtype) not in LABEL_DTYPES:
            raise ValueError(f"label_dtype must be 'float64' or 'int64', not {label_dtype!r}")
        if meta is not None and not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict, not {type(meta).__name__}")
        check_encoding(encoding, quality, max_size)
        int_in_range(seed, "seed", 0)
        if max_size is not None and expected_count is None:
            raise ValueError("max_size needs expected_count, the number of records that will be written")
        if expected_count is not None:
            int_in_range(expected_count, "expected_count", 0)
        self.meta = dict(meta or {})
        meta_bytes = len(self._meta_json().encode("utf-8"))  # fails now, not at commit
        self.path = Path(path)
        self.shape = tuple(int(s) for s in shape)
        self.label_dtype = np.dtype(str(label_dtype))
        self.encoding = encoding
        self.quality = int(quality) if encoding == "jpeg" else None
        self._core = _core.StoreWriter(
            path,
            self.shape,
            str(label_dtype),
            bool(overwrite),
            self.quality,
            None if max_size is None else int(max_size),
            int(expected_count or 0),
            meta_bytes + ENCODING_META_BYTES,
            int(seed),
        )

    def __len__(self) -> int:
        return len(self._core)

    def _check_images(self, images: Any, batch: bool) -> np.ndarray:
        arr = np.asarray(images)
        if arr.dtype != np.uint8:
            raise TypeError(f"images must be uint8, not {arr.dtype} (convert and scale them first)")
        if self.shape[2] == 1 and arr.ndim == 2 + batch:
            arr = arr[..., None]
        if tuple(arr.shape[batch:]) != self.shape:
            raise ValueError(
                f"image shape {tuple(arr.shape[batch:])} does not match the store's {self.shape}"
            )
        return np.ascontiguousarray(arr)

    def _check_labels(self, labels: Any) -> np.ndarray:
        arr = np.asarray(labels)
        if arr.dtype == bool or not (
            np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
        ):
            raise TypeError(f"labels must be numbers, not {arr.dtype}")
        if self.label_dtype == np.int64:
            # Casting would silently wrap or saturate values outside the int64 range.
            if np.issubdtype(arr.dtype, np.floating):
                whole = np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))
                if not (whole and np.all(np.abs(arr) < 2.0**63)):
                    raise ValueError("int64 labels must be whole numbers within the int64 range")
            elif arr.dtype.kind == "u" and arr.size and arr.max() > INT64_MAX:
                raise ValueError(f"int64 label {arr.max()} is beyond the int64 range")
        return np.ascontiguousarray(arr, dtype=self.label_dtype)

    def append(self, image: Any, label: Union[int, float]) -> None:
        """Appends one H×W×C uint8 image (H×W for one channel) and its label."""
        img = self._check_images(image, batch=False)
        lab = self._check_labels([label])
        if lab.shape != (1,):
            raise ValueError(f"label must be one number, not of shape {lab.shape[1:]}")
        self._core.append_many(img.reshape(-1), lab.view(np.uint8))

    def extend(self, images: Any, labels: Any) -> None:
        """Appends N images (N×H×W×C uint8) and their N labels."""
        img = self._check_images(images, batch=True)
        lab = self._check_labels(labels)
        if lab.ndim != 1 or len(lab) != len(img):
            raise ValueError(f"{len(img)} images but labels of shape {lab.shape}")
        self._core.append_many(img.reshape(-1), lab.view(np.uint8))

    def encode_stats(self) -> Optional[Dict[str, Any]]:
        """What encoding did so far (None for a raw store): records stored `encoded`, kept raw
        because the JPEG was not shorter (`raw_not_shorter`) or because the budget had room
        (`raw_by_budget`), the JPEG bytes, and the PSNR in dB of the encoded records against
        their raw pixels (`psnr_mean`, `psnr_min`; 100 for an exact one)."""
        return self._core.encode_stats()

    def _meta_json(self, encoding_stats: Optional[Dict[str, Any]] = None) -> str:
        """The metadata as stored, with the writer's keys (and, for a writer that encodes, what
        encoding did); ValueError naming what a reader would refuse."""
        meta = {
            "fastload_version": __version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **self.meta,
        }
        if encoding_stats is not None:
            meta["encoding"] = {"format": "jpeg", "quality": self.quality, **encoding_stats}
        names = meta.get("class_names")
        shared = shared_class_names(names) if isinstance(names, (list, tuple)) else []
        if shared:
            raise ValueError(
                f"meta['class_names'] gives one name to several classes: {'; '.join(shared)}; "
                "each class needs a name of its own"
            )
        try:
            text = json.dumps(meta, ensure_ascii=False, allow_nan=False)
            size = len(text.encode("utf-8"))
            if size <= _core.MAX_META_LEN:
                _core.check_meta(text)
        except (ValueError, RecursionError):
            # Find where the problem is only when there is one: the walk is slow on big metadata.
            problem = _meta_problem(meta, "meta", 1, [0])
            if problem is None:
                raise
            raise ValueError(problem) from None
        if size > _core.MAX_META_LEN:
            raise ValueError(
                f"metadata is {size} bytes as JSON, more than the {_core.MAX_META_LEN}-byte limit"
            )
        return text

    def commit(self) -> Path:
        """Finishes the store and moves it into place; returns its path."""
        return Path(self._core.commit(self._meta_json(self.encode_stats())))

    def discard(self) -> None:
        """Throws the partial store away; nothing is left at `path`."""
        self._core.discard()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()


__all__ = ["Store", "StoreWriter", "StoreError", "DamagedRecords", "VERIFY_LIMIT", "ENCODINGS"]
