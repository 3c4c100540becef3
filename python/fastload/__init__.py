"""fastload: Rust-accelerated data loading for PyTorch.

Pack a folder of images once into a uint8 store, memory-map it, and feed training
loops with batches gathered by Rust threads at memory bandwidth.
"""

from fastload._core import StoreError
from fastload.store import Store, StoreWriter

__version__ = "0.1.0"

__all__ = ["Store", "StoreWriter", "StoreError", "__version__"]
