"""Tests for fastload.monotonic.estimator's LatticeRegressor and LatticeClassifier: the
scikit-learn contract (and the same methods without it), fit and predict on arrays and
DataFrames, accuracy on easy tasks, early stopping, torch threads, monotonicity in every
declared feature (exactly where the layers promise it) and convexity."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from monotone_helpers import (
    exact_columns,
    one_thread,  # noqa: F401 (an autouse fixture)
    randomize,
    three_feature_table,
)

from fastload.monotonic import LatticeClassifier, LatticeRegressor

pytest.importorskip("sklearn")
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

FAST = {"max_iter": 100}


# scikit-learn checks these estimators fail on purpose, and why.
EXPECTED_FAILURES = {
    "check_sample_weight_equivalence_on_dense_data": (
        "keypoints go to quantiles of the rows, not of the weights, so a weight of 2 and a repeated "
        "row place them apart and the fits agree only approximately"
    ),
}


@parametrize_with_checks(
    [LatticeRegressor(max_iter=100), LatticeClassifier(max_iter=30)],
    expected_failed_checks=lambda estimator: EXPECTED_FAILURES,
)
def test_scikit_learn_contract(estimator, check):
    check(estimator)


def test_works_without_scikit_learn():
    """scikit-learn is a test dependency only: without it the estimators keep their methods."""
    code = """
import sys
sys.modules["sklearn"] = None
import numpy as np
from fastload.monotonic import LatticeRegressor
model = LatticeRegressor(max_iter=5)
assert model.set_params(max_iter=3).get_params()["max_iter"] == 3
try:
    model.predict(np.zeros((2, 2)))
except ValueError as error:
    assert "not fitted" in str(error) and isinstance(error, AttributeError)
X = np.random.default_rng(0).uniform(size=(40, 2))
print(model.fit(X, X.sum(1)).score(X, X.sum(1)))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert math.isfinite(float(result.stdout))


def test_regressor_fits_an_array_and_keeps_declared_directions():
    X, y = three_feature_table()
    model = LatticeRegressor(features={"x0": "increasing", 1: "decreasing"}, **FAST).fit(X, y)
    assert model.score(X, y) > 0.9
    assert model.predict(X).shape == (300,) and 1 <= model.n_iter_ <= 100  # L-BFGS stops at tol
    assert [f.monotonicity for f in model.features_] == [1, -1, 0]
    assert model.check_monotone(X) == {"x0": 0.0, "x1": 0.0}
    assert not model.model_.training  # the check leaves the model as it found it
    # Quantile keypoints: each piece holds about as many training samples.
    counts = np.histogram(X[:, 0], bins=model.keypoints_[0])[0]
    assert counts.min() >= 0.5 * counts.mean()


def test_regressor_fits_a_dataframe_by_column_name():
    pandas = pytest.importorskip("pandas")
    X, y = three_feature_table()
    frame = pandas.DataFrame(X, columns=["area", "distance", "age"])
    frame["region"] = np.where(X[:, 2] > 0.5, "north", "south")
    declared = {"area": "increasing", "distance": "decreasing", "region": "categorical"}
    model = LatticeRegressor(features=declared, **FAST).fit(frame, y)
    assert list(model.feature_names_in_) == ["area", "distance", "age", "region"]
    assert model.categories_[3] == ["north", "south"]
    np.testing.assert_allclose(model.predict(frame), model.predict(frame.copy()))
    assert model.score(frame, y) > 0.9
    assert model.check_monotone(frame) == {"area": 0.0, "distance": 0.0}
    # A text column is categorical without being declared.
    assert LatticeRegressor(max_iter=2).fit(frame, y).features_[3].categorical
    with pytest.raises(ValueError, match="feature names should match"):
        model.predict(frame[["distance", "area", "age", "region"]])


def test_classifier_is_accurate_on_an_easy_binary_task():
    X, y = three_feature_table(400)
    labels = np.where(y > 0.6, "yes", "no")
    model = LatticeClassifier(features={"x0": "increasing", "x1": "decreasing"}, **FAST).fit(X, labels)
    assert list(model.classes_) == ["no", "yes"]
    assert model.score(X, labels) > 0.9
    proba = model.predict_proba(X)
    np.testing.assert_allclose(proba.sum(1), 1.0)
    assert model.decision_function(X).shape == (400,)
    assert model.check_monotone(X) == {"x0": 0.0, "x1": 0.0}
    # The probability of "yes" rises with x0 and falls with x1 (a sigmoid of an exact score).
    grid = np.repeat(X[:20], 50, axis=0)
    grid[:, 0] = np.tile(np.linspace(-0.5, 1.5, 50), 20)
    assert (np.diff(model.predict_proba(grid)[:, 1].reshape(20, 50), axis=1) >= -1e-12).all()


def test_classifier_is_accurate_on_an_easy_three_class_task():
    X, y = three_feature_table(400)
    labels = np.digitize(y, [0.0, 0.8])
    model = LatticeClassifier(features={"x0": "increasing"}).fit(X, labels)
    assert model.score(X, labels) > 0.85
    assert model.decision_function(X).shape == (400, 3)
    np.testing.assert_allclose(model.predict_proba(X).sum(1), 1.0)
    assert model.check_monotone(X) == {"x0": 0.0}  # each class's score


def test_a_classifier_needs_two_classes_and_labels():
    X = np.random.default_rng(0).uniform(size=(20, 2))
    with pytest.raises(ValueError, match="at least 2 classes"):
        LatticeClassifier(max_iter=2).fit(X, np.zeros(20))
    with pytest.raises(ValueError, match="continuous"):
        LatticeClassifier(max_iter=2).fit(X, X[:, 0])


def test_early_stopping_keeps_the_best_epoch_and_is_deterministic():
    X, y = three_feature_table()
    params = {
        "validation_fraction": 0.2,
        "n_iter_no_change": 3,
        "max_iter": 500,
        "batch_size": 64,
        "solver": "adam",
    }
    first = LatticeRegressor(**params).fit(X, y)
    assert first.n_iter_ < 500 and len(first.loss_curve_) == first.n_iter_
    np.testing.assert_array_equal(first.predict(X), LatticeRegressor(**params).fit(X, y).predict(X))
    assert first.score(X, y) > 0.8


def test_fit_runs_on_its_torch_threads_and_gives_them_back(monkeypatch):
    X, y = three_feature_table(50)
    calls = []
    set_threads = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), set_threads(n)))
    before = torch.get_num_threads()
    set_threads(2)
    try:
        model = LatticeRegressor(max_iter=2, torch_threads=1).fit(X, y)
        assert calls == [1, 2] and torch.get_num_threads() == 2
        LatticeRegressor(max_iter=2, torch_threads=None).fit(X, y)
        assert calls == [1, 2]
        model.predict(X)
        assert calls == [1, 2, 1, 2]
    finally:
        set_threads(before)
    with pytest.raises(ValueError, match="torch_threads"):
        LatticeRegressor(max_iter=2, torch_threads=0).fit(X, y)


def _exact_features(model) -> set:
    """Features whose lattice dimension the layers keep exactly monotone under rounding."""
    return {j for lattice in model.model_.lattices for j in exact_columns(lattice)}


SPECS = st.sampled_from(["increasing", "decreasing", None, "concave", {"monotonicity": -1, "convexity": 1}])


@settings(max_examples=15, deadline=None)
@given(
    specs=st.lists(SPECS, min_size=1, max_size=6),
    categorical_increasing=st.booleans(),
    scale=st.sampled_from([0.1, 3.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_monotone_in_every_declared_feature_for_any_parameters(specs, categorical_increasing, scale, seed):
    """Random declarations, random parameters (a fit only places the keypoints), random pairs
    of rows that differ in one feature: the prediction moves the declared way, exactly in the
    features the layers make exact, within float32 rounding of the output in the others."""
    rng = np.random.default_rng(seed)
    n = 64
    X = rng.normal(size=(n, len(specs) + 1)) * rng.uniform(0.1, 100, len(specs) + 1)
    X[:, -1] = rng.integers(0, 4, n)
    features = {f"x{j}": spec for j, spec in enumerate(specs)}
    features[f"x{len(specs)}"] = {
        "categories": [0.0, 1.0, 2.0, 3.0],
        "monotonicity": 1 if categorical_increasing else None,
    }
    model = LatticeRegressor(features=features, max_iter=1, lattice_rank=3).fit(X, rng.normal(size=n))
    randomize(model.model_, seed, scale)
    exact = _exact_features(model)
    for j, feature in enumerate(model.features_):
        if not feature.monotonicity:
            continue
        low, high = X[:, j].copy(), X[:, j].copy()
        if feature.categorical:
            low, high = rng.integers(0, 4, n).astype(float), rng.integers(0, 4, n).astype(float)
        else:
            low += rng.normal(size=n) * X[:, j].std() * 2
            high += rng.normal(size=n) * X[:, j].std() * 2
            high[: n // 4] = np.nextafter(low[: n // 4], np.inf)  # neighbouring floats too
        low, high = np.minimum(low, high), np.maximum(low, high)
        a, b = X.copy(), X.copy()
        a[:, j], b[:, j] = low, high
        change = feature.monotonicity * (model.predict(b) - model.predict(a))
        tolerance = 0.0 if j in exact else 1e-5 * (1 + np.abs(model.predict(a)).max())
        assert change.min() >= -tolerance, (feature, j in exact, change.min())
        assert model.check_monotone(X)[feature.name] <= tolerance


def test_the_first_monotone_feature_is_exactly_monotone_on_a_dense_grid():
    X, y = three_feature_table()
    model = LatticeRegressor(features={"x0": "decreasing", "x1": "increasing"}, max_iter=30).fit(X, -y)
    assert 0 in _exact_features(model)
    grid = np.repeat(X[:16], 2001, axis=0)
    grid[:, 0] = np.tile(np.linspace(-0.2, 1.2, 2001), 16)
    assert (np.diff(model.predict(grid).reshape(16, 2001), axis=1) <= 0).all()
    assert model.check_monotone(X, num_steps=500)["x0"] == 0.0


def test_concave_and_convex_calibrators_come_out_so():
    X, y = three_feature_table()
    declared = {"x1": {"monotonicity": "decreasing", "convexity": "concave"}, "x2": "convex"}
    model = LatticeRegressor(features=declared, **FAST).fit(X, y)
    for j, sign in ((1, -1), (2, 1)):
        calibrator = model.model_.calibrators[j]
        slopes = calibrator.slopes().detach().double()
        assert (sign * slopes.diff() >= 0).all()
        outputs = calibrator.keypoint_outputs().detach().double()
        realized = outputs.diff() / calibrator.keypoints.diff()
        assert (sign * realized.diff() >= -1e-4).all()
    assert (model.model_.calibrators[1].slopes() <= 0).all()


def test_a_calibrated_linear_model_is_convex_in_a_convex_feature():
    """kind="linear": the prediction itself, not only the calibrator, is convex in x1."""
    X, y = three_feature_table()
    declared = {"x0": "increasing", "x1": {"monotonicity": "decreasing", "convexity": "convex"}}
    model = LatticeRegressor(features=declared, kind="linear", learning_rate=0.2, **FAST)
    model.fit(X, -np.sqrt(X[:, 1]) + X[:, 0])
    assert model.score(X, -np.sqrt(X[:, 1]) + X[:, 0]) > 0.95
    grid = np.repeat(X[:16], 401, axis=0)
    # Convex between its first and last keypoint; constant (so flat) outside, as every calibrator.
    grid[:, 1] = np.tile(np.linspace(model.keypoints_[1][0], model.keypoints_[1][-1], 401), 16)
    prediction = model.predict(grid).reshape(16, 401)
    tolerance = 1e-5 * (1 + np.abs(prediction).max())
    assert (np.diff(prediction, 2, axis=1) >= -tolerance).all()
    assert (np.diff(prediction, axis=1) <= tolerance).all()
    assert all(worst <= tolerance for worst in model.check_monotone(X).values())
    with pytest.raises(ValueError, match="kind must be 'lattice' or 'linear'"):
        LatticeRegressor(kind="tree", max_iter=2).fit(X, y)


def test_sample_weight_zero_ignores_rows_and_weights_score():
    X, y = three_feature_table(400)
    corrupted = y.copy()
    corrupted[:100] = 10.0  # rows a weight of zero must not pull the fit
    weights = np.r_[np.zeros(100), np.ones(300)]
    clean = LatticeRegressor(features={"x0": "increasing"}).fit(X[100:], y[100:])
    weighted = LatticeRegressor(features={"x0": "increasing"}).fit(X, corrupted, sample_weight=weights)
    unweighted = LatticeRegressor(features={"x0": "increasing"}).fit(X, corrupted)
    assert np.abs(weighted.predict(X[100:]) - clean.predict(X[100:])).max() < 0.15
    assert np.abs(unweighted.predict(X[100:]) - clean.predict(X[100:])).max() > 1.0
    assert weighted.score(X, corrupted, sample_weight=weights) > 0.9 > weighted.score(X, corrupted)
    labels = (y > np.median(y)).astype(int)
    flipped = np.where(np.arange(400) < 100, 1 - labels, labels)
    classifier = LatticeClassifier().fit(X, flipped, sample_weight=weights)
    assert classifier.score(X[100:], labels[100:]) > 0.85


@pytest.mark.parametrize(
    "weights, message",
    [(np.ones(3), "sample_weight.shape"), (-np.ones(400), "non-negative"), (np.zeros(400), "sums to zero")],
)
def test_bad_sample_weights_are_refused(weights, message):
    X, y = three_feature_table(400)
    with pytest.raises(ValueError, match=message):
        LatticeRegressor(max_iter=2).fit(X, y, sample_weight=weights)


def test_partial_fit_fine_tunes_on_new_rows_keeping_keypoints():
    X, y = three_feature_table(600)
    model = LatticeRegressor(features={"x0": "increasing"}).partial_fit(X[:300], y[:300])  # fits
    keypoints, iterations = [list(k) for k in model.keypoints_], model.n_iter_
    shifted = y[300:] + 0.5 * X[300:, 0]  # the new rows' target leans further on x0
    before = np.mean((model.predict(X[300:]) - shifted) ** 2)
    model.partial_fit(X[300:], shifted)
    assert [list(k) for k in model.keypoints_] == keypoints and model.n_iter_ > iterations
    assert np.mean((model.predict(X[300:]) - shifted) ** 2) < 0.5 * before
    assert model.check_monotone(X) == {"x0": 0.0}
    labels = (y > np.median(y)).astype(int)
    classifier = LatticeClassifier().fit(X[:300], labels[:300]).partial_fit(X[300:], labels[300:])
    assert classifier.score(X, labels) > 0.85
    with pytest.raises(ValueError, match="not fitted on: 2"):
        classifier.partial_fit(X[:10], np.full(10, 2))
