"""fastload: Rust-accelerated data loading for PyTorch.

Pack a folder of images once into a uint8 store, memory-map it, and feed training
loops with batches gathered by Rust threads at memory bandwidth.
"""

from fastload._core import StoreError, __version__
from fastload.pack import PackReport, pack
from fastload.store import Store, StoreWriter

_TORCH_EXPORTS = {
    "FastLoadDataset": "dataset",
    "to_device": "device",
    "split_indices": "dataset",
    "fit_many": "train",
}


def __getattr__(name):
    # Modules that need torch load on first use, so `import fastload` (and the CLI) stays fast.
    if name in _TORCH_EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"fastload.{_TORCH_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'fastload' has no attribute {name!r}")


__all__ = ["Store", "StoreWriter", "StoreError", "pack", "PackReport", "__version__", "FastLoadDataset", "to_device", "split_indices", "fit_many"]
