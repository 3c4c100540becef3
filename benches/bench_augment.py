"""Benchmark of batch augmentation with `fastload.Augment` against the usual PyTorch recipe.

The same ops on the same 384x384 uint8 images, batch 64: random resized crop to 224 (scale
0.08-1), horizontal flip (p 0.5), brightness/contrast/saturation jitter 0.4, conversion to
float32 and ImageNet normalisation. Timed, alternating, median of `--repeats` rounds of
`--batches` batches each:

- fastload: FastLoadDataset(return_indices=True) over a store, then
  to_device(images, DEVICE, augment=..., keys=..., epoch=...) on the whole batch;
- fastload, augment only: the same call on a uint8 batch already in memory;
- torchvision v2 per sample (RandomResizedCrop antialiased, RandomHorizontalFlip,
  ColorJitter, ToDtype, Normalize) in a Dataset over the same store, DataLoader(batch_size=64,
  num_workers=--workers, persistent), the recipe fastload replaces (if torchvision is
  installed);
- kornia.augmentation on the float batch (if kornia is installed): batched, per-sample
  parameters, from a generator.

Prints batches/s per method and fastload's ratio to each. With `--split`, instead: the CPU time
per batch of the native CPU kernel (`_core.augment`, what to_device runs for float32 on the
CPU) on the same crops and flips, with the colour steps added one at a time, into a reused
output and into a fresh one (whose page faults count too), on `FASTLOAD_NUM_THREADS` threads.
With `--convert`: to_device's plain float32 conversion on the CPU (no augmentation; the kernel
into recycled memory) against the torch formula it replaced, alternating, batch 64 at 224 and 384.

    python benches/bench_augment.py [--images 256] [--batches 16] [--repeats 5] [--device cpu] [--threads N]
    python benches/bench_augment.py --split [--repeats 5]
    python benches/bench_augment.py --convert [--repeats 21]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fastload import Augment, FastLoadDataset, Store, StoreWriter, to_device

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIDE, CROP, BATCH = 384, 224, 64


def photo_like(count: int, seed: int = 0) -> np.ndarray:
    """count × 384 × 384 × 3 uint8 images with smooth structure and noise (content does not
    change the speed of these ops, only their size does)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    out = np.empty((count, SIDE, SIDE, 3), dtype=np.uint8)
    for i in range(count):
        f = rng.uniform(2, 12, 3)
        base = np.stack([np.sin(f[k] * xx + k) * np.cos(f[(k + 1) % 3] * yy) for k in range(3)], axis=-1)
        out[i] = (127 + 90 * base + rng.normal(0, 10, base.shape)).clip(0, 255).astype(np.uint8)
    return out


class TorchvisionRecipe(Dataset):
    """Per-sample torchvision v2 transforms over the store's images, as a DataLoader recipe."""

    def __init__(self, path: str, length: int):
        from torchvision.transforms import v2

        self.path, self.length, self.store = path, length, None
        self.transform = v2.Compose(
            [
                v2.RandomResizedCrop(CROP, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ColorJitter(0.4, 0.4, 0.4),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(MEAN, STD),
            ]
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        if self.store is None:  # opened in the worker, not pickled
            self.store = Store(self.path)
        image, label = self.store[i % len(self.store)]
        return self.transform(torch.from_numpy(np.array(image)).permute(2, 0, 1)), int(label)


def rounds(methods: dict, repeats: int) -> dict:
    """Runs every method once per round, alternating; returns its batches/s per round."""
    rates = {name: [] for name in methods}
    for _ in range(repeats):
        for name, run in methods.items():
            start = time.perf_counter()
            batches = run()
            rates[name].append(batches / (time.perf_counter() - start))
    return rates


def kernel_split(repeats: int) -> None:
    """CPU and wall ms per batch of `_core.augment` by what it is asked to do (medians of
    `repeats`)."""
    from fastload import _core

    aug = Augment(size=CROP, scale=(0.08, 1.0), hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4)
    images = photo_like(BATCH)
    draws = aug.params(torch.arange(BATCH), 0, SIDE, SIDE)
    theta = aug._theta(draws, SIDE, SIDE, CROP, CROP).numpy()
    factors = torch.stack([draws["brightness"], draws["contrast"], draws["saturation"]], dim=1).numpy()
    scale = (1 / (255 * np.array(STD))).astype(np.float32)
    shift = (np.array(MEAN) / np.array(STD)).astype(np.float32)
    reused = np.empty((BATCH, CROP, CROP, 3), np.float32)
    cases = {
        "sampling + normalisation (factors 1)": np.ones_like(factors),
        "+ brightness and saturation (one pass)": np.where([True, False, True], factors, np.float32(1)),
        "+ contrast (the second pass): all of the bench's ops": factors,
    }
    print(f"_core.augment, batch {BATCH}, {SIDE}x{SIDE} -> {CROP}x{CROP}, {_core.num_threads()} threads")
    for name, colour in cases.items():
        for fresh in (False, True):
            cpu, wall = [], []
            for _ in range(repeats):
                start, start_wall = time.process_time(), time.perf_counter()
                out = np.empty_like(reused) if fresh else reused
                _core.augment(images, theta, colour, scale, shift, out)
                cpu.append(time.process_time() - start)
                wall.append(time.perf_counter() - start_wall)
            label = "fresh output" if fresh else "reused output"
            print(
                f"{name:<54} {label:<14} {1000 * statistics.median(cpu):6.1f} ms CPU "
                f"{1000 * statistics.median(wall):6.1f} ms wall"
            )


def conversion(repeats: int) -> None:
    """ms per batch of to_device(images, "cpu", mean, std) against `x.float() * scale - shift` in
    torch (what it ran before), alternating in this process, medians of `repeats`."""
    import fastload.device

    for side in (CROP, SIDE):
        images = torch.from_numpy(photo_like(BATCH)[:, :side, :side].copy())
        scale, shift = fastload.device._normalization(torch.device("cpu"), torch.float32, MEAN, STD)
        methods = {
            "torch formula": lambda x=images, a=scale, b=shift: x.permute(0, 3, 1, 2).float().mul_(a).sub_(b),
            "to_device": lambda x=images: to_device(x, "cpu", mean=MEAN, std=STD),
        }
        times = {name: [] for name in methods}
        for _ in range(repeats):
            for name, convert in methods.items():
                start = time.perf_counter()
                x = convert()
                times[name].append(time.perf_counter() - start)
                del x  # as a training loop drops its last batch
        ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
        print(
            f"batch {BATCH} of {side}x{side}x3, {torch.get_num_threads()} torch threads, "
            f"{os.cpu_count()} CPUs: torch formula {ms['torch formula']:.1f} ms, to_device "
            f"{ms['to_device']:.1f} ms, {ms['torch formula'] / ms['to_device']:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256, help="records in the store (default 256)")
    parser.add_argument("--batches", type=int, default=16, help="batches per round (default 16)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; figures are medians (default 5)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of the torchvision recipe")
    parser.add_argument("--device", default="cpu", help="where fastload and kornia augment (default cpu)")
    parser.add_argument("--threads", type=int, help="torch threads of this process (default: torch's choice)")
    parser.add_argument("--split", action="store_true", help="time the CPU kernel's parts instead")
    parser.add_argument(
        "--convert", action="store_true", help="time to_device's plain CPU conversion instead"
    )
    args = parser.parse_args()
    if args.split:
        kernel_split(args.repeats)
        return
    if args.convert:
        conversion(args.repeats)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    aug = Augment(size=CROP, scale=(0.08, 1.0), hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4)
    mean, std = torch.tensor(MEAN, device=args.device), torch.tensor(STD, device=args.device)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.store")
        with StoreWriter(path, (SIDE, SIDE, 3), label_dtype="int64") as writer:
            writer.extend(photo_like(args.images), np.arange(args.images))
        ds = FastLoadDataset(path, BATCH, return_indices=True, drop_last=True)
        state = {"epoch": 0}

        def fastload_loop() -> int:
            done = 0
            while done < args.batches:
                for images, _, keys in ds:
                    x = to_device(
                        images, args.device, mean=MEAN, std=STD, augment=aug, keys=keys, epoch=state["epoch"]
                    )
                    done += 1
                    if done == args.batches:
                        break
                state["epoch"] += 1
            if x.device.type == "cuda":
                torch.cuda.synchronize()
            return done

        batch = torch.from_numpy(Store(path).gather(np.arange(BATCH))[0]).to(args.device)

        def augment_only() -> int:
            for step in range(args.batches):
                x = to_device(
                    batch,
                    args.device,
                    mean=MEAN,
                    std=STD,
                    augment=aug,
                    keys=torch.arange(BATCH) + step,
                    epoch=0,
                )
            if x.device.type == "cuda":
                torch.cuda.synchronize()
            return args.batches

        methods = {
            "fastload (FastLoadDataset + to_device augment)": fastload_loop,
            "fastload augment only": augment_only,
        }
        notes = []
        try:
            recipe = TorchvisionRecipe(path, args.batches * BATCH)
            loader = DataLoader(
                recipe, batch_size=BATCH, num_workers=args.workers, persistent_workers=args.workers > 0
            )

            def torchvision_loop() -> int:
                return sum(1 for _ in loader)

            methods[f"torchvision v2 per sample, DataLoader({args.workers} workers)"] = torchvision_loop
        except ImportError:
            notes.append("torchvision not installed: its recipe was not measured")
        try:
            import kornia.augmentation as K

            kornia_aug = K.AugmentationSequential(
                K.RandomResizedCrop((CROP, CROP), scale=(0.08, 1.0)),
                K.RandomHorizontalFlip(),
                K.ColorJitter(0.4, 0.4, 0.4, p=1.0),
            )

            def kornia_loop() -> int:
                for _ in range(args.batches):
                    x = batch.permute(0, 3, 1, 2).float().div_(255)
                    x = (kornia_aug(x) - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
                if x.device.type == "cuda":
                    torch.cuda.synchronize()
                return args.batches

            methods["kornia.augmentation on the batch"] = kornia_loop
        except ImportError:
            notes.append("kornia not installed: not measured")

        rounds(methods, 1)  # warm-up: workers start, caches fill
        rates = rounds(methods, args.repeats)

    medians = {name: statistics.median(r) for name, r in rates.items()}
    ours = medians["fastload (FastLoadDataset + to_device augment)"]
    print(
        f"batch {BATCH}, {SIDE}x{SIDE} -> {CROP}x{CROP} crop + flip + jitter + normalise, device {args.device}, "
        f"{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}; median of {args.repeats} rounds of {args.batches} batches"
    )
    print(f"{'method':<58} {'batches/s':>10} {'img/s':>8} {'fastload / it':>14}")
    for name, value in medians.items():
        print(f"{name:<58} {value:>10.2f} {value * BATCH:>8.0f} {ours / value:>13.2f}x")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
