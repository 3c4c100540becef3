"""Benchmark of `fastload.monotonic.LatticeRegressor` / `LatticeClassifier` against scikit-learn's
HistGradientBoosting with the same monotone constraints: fit time, test error, their ratios.

The tasks (issue #36): 6 uniform features on [0, 1], all declared monotone (x2 decreasing, the rest
increasing). With the smooth score s = 2 x0 + sqrt(x1) - x2^2 + 0.5 x3 x4:

* smooth:  y = s + noise (sd 0.1); test MSE against the noiseless target
* step:    y = 2 [x5 > 0.5] + noise (sd 0.1); test MSE against the noiseless target
* binary:  y = [s + noise (sd 0.3) > 1.2]; test log-loss
* ordinal: y = 0..3, s + noise (sd 0.3) cut at 0.6, 1.2, 1.8; test log-loss. LatticeClassifier
  with ordinal=True; HGB's classifier refuses monotonic_cst for more than two classes, so its
  row is unconstrained.

Test errors are on 5,000 fresh rows. Models use their defaults (HGB with `random_state=0`). Per
size and task, `--repeats` fits of each model, interleaved, so load drifts hit all alike; medians
of the fit seconds. Ratios are the lattice model's over HGB's, from the same run. HGB also runs
with its OpenMP pool limited to one thread (threadpoolctl), as the lattice model's default
`n_jobs=None` (one torch thread): on a loaded machine OpenMP's spinning threads can slow it down many
times.

`--scaling` measures instead how the lattice model's fit grows (smooth target, 10,000 rows unless
`--sizes` says otherwise): with the rows, with the features (6, 12, 24: the extra ones uniform, declared
increasing, not in the target) and with the keypoints per feature (10, 20, 40), and with `n_jobs` 1 and 2;
fit seconds (medians), L-BFGS iterations and test MSE.

    python benches/bench_monotonic_estimator.py [--sizes 10000,100000] [--tasks smooth,step] [--repeats 3]
    python benches/bench_monotonic_estimator.py --scaling [--sizes 10000,100000,1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable, Dict, Tuple

import numpy as np
import torch

from fastload.monotonic import LatticeClassifier, LatticeRegressor

FEATURES = {"x0": "increasing", "x1": "increasing", "x2": "decreasing", "x3": "increasing",
            "x4": "increasing", "x5": "increasing"}  # fmt: skip
MONOTONIC_CST = [1, 1, -1, 1, 1, 1]
CLASSIFIERS = ("binary", "ordinal")
TASKS = ("smooth", "step") + CLASSIFIERS


def smooth_score(X: np.ndarray) -> np.ndarray:
    return 2 * X[:, 0] + np.sqrt(X[:, 1]) - X[:, 2] ** 2 + 0.5 * X[:, 3] * X[:, 4]


def task(name: str, n: int, seed: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, y, what the test error compares with: the noiseless target, or y itself)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, len(FEATURES)))
    if name in CLASSIFIERS:
        noisy = smooth_score(X) + 0.3 * rng.normal(size=n)
        y = (noisy > 1.2).astype(int) if name == "binary" else np.digitize(noisy, [0.6, 1.2, 1.8])
        return X, y, y
    target = smooth_score(X) if name == "smooth" else 2.0 * (X[:, 5] > 0.5)
    return X, target + 0.1 * rng.normal(size=n), target


class OneThread:
    """``estimator`` fitted with its OpenMP pool limited to one thread."""

    def __init__(self, estimator):
        self.estimator = estimator

    def fit(self, X, y):
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):
            self.estimator.fit(X, y)
        return self

    def __getattr__(self, name):
        return getattr(self.estimator, name)


def models(name: str) -> Dict[str, Callable[[], object]]:
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    if name in CLASSIFIERS:
        constraints = MONOTONIC_CST if name == "binary" else None

        def lattice():
            return LatticeClassifier(features=FEATURES, ordinal=name == "ordinal")

        def hgb():
            return HistGradientBoostingClassifier(monotonic_cst=constraints, random_state=0)
    else:

        def lattice():
            return LatticeRegressor(features=FEATURES)

        def hgb():
            return HistGradientBoostingRegressor(monotonic_cst=MONOTONIC_CST, random_state=0)

    return {"lattice": lattice, "HGB": hgb, "HGB 1 thread": lambda: OneThread(hgb())}


def test_error(name: str, estimator, X: np.ndarray, truth: np.ndarray) -> float:
    if name in CLASSIFIERS:
        probabilities = np.clip(estimator.predict_proba(X), 1e-15, 1)
        return float(-np.mean(np.log(probabilities[np.arange(len(truth)), truth])))
    return float(np.mean((estimator.predict(X) - truth) ** 2))


def measure(name: str, size: int, repeats: int) -> Dict[str, Tuple[float, float, float]]:
    """Per model: (median fit seconds, test error, worst monotonicity violation or NaN)."""
    X, y, _ = task(name, size, seed=0)
    X_test, _, truth = task(name, 5000, seed=1)
    makers = models(name)
    seconds: Dict[str, list] = {model: [] for model in makers}
    fitted = {}
    for _ in range(repeats):
        for model, make in makers.items():
            started = time.perf_counter()
            fitted[model] = make().fit(X, y)
            seconds[model].append(time.perf_counter() - started)
    results = {}
    for model, estimator in fitted.items():
        worst = float("nan")
        if hasattr(estimator, "check_monotone"):
            worst = max(estimator.check_monotone(X_test[:500]).values())
        results[model] = (
            statistics.median(seconds[model]),
            test_error(name, estimator, X_test, truth),
            worst,
        )
    return results


def scaling(sizes, repeats: int) -> None:
    """The lattice model's fit time, iterations and test MSE as rows, features, keypoints and
    threads grow, one setting changed at a time from the default at ``sizes[0]`` rows."""
    print("| rows | features | keypoints | n_jobs | fit s | iterations | test MSE |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    settings = [(size, 6, 10, None) for size in sizes]
    settings += [(sizes[0], f, 10, None) for f in (12, 24)] + [(sizes[0], 6, k, None) for k in (20, 40)]
    settings += [(size, 6, 10, 2) for size in sizes]
    LatticeRegressor(max_iter=1).fit(*task("smooth", 100, seed=0)[:2])  # the first fit pays torch's imports
    for rows, num_features, keypoints, n_jobs in settings:
        X, y, _ = task("smooth", rows, seed=0)
        X_test, _, truth = task("smooth", 5000, seed=1)
        extra = np.random.default_rng(2).uniform(0, 1, (rows + 5000, num_features - X.shape[1]))
        X, X_test = np.hstack([X, extra[:rows]]), np.hstack([X_test, extra[rows:]])
        features = {**FEATURES, **{f"x{j}": "increasing" for j in range(len(FEATURES), num_features)}}
        seconds = []
        for _ in range(repeats):
            model = LatticeRegressor(features=features, num_keypoints=keypoints, n_jobs=n_jobs)
            started = time.perf_counter()
            model.fit(X, y)
            seconds.append(time.perf_counter() - started)
        error = float(np.mean((model.predict(X_test) - truth) ** 2))
        print(
            f"| {rows:,} | {num_features} | {keypoints} | {n_jobs or 1} | {statistics.median(seconds):.2f} "
            f"| {model.n_iter_} | {error:.5f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="training rows, comma-separated")
    parser.add_argument("--tasks", default="smooth,step", help=f"of {','.join(TASKS)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scaling", action="store_true", help="how the fit grows, instead of the comparison")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}; torch {torch.__version__}, {os.cpu_count()} CPUs")
    if args.scaling:
        scaling([int(s) for s in args.sizes.split(",")], args.repeats)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return
    print("| rows | target | lattice fit / error | HGB fit / error | fit ratio | error ratio "
          "| HGB 1 thread fit | fit ratio to it | worst violation |")  # fmt: skip
    print("|---:|---|---|---|---:|---:|---:|---:|---:|")
    for size in [int(s) for s in args.sizes.split(",")]:
        for name in args.tasks.split(","):
            results = measure(name, size, args.repeats)
            (lattice_s, lattice_error, worst), (hgb_s, hgb_error, _) = results["lattice"], results["HGB"]
            one_s = results["HGB 1 thread"][0]
            print(
                f"| {size:,} | {name} | {lattice_s:.2f} s / {lattice_error:.4f} | {hgb_s:.2f} s / {hgb_error:.4f} "
                f"| {lattice_s / hgb_s:.2f}x | {lattice_error / hgb_error:.2f}x | {one_s:.2f} s "
                f"| {lattice_s / one_s:.2f}x | {worst:.3g} |",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
