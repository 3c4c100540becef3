"""fastload: Rust-accelerated data loading for PyTorch.

Pack a folder of images once into a uint8 store, memory-map it, and feed training
loops with batches gathered by Rust threads at memory bandwidth.

Errors follow one rule, and every message names the file or the argument concerned:

- a problem with a file (missing, unreadable, not a store, damaged, changed while open)
  is `StoreError`; an existing destination is `FileExistsError`;
- a wrong argument is `ValueError` or `TypeError` (an index out of range `IndexError`),
  and so is using a store, writer or prefetcher after it was closed, committed or
  discarded, as with Python's own files;
- an allocation too large for the machine is `MemoryError`.

The `fastload` command turns each of them into a message and exit status 1 (2 for a bad
command line).
"""

from fastload._core import StoreError, __version__
from fastload.inspect import build_info
from fastload.pack import PackReport, pack
from fastload.store import Store, StoreWriter

_TORCH_EXPORTS = {
    "FastLoadDataset": "dataset",
    "to_device": "device",
    "DeviceLoader": "device",
    "split_indices": "dataset",
    "Augment": "augment",
    "fit_many": "train",
}


def __getattr__(name):
    # Modules that need torch load on first use, so `import fastload` (and the CLI) stays fast.
    if name in _TORCH_EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"fastload.{_TORCH_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'fastload' has no attribute {name!r}")


__all__ = [
    "Store",
    "StoreWriter",
    "StoreError",
    "pack",
    "PackReport",
    "__version__",
    "build_info",
    "FastLoadDataset",
    "to_device",
    "DeviceLoader",
    "split_indices",
    "Augment",
    "fit_many",
]
