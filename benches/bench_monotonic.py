"""Monotone layers against pytorch-lattice: forward+backward speed, and training robustness to lr.

``python benches/bench_monotonic.py speed``: median seconds of one forward+backward pass at batch
4096 on one CPU thread, fastload and pytorch-lattice (if installed) side by side, for a 4-D
lattice, a rank-4 ensemble of size-2 lattices and 16 calibrators.
``python benches/bench_monotonic.py lr``: test RMSE (to the noiseless target) of calibrated lattice
ensembles on an 8-feature tabular task over a 33x range of Adam learning rates, several seeds, and
the share of lattice parameters that get exactly zero gradient after training.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from fastload.monotonic import Lattice, LatticeEnsemble, PWLCalibrator

try:
    from pytorch_lattice.enums import Monotonicity
    from pytorch_lattice.layers import RTL, NumericalCalibrator
    from pytorch_lattice.layers import Lattice as PLLattice
except ImportError:  # the comparison is optional
    RTL = None

BATCH = 4096


class _Calibrators(torch.nn.Module):
    """One calibrator per column, the way a tabular model calibrates its features."""

    def __init__(self, calibrators, dtype=torch.float32):
        super().__init__()
        self.calibrators = torch.nn.ModuleList(calibrators)
        self.dtype = dtype  # pytorch-lattice calibrators hold float64 and need float64 inputs

    def forward(self, x):
        x = x.to(self.dtype)
        return torch.cat([c(x[:, i : i + 1]).reshape(-1, 1) for i, c in enumerate(self.calibrators)], 1)


def _speed_cases():
    """(name, input maker, fastload module, pytorch-lattice module or None)."""
    mono4 = [1, 1, 0, 0]
    mono16 = [1] * 8 + [0] * 8
    keypoints = torch.linspace(0.0, 1.0, 10)
    cases = [
        (
            "lattice 4-D, size 3",
            lambda g: 2 * torch.rand(BATCH, 4, generator=g),
            Lattice([3] * 4, mono4),
            lambda: PLLattice([3] * 4, monotonicities=[_pl(m) for m in mono4]),
        ),
        (
            "ensemble 16 inputs, 8 lattices rank 4 size 2",
            lambda g: torch.rand(BATCH, 16, generator=g),
            LatticeEnsemble(16, 4, 8, 2, mono16),
            lambda: RTL([_pl(m) for m in mono16], 8, 4, 2, average_outputs=True),
        ),
        (
            "16 calibrators, 10 keypoints, bounded",
            lambda g: torch.rand(BATCH, 16, generator=g),
            _Calibrators([PWLCalibrator(10, 0.0, 1.0, 1, 0.0, 1.0) for _ in range(16)]),
            lambda: _Calibrators(
                [
                    NumericalCalibrator(
                        keypoints.numpy(),
                        output_min=0.0,
                        output_max=1.0,
                        monotonicity=Monotonicity.INCREASING,
                    )
                    for _ in range(16)
                ],
                torch.float64,
            ),
        ),
    ]
    return [(name, make, ours, theirs() if RTL is not None else None) for name, make, ours, theirs in cases]


def _pl(monotonicity: int):
    return Monotonicity.INCREASING if monotonicity == 1 else None


def _step(module, x) -> float:
    start = time.perf_counter()
    module.zero_grad(set_to_none=True)
    module(x).sum().backward()
    return time.perf_counter() - start


def speed(repeats: int) -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    if RTL is None:
        print("pytorch-lattice is not installed: fastload figures only")
    print(f"forward+backward, batch {BATCH}, 1 thread, median of {repeats} (ms)")
    print("| case | fastload | pytorch-lattice | fastload / pytorch-lattice |")
    print("|---|---:|---:|---:|")
    for name, make, ours, theirs in _speed_cases():
        x = make(generator)
        modules = [ours] if theirs is None else [ours, theirs]
        times = [[] for _ in modules]
        for repeat in range(repeats + 3):  # interleaved, so a busy machine slows both alike
            for module, spent in zip(modules, times):
                seconds = _step(module, x)
                if repeat >= 3:  # warm-up
                    spent.append(seconds)
        mine, *other = [statistics.median(spent) for spent in times]
        if not other:
            print(f"| {name} | {1e3 * mine:.2f} | - | - |")
            continue
        print(f"| {name} | {1e3 * mine:.2f} | {1e3 * other[0]:.2f} | {mine / other[0]:.2f}x |")


# The tabular task: features 0-2 increasing, 3 decreasing, 4-7 free.
TABULAR_MONOTONICITIES = [1, 1, 1, -1, 0, 0, 0, 0]
LEARNING_RATES = [3e-3, 1e-2, 3e-2, 1e-1]


def tabular_task(n: int, seed: int):
    """(features (n, 8) in [0, 1], noisy labels, noiseless target)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 8, generator=generator)
    target = (
        1.5 * x[:, 0]
        + x[:, 1] ** 2
        + torch.log1p(4 * x[:, 2])
        - 1.2 * x[:, 3]
        + 0.5 * torch.sin(6 * x[:, 4])
        + x[:, 5] * x[:, 6]
        + 0.3 * torch.cos(4 * x[:, 7])
    )
    return x, target + 0.1 * torch.randn(n, generator=generator), target


class CalibratedEnsemble(torch.nn.Module):
    """A calibrator per feature into a lattice ensemble (rank 4, size 3), unbounded output."""

    def __init__(self, monotonicities, seed: int):
        super().__init__()
        self.calibrators = torch.nn.ModuleList(
            PWLCalibrator(10, 0.0, 1.0, m, 0.0, 2.0) for m in monotonicities
        )
        count = math.ceil(2 * len(monotonicities) / 4)
        self.lattice = LatticeEnsemble(
            len(monotonicities), 4, count, 3, [abs(m) for m in monotonicities], seed
        )

    def forward(self, x):
        return self.lattice(torch.stack([c(x[:, i]) for i, c in enumerate(self.calibrators)], 1))


def train_tabular(lr: float, seed: int, epochs: int = 40, batch: int = 128):
    """(test RMSE to the noiseless target, share of lattice parameters with zero gradient)."""
    torch.manual_seed(seed)
    x, y, _ = tabular_task(2000, seed)
    x_test, _, truth = tabular_task(2000, seed + 1000)
    model = CalibratedEnsemble(TABULAR_MONOTONICITIES, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for rows in torch.randperm(len(x), generator=generator).split(batch):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
            optimizer.step()
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    dead = (model.lattice.bank.raw.grad == 0).float().mean().item()
    with torch.no_grad():
        rmse = (model(x_test) - truth).pow(2).mean().sqrt().item()
    return rmse, dead


def lr_sweep(seeds: int, epochs: int) -> None:
    torch.set_num_threads(1)
    print(f"8-feature tabular task, Adam, {epochs} epochs, median over {seeds} seeds")
    print("| lr | test RMSE (median) | per seed | zero-gradient lattice parameters |")
    print("|---:|---:|---|---:|")
    medians = []
    for lr in LEARNING_RATES:
        runs = [train_tabular(lr, seed, epochs) for seed in range(seeds)]
        median = statistics.median(r for r, _ in runs)
        medians.append(median)
        per_seed = ", ".join(f"{r:.3f}" for r, _ in runs)
        dead = statistics.median(d for _, d in runs)
        print(f"| {lr:g} | {median:.3f} | {per_seed} | {100 * dead:.0f}% |")
    best = min(medians)
    for low in range(len(LEARNING_RATES)):
        for high in range(low + 1, len(LEARNING_RATES)):
            if LEARNING_RATES[high] / LEARNING_RATES[low] >= 9.99:
                worst = max(medians[low : high + 1])
                print(
                    f"lr {LEARNING_RATES[low]:g}-{LEARNING_RATES[high]:g}: worst median RMSE "
                    f"{worst / best:.2f}x the best ({'within' if worst <= 1.5 * best else 'NOT within'} 1.5x)"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["speed", "lr"])
    parser.add_argument("--repeats", type=int, default=30, help="speed: timed passes per case")
    parser.add_argument("--seeds", type=int, default=3, help="lr: training runs per learning rate")
    parser.add_argument("--epochs", type=int, default=40, help="lr: epochs per training run")
    args = parser.parse_args()
    if args.what == "speed":
        speed(args.repeats)
    else:
        lr_sweep(args.seeds, args.epochs)


if __name__ == "__main__":
    main()
