"""Benchmark of `fastload.monotonic.LatticeRegressor`'s fit time by torch thread count, and its
accuracy beside scikit-learn's HistGradientBoostingRegressor with the same monotone constraints.

The task: 8 uniform features, y = x0 + sqrt(x1) + x2^2 - x3 + sin(3 x4) x5 + x6 x7 / 2 + noise
(sd 0.1), declared increasing in x0-x2 and decreasing in x3; test RMSE against the noiseless
target on 5,000 fresh rows. Per size, `--repeats` fits of each setting, interleaved (so load
drifts hit both alike): `torch_threads=1` (the default), `torch_threads=None` (torch's own
count), and the gradient-boosting reference. Prints medians of the fit seconds, the ratio, the
test RMSEs and the worst monotonicity violation `check_monotone` finds on the test rows.

    python benches/bench_monotonic_estimator.py [--sizes 1000,10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from fastload.monotonic import LatticeRegressor

FEATURES = {"x0": "increasing", "x1": "increasing", "x2": "increasing", "x3": "decreasing"}


def task(n: int, seed: int):
    """(X, noisy y, noiseless target)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, 8))
    target = (
        X[:, 0]
        + np.sqrt(X[:, 1])
        + X[:, 2] ** 2
        - X[:, 3]
        + np.sin(3 * X[:, 4]) * X[:, 5]
        + 0.5 * X[:, 6] * X[:, 7]
    )
    return X, target + 0.1 * rng.normal(size=n), target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="training rows, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from sklearn.ensemble import HistGradientBoostingRegressor

    X_test, _, target_test = task(5000, seed=1)
    settings = {
        "LatticeRegressor torch_threads=1": lambda: LatticeRegressor(features=FEATURES, torch_threads=1),
        f"LatticeRegressor torch_threads=None ({torch.get_num_threads()})": lambda: LatticeRegressor(
            features=FEATURES, torch_threads=None
        ),
        "HistGradientBoostingRegressor monotonic_cst": lambda: HistGradientBoostingRegressor(
            monotonic_cst=[1, 1, 1, -1, 0, 0, 0, 0], random_state=0
        ),
    }
    print(f"load average before: {os.getloadavg()[0]:.2f}; torch {torch.__version__}, {os.cpu_count()} CPUs")
    print("| rows | model | fit s (median) | test RMSE | worst violation |")
    print("|---:|---|---:|---:|---:|")
    for size in [int(s) for s in args.sizes.split(",")]:
        X, y, _ = task(size, seed=0)
        seconds = {name: [] for name in settings}
        fitted = {}
        for _ in range(args.repeats):
            for name, make in settings.items():
                started = time.perf_counter()
                fitted[name] = make().fit(X, y)
                seconds[name].append(time.perf_counter() - started)
        for name, model in fitted.items():
            rmse = float(np.sqrt(np.mean((model.predict(X_test) - target_test) ** 2)))
            worst = (
                max(model.check_monotone(X_test[:500]).values()) if hasattr(model, "check_monotone") else None
            )
            shown = "" if worst is None else f"{worst:.3g}"
            print(f"| {size:,} | {name} | {statistics.median(seconds[name]):.2f} | {rmse:.4f} | {shown} |")
        names = list(settings)
        ratio = statistics.median(seconds[names[1]]) / statistics.median(seconds[names[0]])
        print(f"| {size:,} | torch default / 1 thread | {ratio:.2f}x | | |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
