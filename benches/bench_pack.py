"""Benchmark of `fastload.pack` against the packers a user would write today with Pillow.

Builds three folders of JPEG photos from scikit-image's sample photographs (crops,
upscaled with Bicubic, with Gaussian sensor-like noise, quality 85-95):

- web: 500x375 to 1024x768;
- hd: 1920x1080;
- camera: 4000x3000 and 6000x4000 (12 and 24 megapixels).

Then times on each folder, the methods alternating, median of `--repeats` rounds, packing
to `--size` square records (crop) with each of `--workers` (e.g. `1,2`) threads:

- fastload.pack(...), which decodes JPEGs at 1/2, 1/4 or 1/8 scale in the DCT domain;
- Pillow + `Image.draft` (the same DCT scaling) in a ThreadPoolExecutor;
- plain Pillow (full decode) in a ThreadPoolExecutor;
- with `--simd-python` naming a Python that has Pillow-SIMD (run as a subprocess of this
  script, in turn with the others): Pillow-SIMD + `draft` + Lanczos, + `draft` + bilinear,
  and full decode + Lanczos.

Each Pillow packer lists the folder, opens, EXIF-transposes, converts to RGB, resizes
(ImageOps.fit, the geometry of fastload's crop; Lanczos unless named) and writes the records
in order, as fastload does; fastload also fsyncs its store, which the Pillow packers do not
(the line `fsync` times an fsync of a store-sized file written just before, for scale).
Quality: PSNR of each packer's records against a float reference, a full decode resized
with Lanczos per channel in Pillow's float mode 'F' (no 8-bit rounding in between).
Ratios are "fastload is Nx faster", the median of the per-round pairs at the same thread count.

Pillow-SIMD must not share an environment with Pillow; build it (AVX2) in a venv of its own:

    apt-get install libjpeg-dev zlib1g-dev
    python3.11 -m venv /work/pillow-simd-venv
    /work/pillow-simd-venv/bin/pip install numpy
    CC="cc -mavx2" /work/pillow-simd-venv/bin/pip install --no-binary :all: pillow-simd==12.1.1.post0

With `--cpu-per-file`, times instead the CPU seconds of one file on one thread, the methods
alternating file by file (median of `--repeats`): fastload's read + decode + resize, Pillow's
`draft` + `load` alone, and Pillow's whole record; where the packers spend the same CPU per
file, no pipelining makes one of them much faster than the other at the same thread count.

    pip install -e ".[bench]"    # Pillow and scikit-image (the sample photographs)
    python benches/bench_pack.py [--size 384] [--workers 1,2] [--simd-python /work/pillow-simd-venv/bin/python]
    python benches/bench_pack.py --cpu-per-file --corpora camera
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
WEB_SIZES = ((500, 375), (375, 500), (1024, 768), (768, 1024), (640, 480))  # (width, height)
CORPORA = {  # name: (sizes, files)
    "web": (WEB_SIZES, 100),
    "hd": (((1920, 1080),), 24),
    "camera": (((4000, 3000), (6000, 4000)), 24),
}


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


def make_folder(root: Path, sizes: tuple, count: int, seed: int = 0) -> int:
    """`count` distinct JPEGs of the given sizes; returns their total size in bytes."""
    rng = np.random.default_rng(seed)
    photos = sample_photos()
    (root / "photos").mkdir(parents=True)  # one class folder: pack wants labels
    total = 0
    for i in range(count):
        photo = photos[i % len(photos)]
        w, h = photo.size
        cw, ch = int(w * rng.uniform(0.6, 1.0)), int(h * rng.uniform(0.6, 1.0))
        left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        image = photo.crop((left, top, left + cw, top + ch)).resize(sizes[i % len(sizes)], Image.BICUBIC)
        if rng.random() < 0.5:
            image = ImageOps.mirror(image)
        pixels = np.asarray(image, dtype=np.float32)
        pixels += rng.normal(0, rng.uniform(2, 6), pixels.shape).astype(np.float32)  # sensor noise
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        path = root / "photos" / f"photo_{i:05}.jpg"
        image.save(path, quality=int(rng.integers(85, 96)))
        total += path.stat().st_size
    return total


FILTERS = {"lanczos": Image.LANCZOS, "bilinear": Image.BILINEAR}


def pillow_record(path: Path, side: int, draft: bool, resample: str = "lanczos") -> bytes:
    """One record the way a Pillow user would make it, with fastload's geometry."""
    with Image.open(path) as im:
        if draft:
            im.draft("RGB", (side, side))
        im = ImageOps.exif_transpose(im).convert("RGB")
        return ImageOps.fit(im, (side, side), FILTERS[resample]).tobytes()


def pillow_pack(
    folder: Path, dest: Path, side: int, workers: int, draft: bool, resample: str = "lanczos"
) -> float:
    """Seconds to list `folder`'s JPEGs and write their records to `dest` with a thread pool."""
    start = time.perf_counter()
    files = sorted(folder.glob("*/*.jpg"))
    with ThreadPoolExecutor(workers) as pool, open(dest, "wb") as out:
        for record in pool.map(lambda p: pillow_record(p, side, draft, resample), files):
            out.write(record)
    return time.perf_counter() - start


def fsync_seconds(path: Path) -> float:
    """Seconds to rewrite `path` (a store-sized file) and fsync it: what durability costs."""
    data = path.read_bytes()
    with open(path.with_suffix(".fsync"), "wb") as out:
        out.write(data)
        out.flush()
        start = time.perf_counter()
        os.fsync(out.fileno())
        return time.perf_counter() - start


def reference(path: Path, side: int) -> np.ndarray:
    """Full decode, then Lanczos per channel in float: the crop of ImageOps.fit, no rounding."""
    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
    w, h = im.size
    crop = min(w, h)  # a square record: the centre square
    box = ((w - crop) / 2, (h - crop) / 2, (w + crop) / 2, (h + crop) / 2)
    channels = [c.convert("F").resize((side, side), Image.LANCZOS, box=box) for c in im.split()]
    return np.stack([np.asarray(c) for c in channels], axis=-1)


def psnr(records: np.ndarray, references: np.ndarray) -> float:
    mse = float(np.mean((records.astype(np.float64) - np.clip(references, 0, 255)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def machine() -> str:
    import PIL

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, Pillow {PIL.__version__}"


def simd_pack(
    python: str, folder: Path, dest: Path, side: int, workers: int, draft: bool, resample: str
) -> float:
    """Times pillow_pack in another Python (Pillow-SIMD's); returns its seconds."""
    out = subprocess.run(
        [python, __file__, "--pillow-only", str(dest), "--size", str(side), "--workers", str(workers)]
        + ["--resample", resample]
        + (["--draft"] if draft else [])
        + [str(folder)],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout)


def simd_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import PIL.features as f, PIL; print(PIL.__version__, f.version('jpg'))"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def run_corpus(name: str, tmp: Path, args) -> None:
    import fastload

    sizes, count = CORPORA[name]
    count = args.files or count
    src = tmp / name
    source_bytes = make_folder(src, sizes, count)
    side = args.size
    workers = [int(w) for w in str(args.workers).split(",")]

    def methods_for(n: int) -> dict:
        methods = {
            "fastload": lambda dest: timed(
                lambda: fastload.pack(src, dest, side, resize="crop", workers=n, quiet=True, overwrite=True)
            ),
            "pillow+draft": lambda dest: pillow_pack(src, dest, side, n, draft=True),
            "pillow": lambda dest: pillow_pack(src, dest, side, n, draft=False),
        }
        if args.simd_python:
            simd = args.simd_python
            methods["simd+draft"] = lambda dest: simd_pack(simd, src, dest, side, n, True, "lanczos")
            methods["simd+draft bilinear"] = lambda dest: simd_pack(
                simd, src, dest, side, n, True, "bilinear"
            )
            methods["simd"] = lambda dest: simd_pack(simd, src, dest, side, n, False, "lanczos")
        return methods

    runs = {n: methods_for(n) for n in workers}
    times = {(n, m): [] for n in workers for m in runs[n]}
    loads = []
    for _ in range(args.repeats):
        loads.append(os.getloadavg()[0])
        for n in workers:
            for method, run in runs[n].items():
                dest = tmp / f"{name}-{method}.out"
                # Each method writes a new file, as a first pack does: freeing the last run's
                # blocks (tens of ms for a large file on ext4) is left out of every timing.
                dest.unlink(missing_ok=True)
                times[n, method].append(run(dest))
    loads.append(os.getloadavg()[0])
    fsync = statistics.median(fsync_seconds(tmp / f"{name}-pillow.out") for _ in range(args.repeats))
    references = np.stack([reference(f, side) for f in sorted(src.glob("photos/*.jpg"))])
    quality = {"fastload": psnr(np.asarray(fastload.Store(tmp / f"{name}-fastload.out").images), references)}
    for method in runs[workers[0]]:
        if method != "fastload":
            records = np.fromfile(tmp / f"{name}-{method}.out", np.uint8).reshape(references.shape)
            quality[method] = psnr(records, references)
    print(
        f"{name}: {count} JPEGs {'/'.join(f'{w}x{h}' for w, h in sizes)}, {source_bytes / 1e6:.1f} MB, "
        f"-> {side}x{side} crop, median of {args.repeats}, "
        f"load average at each round {' '.join(f'{x:.1f}' for x in loads)}"
    )
    for n in workers:
        print(f"  {n} worker{'s' if n > 1 else ''}:")
        ours = times[n, "fastload"]
        for method in runs[n]:
            seconds = times[n, method]
            pairs = [theirs / mine for mine, theirs in zip(ours, seconds)]
            print(
                f"    {method:20} {statistics.median(seconds):6.2f} s {count / statistics.median(seconds):7.1f} "
                f"files/s  fastload is {statistics.median(pairs):5.2f}x faster "
                f"(pairs {', '.join(f'{r:.2f}' for r in pairs)})  PSNR {quality[method]:6.2f} dB"
            )
    if len(workers) > 1:
        first, last = workers[0], workers[-1]
        for method in runs[first]:
            pairs = [a / b for a, b in zip(times[first, method], times[last, method])]
            print(
                f"  {method:22} {last} workers / {first}: {statistics.median(pairs):4.2f}x "
                f"(pairs {', '.join(f'{r:.2f}' for r in pairs)})"
            )
    print(f"  fsync of a {(tmp / f'{name}-pillow.out').stat().st_size / 1e6:.0f} MB file: {fsync:.3f} s")


def cpu_per_file(name: str, tmp: Path, args) -> None:
    """Median CPU seconds per file on one thread: fastload's decode against Pillow's (see the docstring)."""
    import resource

    from fastload import _core

    def cpu_seconds(f, path: Path) -> float:
        before = resource.getrusage(resource.RUSAGE_SELF)
        f(path)
        after = resource.getrusage(resource.RUSAGE_SELF)
        return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime

    def pillow_load(path: Path) -> None:
        with Image.open(path) as im:
            im.draft("RGB", (side, side))
            im.load()

    sizes, count = CORPORA[name]
    count = args.files or count
    make_folder(tmp / name, sizes, count)
    files = sorted((tmp / name).glob("photos/*.jpg"))
    side = args.size
    decoder = _core.PackDecoder(side, side, "crop", (0, 0, 0), 1)  # one thread
    record = np.empty((1, side, side, 3), np.uint8)
    methods = {
        "fastload": lambda path: decoder.decode_into([str(path)], record),
        "pillow draft+load": pillow_load,
        "pillow+draft record": lambda path: pillow_record(path, side, draft=True),
    }
    load = os.getloadavg()[0]
    seconds = {m: [] for m in methods}
    for path in files:
        for method, run in methods.items():
            seconds[method].append(statistics.median(cpu_seconds(run, path) for _ in range(args.repeats)))
    print(
        f"{name}: {count} JPEGs, CPU ms per file on one thread (each the median of {args.repeats}), "
        f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    ours = sum(seconds["fastload"])
    for method, per_file in seconds.items():
        print(
            f"  {method:20} {1000 * sum(per_file) / count:6.1f} ms  {sum(per_file) / ours:5.2f}x fastload's"
        )


def timed(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument("--workers", default="2", help="thread counts, comma-separated (e.g. 1,2)")
    parser.add_argument("--files", type=int, help="JPEGs per corpus (default: web 100, hd 24, camera 24)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--corpora", default="web,hd,camera")
    parser.add_argument("--simd-python", help="a Python with pillow-simd installed, for two more columns")
    parser.add_argument(
        "--cpu-per-file", action="store_true", help="CPU seconds per file on one thread instead"
    )
    parser.add_argument("--pillow-only", help=argparse.SUPPRESS)  # the subprocess of simd_pack
    parser.add_argument("--draft", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resample", default="lanczos", help=argparse.SUPPRESS)
    parser.add_argument("folder", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pillow_only:
        folder, dest = Path(args.folder[0]), Path(args.pillow_only)
        print(pillow_pack(folder, dest, args.size, int(args.workers), args.draft, args.resample))
        return
    print(f"machine: {machine()}")
    if args.simd_python:
        print(f"Pillow-SIMD (--simd-python {args.simd_python}): {simd_version(args.simd_python)}")
    print(f"command: {' '.join([Path(sys.executable).name] + sys.argv)}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.corpora.split(","):
            (cpu_per_file if args.cpu_per_file else run_corpus)(name, Path(tmp), args)


if __name__ == "__main__":
    main()
