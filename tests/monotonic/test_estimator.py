"""Tests for fastload.monotonic.estimator's LatticeRegressor and LatticeClassifier: the
scikit-learn contract (and the same methods without it), fit and predict on arrays and
DataFrames (pandas and polars, in and out), accuracy on easy tasks, early stopping and its
stratified split, n_jobs, monotonicity in every
declared feature (exactly where the layers promise it) and convexity."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from monotone_helpers import (
    assert_monotone_up_to_rounding,
    exact_features,
    one_thread,  # noqa: F401 (an autouse fixture)
    randomize,
    three_feature_table,
)

from fastload.monotonic import LatticeClassifier, LatticeRegressor
from fastload.monotonic.fitting import validation_split
from fastload.monotonic.regularizers import REGULARIZERS

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
    assert_monotone_up_to_rounding(model, X)
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
    assert_monotone_up_to_rounding(model, frame)
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
    assert_monotone_up_to_rounding(model, X)
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
    assert_monotone_up_to_rounding(model, X)  # each class's score


def test_a_classifier_needs_two_classes_and_labels():
    X = np.random.default_rng(0).uniform(size=(20, 2))
    with pytest.raises(ValueError, match="at least 2 classes"):
        LatticeClassifier(max_iter=2).fit(X, np.zeros(20))
    with pytest.raises(ValueError, match="continuous"):
        LatticeClassifier(max_iter=2).fit(X, X[:, 0])


def test_early_stopping_keeps_the_best_epoch_and_is_deterministic():
    X, y = three_feature_table()
    params = {
        "early_stopping": True,
        "n_iter_no_change": 3,
        "max_iter": 500,
        "batch_size": 64,
        "solver": "adam",
    }
    first = LatticeRegressor(**params).fit(X, y)
    assert first.n_iter_ < 500 and len(first.loss_curve_) == first.n_iter_
    assert len(first.validation_loss_curve_) == first.n_iter_
    assert first.best_validation_loss_ == min(first.validation_loss_curve_)
    # It stopped n_iter_no_change rounds after the best one, whose parameters it kept.
    assert first.validation_loss_curve_.index(first.best_validation_loss_) == first.n_iter_ - 4
    np.testing.assert_array_equal(first.predict(X), LatticeRegressor(**params).fit(X, y).predict(X))
    assert first.score(X, y) > 0.8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_many_features_that_do_not_matter_still_fit(seed):
    """24 features, 18 of them noise: an ensemble of 12 lattices. Before its vertex parameters
    were scaled by the lattice count, L-BFGS stopped far from the optimum (test MSE 0.0036 to
    0.018 for these seeds); now 0.0002-0.0021 (the rest: the x3 x4 interaction when no lattice
    holds both)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (5000, 24))
    score = 2 * X[:, 0] + np.sqrt(X[:, 1]) - X[:, 2] ** 2 + 0.5 * X[:, 3] * X[:, 4]
    y = score + 0.1 * rng.normal(size=5000)
    features = {f"x{j}": "increasing" for j in range(24)}
    features["x2"] = "decreasing"
    model = LatticeRegressor(features=features, random_state=seed).fit(X[:3000], y[:3000])
    assert len(model.model_.lattices[0].bank.raw) == 12
    assert np.mean((model.predict(X[3000:]) - score[3000:]) ** 2) < 0.003


def test_validation_fraction_counts_only_with_early_stopping():
    X, y = three_feature_table(200)
    plain = LatticeRegressor(kind="lattice", **FAST).fit(X, y)
    ignored = LatticeRegressor(kind="lattice", validation_fraction=0.5, **FAST).fit(X, y)
    np.testing.assert_array_equal(plain.predict(X), ignored.predict(X))
    assert not hasattr(plain, "validation_loss_curve_")
    chosen = LatticeRegressor(validation_fraction=0.5, **FAST).fit(X, y)  # kind="auto": a small table
    assert chosen.chosen_params_["early_stopping"] and chosen.chosen_params_["validation_fraction"] == 0.5
    with pytest.raises(ValueError, match="validation_fraction must be in"):
        LatticeRegressor(early_stopping=True, validation_fraction=1.0, **FAST).fit(X, y)
    with pytest.raises(ValueError, match="early_stopping must be True or False"):
        LatticeRegressor(early_stopping="yes", **FAST).fit(X, y)


def _noisy_table(n: int, seed: int):
    """Eight features, two of which matter, under noise as large as their effect."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, 8))
    return X, 2 * X[:, 0] + np.sin(4 * X[:, 1]) + rng.normal(size=n)


@pytest.mark.parametrize(("rows", "stops_early"), [(99, False), (100, True), (5000, True), (5001, False)])
def test_the_default_stops_early_on_small_tables_only(rows, stops_early):
    X, y = _noisy_table(rows, 0)
    model = LatticeRegressor(max_iter=3).fit(X, y)
    assert model.chosen_params_ == {
        "kind": "lattice",
        "early_stopping": stops_early,
        "validation_fraction": 0.1,
        "straight_start": stops_early,
        **dict.fromkeys(REGULARIZERS, 0.0),
    }
    assert hasattr(model, "validation_loss_curve_") is stops_early


def test_the_default_does_not_overfit_a_small_noisy_table_and_is_reproducible():
    X, y = _noisy_table(2300, 1)
    truth = 2 * X[300:, 0] + np.sin(4 * X[300:, 1])
    default = LatticeRegressor(random_state=3).fit(X[:300], y[:300])
    to_tolerance = LatticeRegressor(kind="lattice", random_state=3).fit(X[:300], y[:300])
    error = np.mean((default.predict(X[300:]) - truth) ** 2)
    assert error < 0.8 * np.mean((to_tolerance.predict(X[300:]) - truth) ** 2)
    again = LatticeRegressor(random_state=3).fit(X[:300], y[:300])
    np.testing.assert_allclose(again.predict(X[300:]), default.predict(X[300:]), rtol=1e-6, atol=1e-9)
    assert again.chosen_params_ == default.chosen_params_


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 3), min_size=2, max_size=200),
    fraction=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_validation_split_holds_out_the_fraction_of_every_class(labels, fraction, seed):
    codes = torch.tensor(labels)
    try:
        held, kept = validation_split(len(codes), fraction, codes, torch.Generator().manual_seed(seed))
    except ValueError as error:  # only when a class would miss from one part
        counts = torch.bincount(codes)
        present = counts[counts > 0]
        shares = [round(int(c) * fraction) for c in present]
        assert sum(shares) == 0 or any(s == c for s, c in zip(shares, present.tolist()))
        assert "validation_fraction" in str(error)
        return
    assert sorted(held.tolist() + kept.tolist()) == list(range(len(codes)))
    for code in codes.unique():
        assert (codes[held] == code).sum() == round(int((codes == code).sum()) * fraction)
        assert (codes[kept] == code).sum() > 0
    again = validation_split(len(codes), fraction, codes, torch.Generator().manual_seed(seed))
    assert torch.equal(held, again[0]) and torch.equal(kept, again[1])


def test_a_classifier_stratifies_its_early_stopping_split():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(200, 2))
    y = np.where(np.arange(200) < 190, "common", "rare")  # the 10 rare rows: 2 held out
    model = LatticeClassifier(early_stopping=True, validation_fraction=0.2, **FAST).fit(X, y)
    assert len(model.validation_loss_curve_) == model.n_iter_
    with pytest.raises(ValueError, match="no training sample of some class"):
        LatticeClassifier(early_stopping=True, validation_fraction=0.9, **FAST).fit(X[:191], y[:191])


def test_fit_runs_on_n_jobs_threads_and_gives_them_back(monkeypatch):
    X, y = three_feature_table(50)
    calls = []
    set_threads = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), set_threads(n)))
    before = torch.get_num_threads()
    set_threads(3)
    try:
        model = LatticeRegressor(max_iter=2).fit(X, y)  # None: one thread, as scikit-learn's
        assert calls == [1, 3] and torch.get_num_threads() == 3
        model.set_params(n_jobs=2).predict(X)
        assert calls == [1, 3, 2, 3]
        LatticeRegressor(max_iter=2, n_jobs=-1).fit(X, y)
        assert calls[-2:] == [len(os.sched_getaffinity(0)), 3]
    finally:
        set_threads(before)
    for wrong in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n_jobs must be a non-zero int or None"):
            LatticeRegressor(max_iter=2, n_jobs=wrong).fit(X, y)


def test_set_output_gives_pandas_and_polars_predictions():
    pandas = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    frame = pandas.DataFrame(rng.uniform(size=(120, 2)), columns=["area", "age"], index=range(500, 620))
    y = np.digitize(frame["area"] + 0.1 * rng.normal(size=120), [0.3, 0.6])
    names = {0: "low", 1: "mid", 2: "high"}
    labels = np.array([names[v] for v in y])
    regressor = LatticeRegressor(features={"area": "increasing"}, **FAST).set_output(transform="pandas")
    predicted = regressor.fit(frame, y.astype(float)).predict(frame)
    assert isinstance(predicted, pandas.Series) and list(predicted.index) == list(frame.index)
    np.testing.assert_array_equal(
        predicted.to_numpy(), regressor.set_output(transform="default").predict(frame)
    )
    with pytest.warns(UserWarning, match="valid feature names"):
        assert isinstance(regressor.predict(frame.to_numpy()), np.ndarray)

    classifier = LatticeClassifier(**FAST).set_output(transform="pandas").fit(frame, labels)
    probabilities = classifier.predict_proba(frame)
    assert list(probabilities.columns) == list(classifier.classes_) and list(probabilities.index) == list(
        frame.index
    )
    assert list(classifier.predict_log_proba(frame).columns) == list(classifier.classes_)
    assert isinstance(classifier.predict(frame), pandas.Series)
    ordered = pandas.Series(pandas.Categorical(labels, categories=["low", "mid", "high"], ordered=True))
    ordinal = LatticeClassifier(**FAST).set_output(transform="pandas").fit(frame, ordered)
    assert list(ordinal.decision_function(frame).columns) == ["at least mid", "at least high"]
    binary = LatticeClassifier(**FAST).set_output(transform="pandas").fit(frame, labels == "high")
    assert binary.decision_function(frame).name == "decision"

    from sklearn.base import clone

    assert clone(classifier)._sklearn_output_config == {"transform": "pandas"}
    with pytest.raises(ValueError, match="transform must be"):
        classifier.set_output(transform="arrow")

    polars = pytest.importorskip("polars")
    table = polars.DataFrame({"area": frame["area"].to_numpy(), "age": frame["age"].to_numpy()})
    as_polars = classifier.set_output(transform="polars").predict_proba(table)
    assert isinstance(as_polars, polars.DataFrame) and as_polars.columns == [
        str(c) for c in classifier.classes_
    ]
    np.testing.assert_allclose(as_polars.to_numpy(), probabilities.to_numpy(), rtol=1e-6)


def test_a_polars_frame_declares_features_by_name_and_an_enum_orders_its_categories():
    polars = pytest.importorskip("polars")
    pytest.importorskip("pandas")
    rng = np.random.default_rng(1)
    tiers = rng.choice(["lo", "mid", "hi"], 300)
    table = polars.DataFrame(
        {
            "area": rng.uniform(size=300),
            "tier": polars.Series(tiers.tolist(), dtype=polars.Enum(["lo", "mid", "hi"])),
        }
    )
    y = table["area"].to_numpy() + np.array([{"lo": 0, "mid": 1, "hi": 2}[t] for t in tiers])
    model = LatticeRegressor(features={"area": "increasing", "tier": "increasing"}, **FAST).fit(table, y)
    assert list(model.feature_names_in_) == ["area", "tier"] and model.categories_[1] == ["lo", "mid", "hi"]
    assert_monotone_up_to_rounding(model, table)
    assert model.score(table, y) > 0.95


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
    exact = exact_features(model)
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
    assert 0 in exact_features(model)
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
    with pytest.raises(ValueError, match="kind must be one of"):
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


@pytest.mark.safety
@pytest.mark.parametrize("scale", [1e308, 1e-320], ids=["huge", "subnormal"])
def test_sample_weights_at_the_ends_of_float64_fit_as_their_ratios_do(scale):
    """Only the weights' ratios matter: weights of 1e308 (whose sum overflows) or 1e-320 (a
    subnormal, zero in float32) fit the model that weights of one fit."""
    X, y = three_feature_table(200)
    plain = LatticeRegressor(max_iter=20).fit(X, y)
    scaled = LatticeRegressor(max_iter=20).fit(X, y, sample_weight=np.full(200, scale))
    np.testing.assert_allclose(scaled.predict(X), plain.predict(X), rtol=1e-4, atol=1e-4)
    mixed = np.r_[np.full(100, scale), np.zeros(100)]
    assert np.isfinite(LatticeRegressor(max_iter=5).fit(X, y, sample_weight=mixed).predict(X)).all()


@pytest.mark.safety
@pytest.mark.parametrize("n_jobs", [2**31, 10**6, -(2**63)])
def test_n_jobs_beyond_any_machine_is_refused_by_name(n_jobs):
    X, y = three_feature_table(50)
    with pytest.raises(ValueError, match=f"n_jobs must be .*got {n_jobs}"):
        LatticeRegressor(max_iter=2, n_jobs=n_jobs).fit(X, y)


@pytest.mark.safety
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"random_state": 2**80}, "random_state must be below 2\\*\\*62"),
        ({"random_state": -1}, "random_state must be an integer >= 0"),
        ({"learning_rate": math.inf, "solver": "adam"}, "learning_rate must be finite and > 0, got inf"),
    ],
    ids=["seed-huge", "seed-negative", "learning-rate-inf"],
)
def test_numbers_no_fit_can_use_are_refused_by_the_parameter_given(params, message):
    X, y = three_feature_table(50)
    with pytest.raises(ValueError, match=message):
        LatticeRegressor(max_iter=2, **params).fit(X, y)


def test_partial_fit_fine_tunes_on_new_rows_keeping_keypoints():
    X, y = three_feature_table(600)
    model = LatticeRegressor(features={"x0": "increasing"}).partial_fit(X[:300], y[:300])  # fits
    keypoints, iterations = [list(k) for k in model.keypoints_], model.n_iter_
    shifted = y[300:] + 0.5 * X[300:, 0]  # the new rows' target leans further on x0
    before = np.mean((model.predict(X[300:]) - shifted) ** 2)
    model.partial_fit(X[300:], shifted)
    assert [list(k) for k in model.keypoints_] == keypoints and model.n_iter_ > iterations
    assert np.mean((model.predict(X[300:]) - shifted) ** 2) < 0.5 * before
    assert_monotone_up_to_rounding(model, X)
    labels = (y > np.median(y)).astype(int)
    classifier = LatticeClassifier().fit(X[:300], labels[:300]).partial_fit(X[300:], labels[300:])
    assert classifier.score(X, labels) > 0.85
    with pytest.raises(ValueError, match="not fitted on: 2"):
        classifier.partial_fit(X[:10], np.full(10, 2))
