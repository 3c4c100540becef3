"""Packing a folder of images into a store: `fastload.pack(src, dest)` and `fastload pack SRC DEST`.

Python lists the files (`walk`) and reads the labels (`labels`); Rust threads decode and resize
each chunk of files straight into one of two reused record buffers, without the GIL, while a
writer thread appends the previous chunk to the store from the other (`pipeline`). `display`
says how file names and problems are shown.
Decoding choices (format sniffed from the bytes, EXIF orientation applied, alpha on
white, Lanczos3 antialiased resampling like Pillow's `Image.LANCZOS`, a 100-megapixel /
1 GiB limit against decompression bombs, one decode-memory budget shared by all threads,
named pipes and devices refused without blocking, libjpeg's warnings about damaged data kept)
are documented in `rust/pack/mod.rs`.
"""

from fastload.errors import BadFilesError
from fastload.options import RESIZE_MODES
from fastload.pack.pipeline import PackReport, pack
from fastload.pack.walk import IMAGE_EXTENSIONS, LINK_OUTSIDE_SRC

__all__ = ["pack", "PackReport", "BadFilesError", "RESIZE_MODES", "IMAGE_EXTENSIONS", "LINK_OUTSIDE_SRC"]
