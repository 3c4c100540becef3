"""Monotone layers against pytorch-lattice: forward+backward speed, and training robustness to lr.

``python benches/bench_monotonic.py speed``: median seconds of one forward+backward pass at batch
4096 on one CPU thread, fastload and pytorch-lattice (if installed) side by side, for a 4-D
lattice, a rank-4 ensemble of size-2 lattices and 16 calibrators.
``python benches/bench_monotonic.py lr``: test RMSE of a calibrated lattice ensemble on an
8-feature tabular task over a 30x range of learning rates, several seeds.
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["speed"])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    speed(args.repeats)


if __name__ == "__main__":
    main()
