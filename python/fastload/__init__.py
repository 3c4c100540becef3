"""fastload: Rust-accelerated data loading for PyTorch.

Pack a folder of images once into a uint8 store, memory-map it, and feed training
loops with batches gathered by Rust threads at memory bandwidth.

Errors follow one rule, written in `fastload.errors`; every message names the file or the
argument concerned, and every exception fastload defines derives from `FastloadError`.
"""

from fastload._core import __version__
from fastload.errors import (
    BadFilesError,
    Diverged,
    FastloadError,
    MissingDependencyError,
    StoreError,
)
from fastload.inspect import build_info
from fastload.pack import PackReport, pack
from fastload.store import Store, StoreWriter

_TORCH_EXPORTS = {
    "FastLoadDataset": "dataset",
    "to_device": "device",
    "DeviceLoader": "device",
    "DeviceStore": "resident",
    "split_indices": "dataset",
    "Augment": "augment",
    "fit_many": "train",
}


def __getattr__(name):
    # Modules that need torch load on first use, so `import fastload` (and the CLI) stays fast.
    if name in _TORCH_EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"fastload.{_TORCH_EXPORTS[name]}"), name)
    if name == "NotFittedError":  # made on first use: it derives from scikit-learn's
        from fastload import errors

        return errors.NotFittedError
    raise AttributeError(f"module 'fastload' has no attribute {name!r}")


__all__ = [
    "Store",
    "StoreWriter",
    "FastloadError",
    "StoreError",
    "BadFilesError",
    "Diverged",
    "MissingDependencyError",
    "NotFittedError",
    "pack",
    "PackReport",
    "__version__",
    "build_info",
    "FastLoadDataset",
    "to_device",
    "DeviceLoader",
    "DeviceStore",
    "split_indices",
    "Augment",
    "fit_many",
]
