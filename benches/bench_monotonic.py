"""Monotone models against pytorch-lattice and sklearn: speed, robustness to lr, accuracy table.

``python benches/bench_monotonic.py speed``: median seconds of one forward+backward pass at batch
4096 on one CPU thread, fastload and pytorch-lattice (if installed) side by side, for a 4-D
lattice, a rank-4 ensemble of size-2 lattices and 16 calibrators.
``python benches/bench_monotonic.py lr``: test RMSE (to the noiseless target) of calibrated lattice
ensembles on an 8-feature tabular task over a 100x range of Adam learning rates, several seeds, and
the share of lattice parameters that get exactly zero gradient after training.
``python benches/bench_monotonic.py table``: fastload (its layers, and its LatticeRegressor),
pytorch-lattice, sklearn's IsotonicRegression and HistGradientBoostingRegressor(monotonic_cst) on the
same data (1-D step, sigmoid and log curves at n = 200, 2,000, 20,000; the 8-feature task), several
seeds: test RMSE, fit time and the worst decrease along monotone inputs on grid lines and random
pairs (budget rules above ``CURVES``).
``--quick`` is the smoke test ``tests/benches/test_bench_monotonic.py`` runs. Missing optional packages
leave their methods out.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import statistics
import time
from typing import Callable, Dict, List, Tuple

import numpy as np
import torch

from fastload.monotonic import Lattice, LatticeEnsemble, LatticeRegressor, PWLCalibrator

try:
    from pytorch_lattice.enums import Monotonicity
    from pytorch_lattice.layers import RTL, NumericalCalibrator
    from pytorch_lattice.layers import Lattice as PLLattice
except ImportError:  # the comparison is optional
    RTL = None

try:
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.isotonic import IsotonicRegression
    from threadpoolctl import threadpool_limits
except ImportError:
    HistGradientBoostingRegressor = threadpool_limits = None

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
LEARNING_RATES = [3e-3, 1e-2, 3e-2, 1e-1, 3e-1]


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


def fit_torch(model, x, y, seed: int, epochs: int, lr: float, batch: int = 128, after_step=None) -> None:
    """Adam on the mean squared error, reshuffled minibatches from ``seed``; ``after_step`` runs
    after every optimizer step (pytorch-lattice's projection onto its constraints)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for rows in torch.randperm(len(x), generator=generator).split(batch):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x[rows]).reshape(-1), y[rows]).backward()
            optimizer.step()
            if after_step is not None:
                after_step()


def train_tabular(lr: float, seed: int, epochs: int = 40, batch: int = 128):
    """(test RMSE to the noiseless target, share of lattice parameters with zero gradient)."""
    torch.manual_seed(seed)
    x, y, _ = tabular_task(2000, seed)
    x_test, _, truth = tabular_task(2000, seed + 1000)
    model = CalibratedEnsemble(TABULAR_MONOTONICITIES, seed)
    fit_torch(model, x, y, seed, epochs, lr, batch)
    model.zero_grad()
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


# The comparison table (issue #18). Budget rules, the same for every method and fixed before any
# run (nothing is tuned on the test set): the gradient-trained models (fastload's layers and its
# LatticeRegressor, pytorch-lattice) take whole epochs of Adam at lr 1e-2 (--lr sets all three) on
# minibatches of 128 until at least STEPS steps, which is the lr sweep's 100 epochs at n = 2,000;
# for the layers and pytorch-lattice, 1-D models are one calibrator of CURVE_KEYPOINTS keypoints
# on [0, 1] (increasing); the 8-D models are a calibrator per feature (10 keypoints onto [0, 2]) into a lattice ensemble of 4 lattices of rank 4 and size 3
# (CalibratedEnsemble; for pytorch-lattice its NumericalCalibrator and RTL layers, projected with
# apply_constraints after every step, as its docs train). LatticeRegressor builds its own model
# from a user's arguments instead (fit_lattice_regressor says which). fastload computes in float32,
# pytorch-lattice in float64. sklearn runs with its defaults: IsotonicRegression (1-D), and
# HistGradientBoostingRegressor with monotonic_cst and random_state = seed.
CURVES = {
    "step": lambda x: (x > 0.4).double(),
    "sigmoid": lambda x: torch.sigmoid(12 * (x - 0.5)),
    "log": lambda x: torch.log1p(9 * x) / math.log(10),
}
CURVE_NOISE = 0.1
CURVE_KEYPOINTS = 20
LR, STEPS, BATCH_ROWS = 1e-2, 1600, 128
TEST_ROWS = 10_000
# Monotonicity is measured over the data's [0, 1] widened on both sides, where models clamp.
DOMAIN = (-0.1, 1.1)


@dataclasses.dataclass(frozen=True)
class Budget:
    seeds: int
    curve_sizes: Tuple[int, ...]
    tabular_size: int
    steps: int
    grid_points: int  # per grid line
    grid_lines: int  # random base points per monotone input (8-D)
    pairs: int  # random pairs per monotone input
    lr: float = LR


FULL = Budget(
    seeds=3,
    curve_sizes=(200, 2_000, 20_000),
    tabular_size=2_000,
    steps=STEPS,
    grid_points=1_001,
    grid_lines=100,
    pairs=20_000,
)
QUICK = Budget(
    seeds=1, curve_sizes=(200,), tabular_size=200, steps=20, grid_points=101, grid_lines=5, pairs=500
)


def curve_task(name: str, n: int, seed: int):
    """(x (n, 1) uniform on [0, 1], noisy labels, noiseless target), float64 numpy."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=generator, dtype=torch.float64)
    target = CURVES[name](x[:, 0])
    noisy = target + CURVE_NOISE * torch.randn(n, generator=generator, dtype=torch.float64)
    return x.numpy(), noisy.numpy(), target.numpy()


def _epochs(n: int, steps: int) -> int:
    """Whole epochs of BATCH_ROWS until at least ``steps`` optimizer steps."""
    return math.ceil(steps / math.ceil(n / BATCH_ROWS))


def _torch_predictor(model, dtype):
    @torch.no_grad()
    def predict(x):
        return model(torch.as_tensor(x, dtype=dtype)).reshape(-1).double().numpy()

    return predict


def fit_fastload(x, y, monotonicities, seed: int, steps: int = STEPS, lr: float = LR):
    """The table's fastload model built from the layers, trained; returns predict(x) -> float64 array."""
    torch.manual_seed(seed)
    if x.shape[1] == 1:
        model = PWLCalibrator(CURVE_KEYPOINTS, 0.0, 1.0, monotonicities[0])
    else:
        model = CalibratedEnsemble(monotonicities, seed)
    inputs, labels = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    fit_torch(model, inputs, labels, seed, _epochs(len(x), steps), lr, BATCH_ROWS)
    return _torch_predictor(model, torch.float32)


def fit_lattice_regressor(x, y, monotonicities, seed: int, steps: int = STEPS, lr: float = LR):
    """fastload's estimator as a user would call it: its own keypoints (10 per feature, placed by the data and the target),
    standardized targets, a lattice of size 3 (an ensemble past 4 features). Minibatches of
    BATCH_ROWS over all rows (no validation split) for ``_epochs`` epochs: the same Adam steps as
    the layers' row (``solver="adam"``; the estimator's default is L-BFGS over all rows)."""
    model = LatticeRegressor(
        features={j: {1: "increasing", -1: "decreasing"}[m] for j, m in enumerate(monotonicities) if m},
        lattice_size=3,
        num_keypoints=10,
        solver="adam",
        max_iter=_epochs(len(x), steps),
        batch_size=BATCH_ROWS,
        learning_rate=lr,
        random_state=seed,
    ).fit(x, y)
    return model.predict


class _PLModel(torch.nn.Module):
    """pytorch-lattice's counterpart of CalibratedEnsemble (or a lone calibrator for 1-D)."""

    def __init__(self, monotonicities, seed: int):
        super().__init__()
        directions = {1: Monotonicity.INCREASING, -1: Monotonicity.DECREASING, 0: None}
        if len(monotonicities) == 1:
            self.calibrators = _Calibrators(
                [
                    NumericalCalibrator(
                        np.linspace(0.0, 1.0, CURVE_KEYPOINTS), monotonicity=directions[monotonicities[0]]
                    )
                ],
                torch.float64,
            )
            self.rtl = None
            return
        self.calibrators = _Calibrators(
            [
                NumericalCalibrator(
                    np.linspace(0.0, 1.0, 10), output_min=0.0, output_max=2.0, monotonicity=directions[m]
                )
                for m in monotonicities
            ],
            torch.float64,
        )
        count = math.ceil(2 * len(monotonicities) / 4)
        self.rtl = RTL(
            [_pl(abs(m)) for m in monotonicities], count, 4, 3, average_outputs=True, random_seed=seed
        )
        # RTL keeps its lattices in a plain dict, so they are not submodules: register them, or
        # parameters() (hence the optimizer) would miss every lattice value.
        self.lattices = torch.nn.ModuleList(lattice for lattice, _ in self.rtl._lattice_layers.values())

    def forward(self, x):
        calibrated = self.calibrators(x)
        return calibrated if self.rtl is None else self.rtl(calibrated)

    def apply_constraints(self):
        for calibrator in self.calibrators.calibrators:
            calibrator.apply_constraints()
        if self.rtl is not None:
            self.rtl.apply_constraints()


def fit_pytorch_lattice(x, y, monotonicities, seed: int, steps: int = STEPS, lr: float = LR):
    torch.manual_seed(seed)
    model = _PLModel(monotonicities, seed)
    inputs, labels = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    fit_torch(model, inputs, labels, seed, _epochs(len(x), steps), lr, BATCH_ROWS, model.apply_constraints)
    return _torch_predictor(model, torch.float64)


def fit_isotonic(x, y, monotonicities, seed: int, steps: int = STEPS, lr: float = LR):
    model = IsotonicRegression(increasing=monotonicities[0] == 1, out_of_bounds="clip").fit(x[:, 0], y)
    return lambda x: model.predict(x[:, 0])


def fit_gradient_boosting(x, y, monotonicities, seed: int, steps: int = STEPS, lr: float = LR):
    model = HistGradientBoostingRegressor(monotonic_cst=list(monotonicities), random_state=seed).fit(x, y)
    return model.predict


def methods(dimensions: int) -> Dict[str, Callable]:
    """The installed methods that fit inputs of this many dimensions, by name."""
    found = {"fastload": fit_fastload, "fastload LatticeRegressor": fit_lattice_regressor}
    if RTL is not None:
        found["pytorch-lattice"] = fit_pytorch_lattice
    if HistGradientBoostingRegressor is not None:
        if dimensions == 1:
            found["sklearn isotonic"] = fit_isotonic
        found["sklearn HGB monotonic_cst"] = fit_gradient_boosting
    return found


def worst_decrease(predict, monotonicities, budget: Budget, seed: int = 0) -> Tuple[float, float]:
    """Largest decrease of ``predict`` along any monotone input, in its declared direction (an
    increase for -1): (between neighbours on grid lines, between random pairs differing only in
    that input). Grid lines run over DOMAIN through random base points (one for 1-D); 0.0 when
    monotone. fastload's check_monotone sweeps torch modules only, upward only, on grids only.
    Raises ValueError on a NaN or infinite prediction, which would compare as no decrease."""
    rng = np.random.default_rng(seed)

    def finite(x):
        outputs = predict(x)
        if not np.isfinite(outputs).all():
            raise ValueError(
                "worst_decrease: a prediction is NaN or infinite; monotonicity cannot be measured"
            )
        return outputs

    grid = np.linspace(*DOMAIN, budget.grid_points)
    lines = 1 if len(monotonicities) == 1 else budget.grid_lines
    worst_grid = worst_pairs = 0.0
    for j, sign in enumerate(monotonicities):
        if not sign:
            continue
        swept = np.repeat(rng.uniform(0.0, 1.0, (lines, len(monotonicities))), len(grid), 0)
        swept[:, j] = np.tile(grid, lines)
        outputs = sign * finite(swept).reshape(lines, len(grid))
        worst_grid = max(worst_grid, float((outputs[:, :-1] - outputs[:, 1:]).max()))
        low = rng.uniform(0.0, 1.0, (budget.pairs, len(monotonicities)))
        high = low.copy()
        ends = np.sort(rng.uniform(*DOMAIN, (budget.pairs, 2)), 1)
        low[:, j], high[:, j] = ends[:, 0], ends[:, 1]
        worst_pairs = max(worst_pairs, float((sign * (finite(low) - finite(high))).max()))
    return worst_grid, worst_pairs


@dataclasses.dataclass
class Row:
    task: str
    n: int
    method: str
    rmses: List[float]
    seconds: List[float]
    worst_grid: float  # the largest over seeds
    worst_pairs: float


def _tasks(budget: Budget):
    """(task name, n, monotonicities, data(seed) -> (x, y, x_test, truth))."""
    for name in CURVES:
        for n in budget.curve_sizes:
            yield (
                name,
                n,
                [1],
                lambda seed, name=name, n=n: (
                    *curve_task(name, n, seed)[:2],
                    *curve_task(name, TEST_ROWS, seed + 1000)[::2],
                ),
            )

    def tabular(seed):
        x, y, _ = tabular_task(budget.tabular_size, seed)
        x_test, _, truth = tabular_task(TEST_ROWS, seed + 1000)
        return x.double().numpy(), y.double().numpy(), x_test.double().numpy(), truth.double().numpy()

    yield "tabular 8-D", budget.tabular_size, TABULAR_MONOTONICITIES, tabular


def table_rows(budget: Budget) -> List[Row]:
    """Every (task, n, method) of the table, each method on the same data per seed."""
    rows = []
    for task, n, monotonicities, data in _tasks(budget):
        found = methods(len(monotonicities))
        results = {name: Row(task, n, name, [], [], 0.0, 0.0) for name in found}
        for seed in range(budget.seeds):
            x, y, x_test, truth = data(seed)
            for name, fit in found.items():
                start = time.perf_counter()
                predict = fit(x, y, monotonicities, seed, budget.steps, budget.lr)
                row = results[name]
                row.seconds.append(time.perf_counter() - start)
                row.rmses.append(float(np.sqrt(np.mean((predict(x_test) - truth) ** 2))))
                grid, pairs = worst_decrease(predict, monotonicities, budget, seed)
                row.worst_grid, row.worst_pairs = max(row.worst_grid, grid), max(row.worst_pairs, pairs)
        rows.extend(results.values())
    return rows


def _exact(value: float) -> str:
    """0 as 0, anything else with enough digits that a rounding-size value never reads as 0."""
    return "0" if value == 0 else f"{value:.3g}"


def markdown(rows: List[Row]) -> str:
    lines = [
        "| task | n | method | test RMSE, median | min-max over seeds | fit seconds, median "
        "| worst decrease, grid | worst decrease, pairs |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.task} | {row.n:,} | {row.method} | {statistics.median(row.rmses):.4f} "
            f"| {min(row.rmses):.4f}-{max(row.rmses):.4f} | {statistics.median(row.seconds):.2f} "
            f"| {_exact(row.worst_grid)} | {_exact(row.worst_pairs)} |"
        )
    return "\n".join(lines)


def _warm_up() -> None:
    """A few steps of every method first, so no timed fit pays for torch's first calls."""
    for task, _, monotonicities, data in _tasks(QUICK):
        if task in ("step", "tabular 8-D"):
            x, y, _, _ = data(0)
            for fit in methods(len(monotonicities)).values():
                fit(x[:50], y[:50], monotonicities, 0, 2)


@contextlib.contextmanager
def one_thread():
    """torch and sklearn's OpenMP on one thread (restored after): on a shared machine more threads
    than free cores slow everything, and a method's speed should not hang on its threading."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1) if threadpool_limits is not None else contextlib.nullcontext():
            yield
    finally:
        torch.set_num_threads(threads)


def table(budget: Budget) -> None:
    start = time.perf_counter()
    missing = [
        name
        for name, module in (("pytorch-lattice", RTL), ("scikit-learn", HistGradientBoostingRegressor))
        if module is None
    ]
    if missing:
        print(f"not installed, left out: {', '.join(missing)}")
    with one_thread():
        _warm_up()
        rows = table_rows(budget)
    print(
        f"{budget.seeds} seeds; Adam lr {budget.lr:g}; 1 thread (torch and sklearn's OpenMP); "
        f"noise sd {CURVE_NOISE} (1-D), 0.1 (8-D); RMSE to the noiseless target on {TEST_ROWS:,} new points; "
        f"worst decrease over {DOMAIN}, the largest of any seed"
    )
    print(markdown(rows))
    print(f"total {time.perf_counter() - start:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["speed", "lr", "table"])
    parser.add_argument("--repeats", type=int, default=30, help="speed: timed passes per case")
    parser.add_argument("--seeds", type=int, default=3, help="lr, table: seeds (training runs per case)")
    parser.add_argument("--epochs", type=int, default=40, help="lr: epochs per training run")
    parser.add_argument(
        "--lr", type=float, default=LR, help="table: Adam's learning rate of the trained models"
    )
    parser.add_argument(
        "--quick", action="store_true", help="table: a smoke test (tiny n, one seed, few steps)"
    )
    args = parser.parse_args()
    if args.what == "speed":
        speed(args.repeats)
    elif args.what == "table":
        table(QUICK if args.quick else dataclasses.replace(FULL, seeds=args.seeds, lr=args.lr))
    else:
        lr_sweep(args.seeds, args.epochs)


if __name__ == "__main__":
    main()
