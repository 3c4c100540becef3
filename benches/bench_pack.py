"""Benchmark of `fastload.pack` against the packer a user would write today with Pillow.

Builds a folder of JPEG photos (crops, rescales and flips of scikit-image's sample
photographs, quality 85-95, sizes like 500x375 and 1024x768), then times on the same
files, alternating, median of `--repeats` runs each:

- fastload.pack(src, dest, size, resize=..., workers=N)
- Pillow in a ThreadPoolExecutor of N threads: open, EXIF-transpose, convert to RGB,
  resize with the same filter and geometry (Lanczos; ImageOps.fit for crop), write the
  same bytes in order to a raw file.

Prints files/s, MB/s of JPEG read, the ratio, and the PSNR between the two packers' pixels.

    pip install -e ".[bench]"    # Pillow and scikit-image (the sample photographs)
    python benches/bench_pack.py [--files 600] [--size 256] [--resize crop] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import PIL
from PIL import Image, ImageOps

import fastload

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
SIZES = ((500, 375), (375, 500), (1024, 768), (768, 1024), (640, 480))  # (width, height)


def sample_photos() -> list:
    """scikit-image's sample photographs that load on this machine (some need a download)."""
    import skimage.data

    photos = []
    for name in PHOTOS:
        try:
            photos.append(Image.fromarray(getattr(skimage.data, name)()).convert("RGB"))
        except Exception:  # noqa: BLE001 - a photo that needs a download is simply left out
            continue
    return photos


def make_folder(root: Path, count: int, seed: int = 0) -> int:
    """`count` distinct JPEGs in 5 class folders; returns their total size in bytes."""
    rng = np.random.default_rng(seed)
    photos = sample_photos()
    total = 0
    for i in range(count):
        photo = photos[i % len(photos)]
        w, h = photo.size
        cw, ch = int(w * rng.uniform(0.6, 1.0)), int(h * rng.uniform(0.6, 1.0))
        left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        image = photo.crop((left, top, left + cw, top + ch)).resize(SIZES[i % len(SIZES)], Image.BICUBIC)
        if rng.random() < 0.5:
            image = ImageOps.mirror(image)
        path = root / f"class{i % 5}" / f"photo_{i:05}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, quality=int(rng.integers(85, 96)))
        total += path.stat().st_size
    return total


def pillow_record(path: Path, size: tuple, resize: str, fill: int) -> bytes:
    """One record the way a Pillow user would make it, with fastload's filter and geometry."""
    width, height = size[1], size[0]
    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
        if resize == "crop":
            im = ImageOps.fit(im, (width, height), Image.LANCZOS)
        elif resize == "pad":
            im = ImageOps.pad(im, (width, height), Image.LANCZOS, color=(fill,) * 3)
        else:
            im = im.resize((width, height), Image.LANCZOS)
        return im.tobytes()


def pillow_pack(files: list, dest: Path, size: tuple, resize: str, workers: int) -> None:
    with ThreadPoolExecutor(workers) as pool, open(dest, "wb") as out:
        for record in pool.map(lambda p: pillow_record(p, size, resize, 0), files):
            out.write(record)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, Pillow {PIL.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=600)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--resize", choices=("squash", "crop", "pad"), default="crop")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size = (args.size, args.size)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "photos"
        source_bytes = make_folder(src, args.files)
        files = sorted(src.rglob("*.jpg"), key=lambda p: p.relative_to(src).as_posix())
        times = {"fastload": [], "pillow": []}
        for _ in range(args.repeats):
            start = time.perf_counter()
            fastload.pack(src, tmp / "store.fl", size, resize=args.resize, workers=args.workers, quiet=True,
                          overwrite=True)
            times["fastload"].append(time.perf_counter() - start)
            start = time.perf_counter()
            pillow_pack(files, tmp / "pillow.raw", size, args.resize, args.workers)
            times["pillow"].append(time.perf_counter() - start)
        ours = np.asarray(fastload.Store(tmp / "store.fl").images)
        theirs = np.fromfile(tmp / "pillow.raw", dtype=np.uint8).reshape(ours.shape)

    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.1f} at the start")
    print(f"{args.files} JPEGs, {source_bytes / 1e6:.1f} MB, -> {args.size}x{args.size} {args.resize}, "
          f"{args.workers} workers, median of {args.repeats}")
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, seconds in medians.items():
        print(f"  {name:9} {seconds:6.2f} s  {args.files / seconds:7.0f} files/s  "
              f"{source_bytes / 1e6 / seconds:6.1f} MB/s   (runs: {', '.join(f'{t:.2f}' for t in times[name])})")
    pairs = [p / f for f, p in zip(times["fastload"], times["pillow"])]
    print(f"  ratio fastload / pillow: {medians['pillow'] / medians['fastload']:.2f}x of the medians; "
          f"per alternating pair {', '.join(f'{r:.2f}' for r in pairs)} (median {statistics.median(pairs):.2f}x)")
    print(f"  PSNR fastload vs pillow pixels: {psnr(ours, theirs):.1f} dB")


if __name__ == "__main__":
    main()
