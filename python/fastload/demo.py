"""``fastload demo``: the whole path — pack, load, train, check — on a task with a known answer.

It writes a few thousand photo-like JPEGs (random crops of scikit-image's sample photographs,
flipped and dimmed by a random gain; procedural textures as BMP files when scikit-image or
Pillow is missing), packs them with :func:`fastload.pack`, compares the loader with the common
``np.memmap`` + ``DataLoader(num_workers=2)`` recipe on the same store, trains a
:class:`~fastload.train.MonotonicRegressor` for a short run, and checks its guarantee.

The label is a light-meter reading: ``4 × mean brightness of the image + 2 × exposure +
noise``. Brightness is visible in the pixels; ``exposure`` is a per-record scalar stored beside
the images and fed to the model's monotone input, so the trained model is guaranteed never to
predict less when exposure rises. A regressor that learned the task beats predicting the mean
by far; the demo fails (exit status 1) when it does not, or when the guarantee is violated.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, List, Optional, TextIO, Tuple

import numpy as np
import torch

from fastload._checks import import_optional
from fastload.options import DEMO_SOURCES

SETTINGS = {
    # images, record side, epochs: a default run takes 13-18 s on 2 cores, --quick less.
    "default": {"images": 2400, "size": 64, "epochs": 12},
    "quick": {"images": 600, "size": 48, "epochs": 8},
}
MIN_IMAGES, MAX_IMAGES = 100, 1_000_000  # enough to beat the baseline; a demo, not a dataset
SOURCE_SIDE = 96  # the generated files are this many pixels square; pack resizes them
TRAIN_SIDE = 32  # the model sees records downscaled to this on the device: brightness needs no detail
BRIGHTNESS_WEIGHT, EXPOSURE_WEIGHT, LABEL_NOISE = 4.0, 2.0, 0.05
BATCH_SIZE = 32
LEARNING_RATE = 3e-2  # peak of fit's cosine schedule
VAL_FRACTION = 0.1
PASS_RMSE_RATIO = 0.5  # the model must reach at most this share of the predict-the-mean RMSE
#: What the demo's second run augments with: crops and flips (no colour jitter, the label is the brightness).
DEMO_AUGMENT = "crop=0.5,flip"
MONOTONE_TOLERANCE = 1e-6  # floating-point rounding allowed by check_monotone
MONOTONE_CHECK_IMAGES = 128
LOADER_BATCHES = 200  # the most batches each loader is timed over (one epoch at most)
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field")
FILE_PREFIX = "demo_"
#: Written into the folder a demo works in (``--dir``): the folder is the demo's, so a later demo
#: may work in it again, removing only what the demo makes.
DEMO_MARK = ".fastload-demo"
#: What a demo makes in its folder (paths relative to it): its mark, the labels CSV, the store,
#: the images and their folder, and a killed writer's temporary files (the output rule's).
DEMO_FILES = re.compile(
    rf"{re.escape(DEMO_MARK)}|labels\.csv|demo\.fastload|images|images/{FILE_PREFIX}\d{{5}}\.(jpg|bmp)"
    r"|\.(labels\.csv|demo\.fastload)\..*\.fastload-partial"
)


def _sample_photos(source: str = "auto") -> Optional[List[np.ndarray]]:
    """scikit-image's bundled sample photographs; None for textures, or for "auto" when it (or
    Pillow) is missing; "photos" without them is refused, naming the install command."""
    if source == "textures":
        return None
    if source == "photos":
        import_optional("PIL.Image", "fastload demo --images-from photos", "pip install pillow")
        import_optional("skimage.data", "fastload demo --images-from photos", "pip install scikit-image")
    try:
        import PIL.Image  # noqa: F401  (needed to crop, resize and encode)
        import skimage.data
    except ImportError:
        return None
    photos = []
    for name in PHOTOS:
        try:
            photos.append(getattr(skimage.data, name)())
        except Exception:  # a sample that would need a download: use the others
            continue
    return photos or None


def _photo_crop(photo: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image

    height, width = photo.shape[:2]
    side = int(rng.uniform(0.25, 1.0) * min(height, width))
    top, left = rng.integers(0, height - side + 1), rng.integers(0, width - side + 1)
    crop = Image.fromarray(photo[top : top + side, left : left + side])
    if rng.random() < 0.5:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(crop.resize((SOURCE_SIDE, SOURCE_SIDE), Image.Resampling.BILINEAR), dtype=np.float64)


def _texture(rng: np.random.Generator) -> np.ndarray:
    """A smooth random colour field: a few random plane waves and a gradient per channel."""
    y, x = np.mgrid[0:SOURCE_SIDE, 0:SOURCE_SIDE] / SOURCE_SIDE
    channels = []
    for _ in range(3):
        field = rng.uniform(-1, 1) * x + rng.uniform(-1, 1) * y
        for _ in range(4):
            fx, fy, phase = rng.uniform(-8, 8), rng.uniform(-8, 8), rng.uniform(0, 2 * np.pi)
            field = field + rng.uniform(0.2, 0.6) * np.sin(2 * np.pi * (fx * x + fy * y) + phase)
        channels.append(field)
    rgb = np.stack(channels, -1)
    return 255 * (rgb - rgb.min()) / (np.ptp(rgb) + 1e-9)


def _write_bmp(path: Path, rgb: np.ndarray) -> None:
    """A 24-bit BMP (no dependency needed): bottom-up rows of BGR, padded to 4 bytes."""
    height, width = rgb.shape[:2]
    row = width * 3
    padded = (row + 3) & ~3
    pixels = np.zeros((height, padded), dtype=np.uint8)
    pixels[:, :row] = rgb[::-1, :, ::-1].reshape(height, row)
    header = b"BM" + np.array([54 + pixels.size, 0, 54], dtype="<u4").tobytes()
    info = np.array([40, width, height], dtype="<i4").tobytes() + np.array([1, 24], dtype="<u2").tobytes()
    info += np.array([0, pixels.size, 2835, 2835, 0, 0], dtype="<u4").tobytes()
    path.write_bytes(header + info + pixels.tobytes())


def make_photos(
    folder: Path, count: int, seed: int = 0, photos: Optional[List[np.ndarray]] = None
) -> Tuple[List[str], np.ndarray, np.ndarray, str]:
    """Writes ``count`` images into ``folder``, crops of ``photos`` (textures when None);
    returns (file names, labels, exposures, what the images are).

    Each image is a photo crop (or texture) times a random gain, so brightness varies widely;
    the label is computed from the pixels actually written (after JPEG rounding it moves by
    far less than the noise)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    names, brightness = [], np.empty(count)
    for i in range(count):
        base = _photo_crop(photos[i % len(photos)], rng) if photos else _texture(rng)
        pixels = np.clip(base * rng.uniform(0.15, 1.0), 0, 255).astype(np.uint8)
        brightness[i] = pixels.mean() / 255.0
        if photos:
            from PIL import Image

            names.append(f"{FILE_PREFIX}{i:05d}.jpg")
            Image.fromarray(pixels).save(folder / names[-1], quality=90)
        else:
            names.append(f"{FILE_PREFIX}{i:05d}.bmp")
            _write_bmp(folder / names[-1], pixels)
    exposure = rng.uniform(0.0, 1.0, count)
    labels = BRIGHTNESS_WEIGHT * brightness + EXPOSURE_WEIGHT * exposure + rng.normal(0, LABEL_NOISE, count)
    source = "scikit-image sample photos (JPEG)" if photos else "procedural textures (BMP)"
    return names, labels, exposure, source


def claim_folder(root: Path) -> None:
    """Makes ``root`` the demo's folder before anything is written: a new or empty folder is
    marked as the demo's (``DEMO_MARK``); one an earlier demo marked, holding nothing but what
    a demo makes, has its images removed for the new run. Anything else is refused with a
    ValueError naming what the demo did not make: it never removes or replaces a file of the
    user's (a user's ``images/demo_0001.jpg`` or ``labels.csv`` included)."""
    root.mkdir(parents=True, exist_ok=True)
    found = []
    for folder, dirs, files in os.walk(root):  # links are listed, never followed
        found += [Path(folder, name).relative_to(root).as_posix() for name in dirs + files]
    if not found:
        (root / DEMO_MARK).write_text("made by `fastload demo`: everything in this folder is the demo's\n")
        return
    marked = os.path.isfile(root / DEMO_MARK) and not os.path.islink(root / DEMO_MARK)
    # The demo makes no links: one named like its files (images -> a folder of the user's) is
    # foreign too, or the removal below would follow it.
    foreign = sorted(
        p for p in found if not (marked and DEMO_FILES.fullmatch(p) and not os.path.islink(root / p))
    )
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3:,} more" if len(foreign) > 3 else "")
        raise ValueError(
            f"demo folder {root} holds files the demo did not make ({shown}); the demo works only in a "
            "new or empty folder, or one an earlier demo made: give another --dir"
        )
    for old in (root / "images").glob(f"{FILE_PREFIX}*"):  # an earlier demo's, as the check found
        old.unlink()


def _images_per_s(batches: Iterable, max_batches: int) -> float:
    """Steady-state images/s over one epoch of a loader (at most ``max_batches`` batches): the
    first batch (worker start-up, first page faults) is not timed."""
    images, count, start = 0, 0, None
    for batch in batches:
        if start is None:
            start = time.perf_counter()
            continue
        images += len(batch[0])
        count += 1
        if count >= max_batches:
            break
    if not count:
        raise ValueError("the store is too small to time a loader: it holds fewer than two batches")
    return images / (time.perf_counter() - start)


def loader_rates(store_path: Path, batch_size: int) -> Tuple[float, float]:
    """(FastLoadDataset, np.memmap Dataset + DataLoader(num_workers=2)) images/s, random order."""
    from fastload.bench.baselines import MemmapRecords
    from fastload.dataset import FastLoadDataset
    from fastload.store import Store

    fast = _images_per_s(FastLoadDataset(store_path, batch_size), LOADER_BATCHES)
    with Store(store_path) as store:
        records = MemmapRecords(store, np.array(store.labels))
    loader = torch.utils.data.DataLoader(
        records, batch_size=batch_size, shuffle=True, num_workers=2, pin_memory=torch.cuda.is_available()
    )
    return fast, _images_per_s(loader, LOADER_BATCHES)


def _aligned(values: np.ndarray, names: List[str], sources: Optional[List[str]]) -> np.ndarray:
    """``values`` (one per generated file) in the store's record order, as recorded by pack."""
    if sources is None:  # pack writes records in sorted path order
        sources = sorted(names)
    position = {name: i for i, name in enumerate(names)}
    return values[[position[Path(s).name] for s in sources]]


def run(
    workdir: Optional[str] = None,
    images: Optional[int] = None,
    size: Optional[int] = None,
    epochs: Optional[int] = None,
    device: str = "auto",
    quiet: bool = False,
    quick: bool = False,
    seed: int = 0,
    out: Optional[TextIO] = None,
    images_from: str = "auto",
) -> dict:
    """Runs the demo and returns its report; ``report["passed"]`` says whether the model beat
    the baseline clearly and kept its monotonicity guarantee. Works in a temporary directory
    removed at the end, or in ``workdir`` (kept), which must be new, empty or an earlier demo's
    (:func:`claim_folder`: the demo touches only what it made). Prints to ``out`` (default:
    sys.stdout as it is when called). ``images_from`` (one of DEMO_SOURCES) picks the images:
    the sample photos of scikit-image when it is installed ("auto"), or always the procedural
    textures, whose run is the same whatever is installed."""
    from fastload.files import replace_atomically
    from fastload.monotonic import check_monotone
    from fastload.pack import pack
    from fastload.store import Store
    from fastload.train import epoch_logger, fit, option_problem, prepare_images, resolve_device

    out = sys.stdout if out is None else out

    settings = SETTINGS["quick" if quick else "default"]
    images = settings["images"] if images is None else images
    size = settings["size"] if size is None else size
    epochs = settings["epochs"] if epochs is None else epochs
    if not MIN_IMAGES <= images <= MAX_IMAGES:
        raise ValueError(f"images must be between {MIN_IMAGES} and {MAX_IMAGES:,}, not {images}")
    if not 16 <= size <= SOURCE_SIDE:
        raise ValueError(f"size must be between 16 and {SOURCE_SIDE}, not {size}")
    problem = option_problem("seed", seed)  # before any file is written, not when training starts
    if problem:
        raise ValueError(f"seed {problem}")
    if images_from not in DEMO_SOURCES:
        raise ValueError(f"images_from must be one of {', '.join(DEMO_SOURCES)}, not {images_from!r}")
    resolved = resolve_device(device)
    photos = _sample_photos(images_from)  # refused before any file is written

    def say(line: str) -> None:
        if not quiet:
            print(line, file=out, flush=True)

    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="fastload-demo-")) if workdir is None else Path(workdir)
    try:
        claim_folder(root)
        folder = root / "images"
        say(
            f"fastload demo in {root}: {images:,} images, {size}x{size} records, {epochs} epochs on {resolved}"
        )
        names, labels, exposure, source = make_photos(folder, images, seed, photos)
        labels_csv = root / "labels.csv"
        rows = io.StringIO()
        csv.writer(rows).writerows(zip(names, labels.tolist()))
        with replace_atomically(labels_csv, "labels CSV") as f:
            f.write(rows.getvalue().encode("utf-8"))
        say(
            f"  wrote {images:,} {source}; label = {BRIGHTNESS_WEIGHT:g} x brightness + "
            f"{EXPOSURE_WEIGHT:g} x exposure + noise (sd {LABEL_NOISE:g})"
        )

        store_path = root / "demo.fastload"
        packed = pack(
            folder,
            store_path,
            size=size,
            labels=labels_csv,
            label_dtype="float64",
            overwrite=True,
            quiet=True,
        )
        if packed.records != images:
            raise RuntimeError(f"pack wrote {packed.records} records for {images} images: {packed.skipped}")
        with Store(store_path) as store:
            exposure = _aligned(exposure, names, store.meta.get("sources"))

        fast_rate, recipe_rate = loader_rates(store_path, BATCH_SIZE)
        training = dict(
            val_fraction=VAL_FRACTION,
            epochs=epochs,
            batch_size=BATCH_SIZE,
            lr=LEARNING_RATE,
            device=resolved,
            seed=seed,
            monotone_inputs=exposure,
            size=min(size, TRAIN_SIDE),
            threads=1 if resolved.type == "cpu" else None,
        )
        result = fit(
            store_path,
            **training,
            log=None if quiet else epoch_logger(stream=out),
            progress=False if quiet else None,
        )
        # The same run with crops and flips on the device (no colour jitter: the label is the
        # photo's brightness), to show what augmentation does to the validation error.
        augmented = fit(store_path, **training, augment=DEMO_AUGMENT, progress=False)
        last = result.history[-1]
        seconds = sum(m["seconds"] for m in result.history)
        wait = sum(m["data_wait_fraction"] * m["seconds"] for m in result.history) / seconds

        check = np.sort(result.val_indices)[:MONOTONE_CHECK_IMAGES]
        with Store(store_path) as store:
            check_images, _ = store.gather(check)
        violation = check_monotone(
            result.model,
            prepare_images(torch.from_numpy(check_images), result.config, resolved),
            torch.from_numpy(exposure[check, None].astype(np.float32)).to(resolved),
        )
        report = {
            "images": images,
            "size": size,
            "epochs": epochs,
            "device": str(resolved),
            "source": source,
            "pack_seconds": packed.seconds,
            "pack_images_per_s": packed.files_per_second,
            "pack_mb_per_s": packed.mb_per_second,
            "loader_images_per_s": fast_rate,
            "memmap_dataloader_images_per_s": recipe_rate,
            "loader_speedup": fast_rate / recipe_rate,
            "train_images_per_s": sum(m["images_per_s"] * m["seconds"] for m in result.history) / seconds,
            "data_wait_fraction": wait,
            "val_rmse": last["val_rmse"],
            "val_mae": last["val_mae"],
            "baseline_rmse": result.baseline_rmse,
            "augment": DEMO_AUGMENT,
            "augmented_val_rmse": augmented.history[-1]["val_rmse"],
            "rmse_ratio": last["val_rmse"] / result.baseline_rmse,
            "monotonicity_violation": violation,
            "monotonicity_tolerance": MONOTONE_TOLERANCE,
        }
        report["beats_baseline"] = report["rmse_ratio"] <= PASS_RMSE_RATIO
        report["monotone"] = violation <= MONOTONE_TOLERANCE
        report["problems"] = [
            problem
            for ok, problem in (
                (
                    report["beats_baseline"],
                    f"the model's validation RMSE is {report['rmse_ratio']:.2f}x the predict-the-mean "
                    f"baseline; a model that learned the task reaches <= {PASS_RMSE_RATIO}x",
                ),
                (
                    report["monotone"],
                    f"the prediction decreased by {violation:.3g} as exposure rose "
                    f"(tolerance {MONOTONE_TOLERANCE:g}): the monotonicity guarantee is broken",
                ),
            )
            if not ok
        ]
        report["passed"] = not report["problems"]
        report["seconds"] = time.perf_counter() - started
        say(format_report(report))
        return report
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)


def format_report(report: dict) -> str:
    """The demo's printed summary."""
    verdict = {True: "PASS", False: "FAIL"}
    return "\n".join(
        [
            "",
            f"pack          {report['images']:,} images in {report['pack_seconds']:.2f} s: "
            f"{report['pack_images_per_s']:,.0f} images/s, {report['pack_mb_per_s']:,.1f} MB/s "
            f"(decode + resize to {report['size']}x{report['size']} in Rust)",
            f"loader        FastLoadDataset {report['loader_images_per_s']:,.0f} images/s; np.memmap + "
            f"DataLoader(num_workers=2) {report['memmap_dataloader_images_per_s']:,.0f} images/s "
            f"({report['loader_speedup']:.1f}x)",
            f"training      {report['epochs']} epochs on {report['device']}: {report['train_images_per_s']:,.0f} images/s, "
            f"waiting for data {100 * report['data_wait_fraction']:.1f}% of the time",
            f"validation    RMSE {report['val_rmse']:.4f} vs {report['baseline_rmse']:.4f} predicting the mean "
            f"({report['rmse_ratio']:.2f}x; needs <= {PASS_RMSE_RATIO}x)  {verdict[report['beats_baseline']]}",
            f"augmented     the same training with --augment {report['augment']}: validation RMSE "
            f"{report['augmented_val_rmse']:.4f} (without: {report['val_rmse']:.4f})",
            f"monotonicity  worst decrease as exposure rises {report['monotonicity_violation']:.3g} "
            f"(tolerance {report['monotonicity_tolerance']:g})  {verdict[report['monotone']]}",
            f"total         {report['seconds']:.0f} s: " + ("passed" if report["passed"] else "FAILED"),
        ]
    )


__all__ = ["format_report", "loader_rates", "make_photos", "run"]
