"""Benchmark of `fastload.monotonic.LatticeRegressor` against scikit-learn's
HistGradientBoostingRegressor with the same monotone constraints: fit time, test MSE, their ratio.

The tasks (issue #36): 6 uniform features on [0, 1], all declared monotone (x2 decreasing, the rest
increasing), noise sd 0.1:

* smooth: y = 2 x0 + sqrt(x1) - x2^2 + 0.5 x3 x4 + noise
* step:   y = 2 [x5 > 0.5] + noise

Test MSE is against the noiseless target on 5,000 fresh rows. Both models use their defaults (the
lattice model's `torch_threads` default, HGB's `random_state=0`). Per size and task, `--repeats`
fits of each model, interleaved, so load drifts hit both alike; medians of the fit seconds. The
ratio is LatticeRegressor's median fit time over HGB's, from the same run.

    python benches/bench_monotonic_estimator.py [--sizes 10000,100000] [--tasks smooth,step] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable, Dict, Tuple

import numpy as np
import torch

from fastload.monotonic import LatticeRegressor

FEATURES = {"x0": "increasing", "x1": "increasing", "x2": "decreasing", "x3": "increasing",
            "x4": "increasing", "x5": "increasing"}  # fmt: skip
MONOTONIC_CST = [1, 1, -1, 1, 1, 1]
TARGETS: Dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "smooth": lambda X: 2 * X[:, 0] + np.sqrt(X[:, 1]) - X[:, 2] ** 2 + 0.5 * X[:, 3] * X[:, 4],
    "step": lambda X: 2.0 * (X[:, 5] > 0.5),
}
NOISE = 0.1


def task(name: str, n: int, seed: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, noisy y, noiseless target) of ``n`` rows."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, len(FEATURES)))
    target = TARGETS[name](X)
    return X, target + NOISE * rng.normal(size=n), target


class OneThread:
    """``estimator`` fitted with its OpenMP pool limited to one thread (threadpoolctl), as the
    lattice model's default ``torch_threads=1``: on a loaded machine OpenMP's spinning threads
    can slow gradient boosting down many times over, so both rows are shown."""

    def __init__(self, estimator):
        self.estimator = estimator

    def fit(self, X, y):
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):
            self.estimator.fit(X, y)
        return self

    def predict(self, X):
        return self.estimator.predict(X)


def models() -> Dict[str, Callable[[], object]]:
    from sklearn.ensemble import HistGradientBoostingRegressor

    def hgb():
        return HistGradientBoostingRegressor(monotonic_cst=MONOTONIC_CST, random_state=0)

    return {
        "LatticeRegressor": lambda: LatticeRegressor(features=FEATURES),
        "HGB": hgb,
        "HGB 1 thread": lambda: OneThread(hgb()),
    }


def measure(name: str, size: int, repeats: int) -> Dict[str, Tuple[float, float, float]]:
    """Per model: (median fit seconds, test MSE, worst monotonicity violation or NaN)."""
    X, y, _ = task(name, size, seed=0)
    X_test, _, target_test = task(name, 5000, seed=1)
    makers = models()
    seconds: Dict[str, list] = {model: [] for model in makers}
    fitted = {}
    for _ in range(repeats):
        for model, make in makers.items():
            started = time.perf_counter()
            fitted[model] = make().fit(X, y)
            seconds[model].append(time.perf_counter() - started)
    results = {}
    for model, estimator in fitted.items():
        mse = float(np.mean((estimator.predict(X_test) - target_test) ** 2))
        worst = (
            max(estimator.check_monotone(X_test[:500]).values())
            if hasattr(estimator, "check_monotone")
            else float("nan")
        )
        results[model] = (statistics.median(seconds[model]), mse, worst)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="training rows, comma-separated")
    parser.add_argument("--tasks", default="smooth,step", help=f"of {','.join(TARGETS)}")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}; torch {torch.__version__}, {os.cpu_count()} CPUs")
    print("| rows | target | LatticeRegressor fit / MSE | HGB monotonic_cst fit / MSE | fit ratio | MSE ratio "
          "| HGB 1 thread fit | fit ratio to it | worst violation |")  # fmt: skip
    print("|---:|---|---|---|---:|---:|---:|---:|---:|")
    for size in [int(s) for s in args.sizes.split(",")]:
        for name in args.tasks.split(","):
            results = measure(name, size, args.repeats)
            (lattice_s, lattice_mse, worst), (hgb_s, hgb_mse, _) = results["LatticeRegressor"], results["HGB"]
            one_s = results["HGB 1 thread"][0]
            print(
                f"| {size:,} | {name} | {lattice_s:.2f} s / {lattice_mse:.4f} | {hgb_s:.2f} s / {hgb_mse:.4f} "
                f"| {lattice_s / hgb_s:.2f}x | {lattice_mse / hgb_mse:.2f}x | {one_s:.2f} s | {lattice_s / one_s:.2f}x "
                f"| {worst:.3g} |",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
