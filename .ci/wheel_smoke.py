"""Smoke test of an installed fastload artefact, run by `.ci/run` in a fresh virtual environment:
fastload must come from that environment's site-packages (not a checkout), its version must be
the one the package declares, and a store must round-trip."""

import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

import fastload

site = Path(sys.prefix).resolve()
where = Path(fastload.__file__).resolve()
assert sys.prefix != sys.base_prefix, "run this inside the fresh virtual environment"
assert site in where.parents and "site-packages" in where.parts, f"fastload imported from {where}, not {site}"
assert fastload.__version__ == metadata.version("fastload"), (
    fastload.__version__,
    metadata.version("fastload"),
)

path = os.path.join(tempfile.mkdtemp(), "wheel-check.bin")
with fastload.StoreWriter(path, (4, 4, 3)) as writer:
    writer.extend(np.arange(3 * 48, dtype=np.uint8).reshape(3, 4, 4, 3), [1.0, 2.0, 3.0])
store = fastload.Store(path)
images, labels = store.gather([2, 0])
assert images.shape == (2, 4, 4, 3) and list(labels) == [3.0, 1.0]
assert (images[0] == store.images[2]).all() and not store.images.flags.writeable
# The published wheel is built with nasm: its JPEG decoder has SIMD (a build without it warns at
# every pack, and would be 1.4-2.7x slower to pack).
assert fastload.build_info()["jpeg_simd"], fastload.build_info()
print(f"artefact OK: fastload {fastload.__version__} from {where}")
