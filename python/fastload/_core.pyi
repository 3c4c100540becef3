"""Type stubs for the Rust extension `fastload._core` (hand-written; keep in step with rust/bindings/)."""

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self

_Path = Union[str, os.PathLike[str]]

__all__ = [
    "FORMAT_VERSION",
    "FastloadError",
    "MAX_META_DEPTH",
    "MAX_META_LEN",
    "MAX_META_VALUES",
    "Mapping",
    "PACK_ALPHA_BACKGROUND",
    "PACK_DECODE_MEMORY_BUDGET",
    "PACK_MAX_DECODE_ALLOC",
    "PACK_MAX_PIXELS",
    "PACK_MAX_WORKERS",
    "PARTIAL_SUFFIX",
    "PackDecoder",
    "PendingFile",
    "RecycledBuffer",
    "Prefetcher",
    "Store",
    "StoreError",
    "StoreWriter",
    "__version__",
    "append_output",
    "augment",
    "check_meta",
    "evict",
    "file_kind",
    "num_threads",
    "output_target",
    "pack_jpeg_simd",
    "recycled_float32",
    "recycled_idle",
]

__version__: str  # Cargo.toml's version: the package's one version number
FORMAT_VERSION: int
MAX_META_LEN: int
MAX_META_VALUES: int
MAX_META_DEPTH: int
PACK_MAX_PIXELS: int
PACK_MAX_DECODE_ALLOC: int
PACK_ALPHA_BACKGROUND: bytes  # RGB
PACK_DECODE_MEMORY_BUDGET: int  # bytes all decode threads of one pack hold at once
PACK_MAX_WORKERS: int  # 4 x this machine's cores

class FastloadError(Exception):
    """The base of fastload's own errors."""

class StoreError(FastloadError):
    """A store file is missing, unreadable, damaged, or not a fastload store."""

def num_threads() -> int: ...
def pack_jpeg_simd() -> bool:
    """Whether libjpeg-turbo decodes JPEGs with SIMD in this build (built with nasm) on this CPU."""

def augment(
    images: npt.NDArray[np.uint8],
    theta: Optional[npt.NDArray[np.float32]],
    colour: npt.NDArray[np.float32],
    scale: npt.NDArray[np.float32],
    shift: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
) -> None:
    """Writes the augmented N×H'×W'×C float32 batch of uint8 N×H×W×C `images` into `out`
    (theta N×2×3 or None, colour N×3, scale and shift one per channel), GIL released."""

def recycled_float32(shape: Tuple[int, int, int, int]) -> npt.NDArray[np.float32]:
    """A writable, uninitialised float32 N×H×W×C array whose memory goes back to fastload's
    pool of idle buffers (at most 4 and 1 GiB) when the array and every view of it are gone."""

def recycled_idle() -> Tuple[int, int]:
    """(buffers, bytes) idle in the recycled-buffer pool now."""

def check_meta(meta_json: str) -> None: ...
def evict(path: _Path) -> None: ...

@final
class RecycledBuffer:
    """Owns a recycled buffer as the `base` of the NumPy array built on it."""

@final
class Mapping:
    """Keeps a store's mapping alive as the `base` of the NumPy arrays built on it."""

@final
class Store:
    def __new__(cls, path: _Path) -> Self: ...
    @property
    def path(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def shape(self) -> Tuple[int, int, int]: ...
    @property
    def label_dtype(self) -> str: ...
    @property
    def stride(self) -> int: ...
    @property
    def images_offset(self) -> int: ...
    @property
    def file_size(self) -> int: ...
    @property
    def meta_json(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def fixed_stride(self) -> bool:
        """Records at a fixed stride (format 1); False with a record table (format 2)."""
    @property
    def version(self) -> int: ...
    @property
    def encodings(self) -> Tuple[int, int]:
        """(raw records, JPEG records)."""
    def stored(self, index: int) -> Tuple[str, np.ndarray]:
        """("raw" | "jpeg", a read-only view of the record's stored bytes)."""
    def image_bytes(self) -> np.ndarray:
        """Read-only 1-D uint8 array over the images section."""
    def label_bytes(self) -> np.ndarray:
        """Read-only 1-D uint8 array over the labels section."""
    def header_bytes(self) -> np.ndarray:
        """Read-only 1-D uint8 array over the header page, its checksum included."""
    def checksum_bytes(self) -> np.ndarray:
        """Read-only 1-D uint8 array over the record checksums section."""
    def resolve(self, index: int) -> int: ...
    def gather(
        self,
        indices: npt.NDArray[np.int64],
        images: npt.NDArray[np.uint8],
        labels: npt.NDArray[np.uint8],
    ) -> None: ...
    def copy_in_order(self, first: int, count: int, batch: npt.NDArray[np.uint8]) -> None:
        """Records first..first+count-1 in order, a batch at a time, into `batch`."""
    def read_serially(self, indices: npt.NDArray[np.int64], images: npt.NDArray[np.uint8]) -> None:
        """The records one after another on the calling thread (decoded when encoded)."""
    def will_need(self, indices: npt.NDArray[np.int64]) -> None: ...
    def verify(self, limit: Optional[int] = None, decode: bool = False) -> Tuple[List[int], int]: ...
    def resident_bytes(self) -> Tuple[int, int]: ...
    @property
    def identity(self) -> Tuple[int, int, int, int]:
        """(device, inode, length, modification time in ns) of the file when it was opened."""
    def check_unchanged(self) -> None: ...
    def close(self) -> None: ...

@final
class StoreWriter:
    def __new__(
        cls,
        path: _Path,
        shape: Tuple[int, int, int],
        label_dtype: str,
        overwrite: bool,
        quality: Optional[int] = None,
        max_file_bytes: Optional[int] = None,
        expected_count: int = 0,
        meta_bytes: int = 0,
        seed: int = 0,
    ) -> Self: ...
    def __len__(self) -> int: ...
    def append_many(self, images: npt.NDArray[np.uint8], labels: npt.NDArray[np.uint8]) -> None: ...
    def encode_stats(self) -> Optional[Dict[str, Any]]:
        """What encoding did so far (None for a raw store)."""
    def commit(self, meta_json: str) -> str: ...
    def discard(self) -> None: ...

PARTIAL_SUFFIX: str  # of the output rule's temporary files (rust/output.rs)

@final
class PendingFile:
    """A new version of the output file `path` in a locked temporary file beside the file it
    replaces (the output rule, rust/output.rs); `commit` moves it into place."""

    def __new__(cls, path: _Path, what: str = "output", overwrite: bool = True) -> Self: ...
    @property
    def target(self) -> str: ...
    def fileno(self) -> int: ...
    def commit(self) -> str: ...
    def discard(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, kind: Optional[type], _value: Optional[BaseException], _traceback: object) -> bool: ...

def append_output(path: _Path, data: bytes, what: str = "log") -> None: ...
def output_target(path: _Path, what: str = "output") -> str: ...
def file_kind(mode: int) -> str: ...

@final
class Prefetcher:
    """One pass over `indices` cut into batches of `lengths`, gathered in order by a Rust
    thread into batch buffers lent with `add_slot`/`release` (the engine of `FastLoadDataset`)."""

    def __new__(cls, store: Store, indices: npt.NDArray[np.int64], lengths: Sequence[int]) -> Self: ...
    def add_slot(self, images: npt.NDArray[np.uint8], labels: npt.NDArray[np.uint8]) -> int: ...
    def release(self, slot: int) -> None: ...
    def retire(self, slot: int) -> None: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def remaining(self) -> int: ...
    def next(self) -> Optional[Tuple[int, int, int, bool]]: ...  # (slot, batch, records, waited)
    def close(self) -> None: ...

@final
class PackDecoder:
    """Decodes and resizes image files into records in parallel (the Rust side of `fastload.pack`)."""

    def __new__(
        cls, height: int, width: int, mode: str, fill: Tuple[int, int, int], workers: Optional[int] = None
    ) -> Self: ...
    @property
    def num_threads(self) -> int: ...
    def decode_into(
        self, paths: Sequence[_Path], out: npt.NDArray[np.uint8]
    ) -> List[Tuple[int, Optional[str], List[str]]]:
        """One (bytes read, None, libjpeg's warnings) or (0, why it failed, []) per path. Checks
        signals while decoding: Ctrl-C raises KeyboardInterrupt within about a file's decode."""
        ...
