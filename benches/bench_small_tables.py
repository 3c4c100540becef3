"""Small tables: the monotone estimators at their defaults against the usual baselines.

Why: monotone models are chosen for small, expensive tables (credit, medicine, pricing), where
a model of many free outputs overfits. This runs bundled tables only (nothing is downloaded),
each over ``--splits`` random 80/20 splits (seeds 0, 1, ...; stratified for a classifier), and
reports each model's test error as mean +- sd over the splits, its mean fit seconds, and which
capacity the default chose (``chosen_params_``) how often. Nothing is tuned on the test rows:
every model, the default's internal cross-validation included, sees the training rows only.

Tables:

- ``diabetes`` (scikit-learn's, 442 rows, 10 features): disease progression, regression, test
  MSE; ``bmi``, ``bp`` and ``s5`` declared increasing, ``sex`` categorical (issue 46's setup).
- ``breast_cancer`` (scikit-learn's, 569 rows, 30 features): benign (1) or malignant (0),
  classification, test log-loss and accuracy; the size and concavity of the worst nucleus
  (``worst radius``, ``worst area``, ``worst concave points``, ``worst concavity``) declared
  decreasing in the probability of benign.

Models: the fastload default (``LatticeRegressor()`` / ``LatticeClassifier()`` with the
declarations), the lattice as it was the default before (``kind="lattice"``, unregularised),
``RidgeCV`` / ``LogisticRegressionCV`` on standardized features, gradient boosting with
``monotonic_cst`` (``HistGradientBoosting*``, its defaults), and an MLP on standardized
features (scikit-learn's defaults, ``max_iter=2000``, seeded by the split).

Run::

    PYTHONPATH=python python benches/bench_small_tables.py [--tables diabetes,breast_cancer] [--splits 10]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
import warnings
from typing import Callable, Dict, List, Tuple

import numpy as np
import torch

from fastload.monotonic import LatticeClassifier, LatticeRegressor


def diabetes():
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True, as_frame=True)
    features = {"bmi": "increasing", "bp": "increasing", "s5": "increasing", "sex": "categorical"}
    return X, y, features, "regression"


def breast_cancer():
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True, as_frame=True)
    decreasing = ["worst radius", "worst area", "worst concave points", "worst concavity"]
    return X, y, dict.fromkeys(decreasing, "decreasing"), "classification"


TABLES = {"diabetes": diabetes, "breast_cancer": breast_cancer}


def monotonic_cst(columns, features) -> List[int]:
    """HistGradientBoosting's constraints for the same declarations."""
    signs = {"increasing": 1, "decreasing": -1}
    return [signs.get(features.get(c), 0) for c in columns]


def models(X, features, task: str, seed: int) -> Dict[str, Callable[[], object]]:
    """Each model of the comparison, made fresh for one split."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegressionCV, RidgeCV
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    cst = monotonic_cst(X.columns, features)
    categorical = [c for c, spec in features.items() if spec == "categorical"]
    if task == "regression":
        return {
            "LatticeRegressor() (default)": lambda: LatticeRegressor(features=features),
            'LatticeRegressor(kind="lattice")': lambda: LatticeRegressor(features=features, kind="lattice"),
            "RidgeCV": lambda: make_pipeline(StandardScaler(), RidgeCV()),
            "HGB(monotonic_cst)": lambda: HistGradientBoostingRegressor(
                monotonic_cst=cst, categorical_features=categorical or None, random_state=seed
            ),
            "MLP": lambda: make_pipeline(StandardScaler(), MLPRegressor(max_iter=2000, random_state=seed)),
        }
    return {
        "LatticeClassifier() (default)": lambda: LatticeClassifier(features=features),
        'LatticeClassifier(kind="lattice")': lambda: LatticeClassifier(features=features, kind="lattice"),
        "LogisticRegressionCV": lambda: make_pipeline(StandardScaler(), LogisticRegressionCV(max_iter=5000)),
        "HGB(monotonic_cst)": lambda: HistGradientBoostingClassifier(monotonic_cst=cst, random_state=seed),
        "MLP": lambda: make_pipeline(StandardScaler(), MLPClassifier(max_iter=2000, random_state=seed)),
    }


def errors(model, X, y, task: str) -> Tuple[float, ...]:
    """Test MSE (regression) or (log-loss, accuracy) (classification)."""
    if task == "regression":
        return (float(np.mean((np.asarray(model.predict(X)) - np.asarray(y)) ** 2)),)
    from sklearn.metrics import accuracy_score, log_loss

    probabilities = np.asarray(model.predict_proba(X))
    return log_loss(y, probabilities), accuracy_score(y, np.asarray(model.predict(X)))


def run_table(name: str, splits: int) -> None:
    from sklearn.model_selection import train_test_split

    X, y, features, task = TABLES[name]()
    figures: Dict[str, List[Tuple[float, ...]]] = collections.defaultdict(list)
    seconds: Dict[str, List[float]] = collections.defaultdict(list)
    chosen: collections.Counter = collections.Counter()
    for seed in range(splits):
        train_X, test_X, train_y, test_y = train_test_split(
            X, y, test_size=0.2, random_state=seed, stratify=y if task == "classification" else None
        )
        for label, make in models(X, features, task, seed).items():
            model = make()
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # convergence chatter of the baselines
                model.fit(train_X, train_y)
            seconds[label].append(time.perf_counter() - start)
            figures[label].append(errors(model, test_X, test_y, task))
            if "(default)" in label:
                chosen[", ".join(f"{k}={v}" for k, v in model.chosen_params_.items() if v)] += 1
        print(f"  {name}: split {seed + 1}/{splits} done", flush=True)
    metrics = ["test MSE"] if task == "regression" else ["test log-loss", "test accuracy"]
    print(f"\n### {name} ({len(X)} rows, {X.shape[1]} features, {splits} splits)\n")
    print("| model | " + " | ".join(metrics) + " | fit s |")
    print("|---|" + "---:|" * (len(metrics) + 1))
    for label, rows in figures.items():
        cells = []
        for k, metric in enumerate(metrics):
            values = [row[k] for row in rows]
            digits = 0 if metric == "test MSE" else 4
            cells.append(f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}")
        print(f"| {label} | " + " | ".join(cells) + f" | {statistics.fmean(seconds[label]):.2f} |")
    print("\nThe default chose: " + "; ".join(f"{k} ({n}x)" for k, n in chosen.most_common()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default=",".join(TABLES), help="comma list of " + ", ".join(TABLES))
    parser.add_argument(
        "--splits", type=int, default=10, help="random 80/20 splits per table (seeds 0, 1, ...)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # the estimators' default (n_jobs=None)
    for name in args.tables.split(","):
        if name not in TABLES:
            parser.error(f"unknown table {name!r}; choose from {', '.join(TABLES)}")
        run_table(name, args.splits)


if __name__ == "__main__":
    main()
