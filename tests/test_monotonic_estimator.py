"""Tests for fastload.monotonic's tabular estimators: the scikit-learn contract, monotonicity
in every declared feature (exactly where the layers promise it), convexity, categories, missing
values, save/load and its refusals, accuracy on easy tasks, calibrator plots."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from monotone_helpers import exact_columns, one_thread, randomize  # noqa: F401 (an autouse fixture)
from test_checkpoints import disk_full_at

import fastload
from fastload.monotonic import Lattice, LatticeClassifier, LatticeRegressor, plot_calibrators

pytest.importorskip("sklearn")
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402


def _table(n: int = 300, seed: int = 0):
    """Three features; y rises with x0, falls with x1 (concavely), wiggles with x2."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, 3))
    y = 2 * X[:, 0] - X[:, 1] ** 2 + 0.3 * np.sin(6 * X[:, 2]) + 0.05 * rng.normal(size=n)
    return X, y


FAST = {"max_iter": 100}


# --------------------------------------------------------------------------- scikit-learn contract


@parametrize_with_checks([LatticeRegressor(max_iter=100), LatticeClassifier(max_iter=30)])
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


# ---------------------------------------------------------------------------------- fit/predict


def test_regressor_fits_an_array_and_keeps_declared_directions():
    X, y = _table()
    model = LatticeRegressor(features={"x0": "increasing", 1: "decreasing"}, **FAST).fit(X, y)
    assert model.score(X, y) > 0.9
    assert model.predict(X).shape == (300,) and model.n_iter_ == 100
    assert [f.monotonicity for f in model.features_] == [1, -1, 0]
    assert model.check_monotone(X) == {"x0": 0.0, "x1": 0.0}
    assert not model.model_.training  # the check leaves the model as it found it
    # Quantile keypoints: each piece holds about as many training samples.
    counts = np.histogram(X[:, 0], bins=model.keypoints_[0])[0]
    assert counts.min() >= 0.5 * counts.mean()


def test_regressor_fits_a_dataframe_by_column_name():
    pandas = pytest.importorskip("pandas")
    X, y = _table()
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
    X, y = _table(400)
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
    X, y = _table(400)
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
    X, y = _table()
    params = {"validation_fraction": 0.2, "n_iter_no_change": 3, "max_iter": 500, "batch_size": 64}
    first = LatticeRegressor(**params).fit(X, y)
    assert first.n_iter_ < 500 and len(first.loss_curve_) == first.n_iter_
    np.testing.assert_array_equal(first.predict(X), LatticeRegressor(**params).fit(X, y).predict(X))
    assert first.score(X, y) > 0.8


def test_fit_runs_on_its_torch_threads_and_gives_them_back(monkeypatch):
    X, y = _table(50)
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


# ------------------------------------------------------------------------------------ monotone


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
    X, y = _table()
    model = LatticeRegressor(features={"x0": "decreasing", "x1": "increasing"}, max_iter=30).fit(X, -y)
    assert 0 in _exact_features(model)
    grid = np.repeat(X[:16], 2001, axis=0)
    grid[:, 0] = np.tile(np.linspace(-0.2, 1.2, 2001), 16)
    assert (np.diff(model.predict(grid).reshape(16, 2001), axis=1) <= 0).all()
    assert model.check_monotone(X, num_steps=500)["x0"] == 0.0


def test_concave_and_convex_calibrators_come_out_so():
    X, y = _table()
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
    X, y = _table()
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


# ------------------------------------------------------------------------- categories, missing


def _with_categories_and_gaps(n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    size = rng.choice(["small", "medium", "large"], n)
    income = rng.uniform(0, 10, n)
    y = {"small": 0.0, "medium": 1.0, "large": 3.0}
    target = np.array([y[s] for s in size]) + 0.2 * income
    income[:40] = np.nan  # missing, where the target is high
    target[:40] = 6.0
    code = rng.uniform(0, 1, n)
    code[40:60] = -1.0  # a declared missing value
    X = np.empty((n, 3), dtype=object)
    X[:, 0], X[:, 1], X[:, 2] = size, income, code
    return X, target


def test_categories_in_declared_order_and_missing_values_get_their_own_output():
    X, y = _with_categories_and_gaps()
    declared = {
        "x0": {"categories": ["small", "medium", "large"], "monotonicity": "increasing"},
        "x1": {"monotonicity": "increasing", "missing": True},
        "x2": {"missing": -1.0},
    }
    model = LatticeRegressor(features=declared, max_iter=200).fit(X, y)
    assert model.categories_[0] == ["small", "medium", "large"]
    prediction = model.predict(X)
    assert np.isfinite(prediction).all()
    assert abs(prediction[:40].mean() - 6.0) < 0.5  # learned, not NaN, not an average
    assert model.score(X, y) > 0.9
    assert model.check_monotone(X) == {"x0": 0.0, "x1": 0.0}
    outputs = model.model_.calibrators[0].category_outputs()
    assert (outputs.diff() >= 0).all()
    unseen = X[:3].copy()
    unseen[:, 0] = "huge"
    with pytest.raises(ValueError, match="'huge', which is not one of its categories"):
        model.predict(unseen)


def test_an_unseen_category_is_missing_when_the_feature_may_be():
    X, y = _with_categories_and_gaps()
    X = X[40:, [0, 2]]  # no gaps
    model = LatticeRegressor(features={"x0": {"categorical": True, "missing": True}}, max_iter=5).fit(
        X, y[40:]
    )
    unseen = X[:2].copy()
    unseen[:, 0] = ["huge", None]
    prediction = model.predict(unseen)
    assert prediction[0] == prediction[1] and np.isfinite(prediction).all()


@pytest.mark.parametrize(
    ("column", "message"),
    [(np.nan, "contains NaN in feature 'x1'.*missing"), (np.inf, "infinity in feature 'x1'")],
)
def test_undeclared_missing_and_infinite_values_are_refused(column, message):
    X, y = _table(50)
    X[3, 1] = column
    with pytest.raises(ValueError, match=message):
        LatticeRegressor(max_iter=2).fit(X, y)


def test_text_in_a_numeric_feature_asks_for_a_categorical_declaration():
    X, y = _with_categories_and_gaps()
    with pytest.raises(ValueError, match="feature 'x0' holds values that are not numbers.*categorical"):
        LatticeRegressor(max_iter=2, features={"x1": {"missing": True}}).fit(X, y)


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ({"x0": "upward"}, "unknown spec 'upward'"),
        ({"x0": {"monotone": 1}}, r"unknown keys \['monotone'\]"),
        ({"age": "increasing"}, "declares 'age', which X does not have"),
        ({"x0": "increasing", 0: "decreasing"}, "declared twice"),
        ({"x0": {"categorical": True, "convexity": "convex"}}, "cannot be convex"),
        ({"x0": {"monotonicity": 2}}, "monotonicity must be"),
        ({"x0": {"missing": "n/a"}}, "missing is True, False or a finite number"),
        ({"x0": {"num_keypoints": 1}}, "num_keypoints"),
    ],
)
def test_bad_declarations_name_the_feature(features, message):
    X, y = _table(20)
    with pytest.raises(ValueError, match=message):
        LatticeRegressor(features=features, max_iter=2).fit(X, y)


# ------------------------------------------------------------------------------------ save/load


def test_save_and_load_round_trip(tmp_path):
    X, y = _with_categories_and_gaps()
    declared = {
        "x0": {"categories": ["small", "medium", "large"], "monotonicity": 1},
        "x1": {"missing": True},
    }
    model = LatticeRegressor(features=declared, max_iter=20).fit(X, y)
    model.save(tmp_path / "model.pt")
    loaded = LatticeRegressor.load(tmp_path / "model.pt", features={"x0": declared["x0"]})
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert loaded.get_params() == model.get_params()
    labels = (y > 2).astype(int)
    classifier = LatticeClassifier(features={0: "categorical", 1: {"missing": True}}, max_iter=20).fit(
        X, labels
    )
    classifier.save(tmp_path / "classifier.pt")
    again = LatticeClassifier.load(tmp_path / "classifier.pt")
    np.testing.assert_array_equal(again.predict_proba(X), classifier.predict_proba(X))
    np.testing.assert_array_equal(again.classes_, classifier.classes_)
    with pytest.raises(ValueError, match="holds a LatticeClassifier, not a LatticeRegressor"):
        LatticeRegressor.load(tmp_path / "classifier.pt")


def _tamper(path, edit):
    data = torch.load(path, weights_only=True)
    edit(data)
    torch.save(data, path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["state"]["constraints"].fill_(0), "declared with feature constraints"),
        (lambda d: d["features"][0].update(monotonicity=0), "disagree with its declaration"),
        (lambda d: d["params"].update(features={"x1": "decreasing"}), "disagree with its declaration"),
        (lambda d: d["state"].pop("constraints"), "Missing key"),
    ],
    ids=["state", "features", "params", "no-constraints"],
)
def test_a_file_with_altered_constraints_is_refused(tmp_path, edit, message):
    X, y = _table(60)
    LatticeRegressor(features={"x0": "increasing", "x1": "decreasing"}, max_iter=2).fit(X, y).save(
        tmp_path / "m.pt"
    )
    _tamper(tmp_path / "m.pt", edit)
    with pytest.raises((ValueError, RuntimeError), match=message):
        LatticeRegressor.load(tmp_path / "m.pt")


def test_load_refuses_a_model_without_the_expected_constraints(tmp_path):
    X, y = _table(60)
    LatticeRegressor(features={"x0": "increasing"}, max_iter=2).fit(X, y).save(tmp_path / "m.pt")
    with pytest.raises(ValueError, match="'x1': monotonicity: expected decreasing, the file has none"):
        LatticeRegressor.load(tmp_path / "m.pt", features={"x0": "increasing", "x1": "decreasing"})
    with pytest.raises(ValueError, match="declares 'age'"):
        LatticeRegressor.load(tmp_path / "m.pt", features={"age": "increasing"})


def test_a_full_disk_during_save_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    X, y = _table(60)
    model = LatticeRegressor(max_iter=2).fit(X, y)
    path = tmp_path / "m.pt"
    model.save(path)
    before = path.read_bytes()
    disk_full_at(monkeypatch, 1)
    with pytest.raises(OSError, match=rf"cannot write the model file {path}: No space left on device$"):
        model.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt"] and path.read_bytes() == before


def _ensemble_file(tmp_path, **params):
    """A saved regressor: over 3 features, one lattice (1, 2, 2, 2); over 5 features with
    lattice_rank 2, an ensemble of 5 lattices (5, 2, 2)."""
    columns = 5 if params.get("lattice_rank") == 2 else 3
    X = np.random.default_rng(0).uniform(0, 1, (60, columns))
    LatticeRegressor(max_iter=2, **params).fit(X, X.sum(1)).save(tmp_path / "m.pt")
    return tmp_path / "m.pt"


@pytest.mark.parametrize(
    ("params", "edit", "message"),
    [
        (
            {},
            {"lattice_size": 150},
            r"lattice_size 150 declares lattices of shape \(1, 150, 150, 150\), but its "
            r"parameters hold \(1, 2, 2, 2\)",
        ),
        ({}, {"lattice_size": 3}, r"lattice_size 3 declares lattices of shape \(1, 3, 3, 3\)"),
        ({}, {"lattice_rank": 1}, r"lattice_rank 1 declares lattices of shape \(6, 2\)"),
        (
            {"lattice_rank": 2},
            {"num_lattices": 10**6},
            r"num_lattices 1000000 declares lattices of shape \(1000000, 2, 2\)",
        ),
        ({"kind": "linear"}, {"kind": "lattice"}, "its kind 'lattice' declares lattices, but it holds none"),
        ({}, {"lattice_size": "big"}, "lattice_size 'big' is not a positive integer"),
    ],
    ids=["lattice_size-150", "lattice_size-3", "lattice_rank", "num_lattices", "kind", "not-a-number"],
)
def test_a_file_declaring_other_sizes_than_it_holds_is_refused_before_building(
    tmp_path, params, edit, message
):
    path = _ensemble_file(tmp_path, **params)
    _tamper(path, lambda d: d["params"].update(edit))
    with pytest.raises(ValueError, match=rf"^{path}: .*{message}"):
        LatticeRegressor.load(path)


def test_load_runs_no_code_from_the_file(tmp_path):
    torch.save(
        {"format": "fastload.monotonic.estimator/1", "payload": Lattice([2], [1])}, tmp_path / "evil.pt"
    )
    with pytest.raises(Exception, match="[Ww]eights only"):
        LatticeRegressor.load(tmp_path / "evil.pt")
    torch.save({"something": "else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a file written by LatticeRegressor.save"):
        LatticeRegressor.load(tmp_path / "other.pt")


# ---------------------------------------------------------------------------------------- plots


def test_plot_calibrators_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    X, y = _with_categories_and_gaps()
    declared = {
        "x0": {"categories": ["small", "medium", "large"], "monotonicity": 1},
        "x1": {"missing": True},
    }
    model = LatticeRegressor(features=declared, max_iter=5).fit(X, y)
    path = plot_calibrators(model, tmp_path / "calibrators.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="fitted"):
        plot_calibrators(LatticeRegressor(), tmp_path / "unfitted.png")


def test_plot_calibrators_names_matplotlib_when_it_is_missing(tmp_path, monkeypatch):
    X, y = _table(30)
    model = LatticeRegressor(max_iter=2).fit(X, y)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(fastload.MissingDependencyError, match="plot_calibrators needs matplotlib"):
        plot_calibrators(model, tmp_path / "x.png")


# ----------------------------------------------------------------------- reviewed defects (#18)


@pytest.mark.parametrize(
    "random_state", [1, None, np.random.RandomState(7)], ids=["int", "None", "RandomState"]
)
def test_a_model_with_an_ensemble_loads_whatever_its_random_state(tmp_path, random_state):
    """Past lattice_rank features the ensemble's subsets come from the seed fit drew."""
    X = np.random.default_rng(0).uniform(size=(40, 6))
    model = LatticeRegressor(features={"x0": "increasing"}, max_iter=2, random_state=random_state)
    model.fit(X, X.sum(1)).save(tmp_path / "m.pt")
    loaded = LatticeRegressor.load(tmp_path / "m.pt")
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert loaded.seed_ == model.seed_


def test_numpy_values_in_the_parameters_save_as_plain_values(tmp_path):
    X, y = _with_categories_and_gaps(60)
    declared = {
        "x0": {"categories": np.array(["small", "medium", "large"]), "monotonicity": 1},
        "x1": {"missing": np.True_, "num_keypoints": np.int64(4)},
        "x2": {"missing": np.float64(-1.0)},
    }
    model = LatticeRegressor(
        features=declared, num_keypoints=np.int64(5), learning_rate=np.float64(0.05), max_iter=np.int64(2)
    )
    model.fit(X, y).save(tmp_path / "m.pt")
    loaded = LatticeRegressor.load(tmp_path / "m.pt")
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert loaded.get_params()["num_keypoints"] == 5
    model.set_params(features={"x0": {"categories": [object(), "a"]}})  # not refitted: save reads it
    with pytest.raises(ValueError, match="parameter 'features'"):
        model.save(tmp_path / "unsavable.pt")


def test_a_monotone_category_order_must_be_declared():
    pandas = pytest.importorskip("pandas")
    X, y = _with_categories_and_gaps(60)
    frame = pandas.DataFrame({"size": X[:, 0]})
    with pytest.raises(ValueError, match=r"feature 'size'.*categories=\[\.\.\.\]"):
        LatticeRegressor(features={"size": "increasing"}, max_iter=2).fit(frame, y)
    # An ordered pandas Categorical declares its order; an unordered one does not.
    ordered = ["small", "medium", "large"]
    frame["size"] = pandas.Categorical(X[:, 0], categories=ordered, ordered=True)
    model = LatticeRegressor(features={"size": "increasing"}, max_iter=2).fit(frame, y)
    assert model.categories_[0] == ordered
    frame["size"] = pandas.Categorical(X[:, 0], categories=ordered)
    with pytest.raises(ValueError, match="feature 'size'"):
        LatticeRegressor(features={"size": "increasing"}, max_iter=2).fit(frame, y)
    assert LatticeRegressor(max_iter=2).fit(frame, y).categories_[0] == sorted(ordered)


def test_load_compares_the_constraints_and_names_the_field_that_differs(tmp_path):
    X, y = _with_categories_and_gaps(60)
    declared = {
        "x0": {"categories": ["small", "medium", "large"], "monotonicity": 1},
        "x1": {"monotonicity": "increasing", "missing": True, "num_keypoints": 4},
        "x2": {"missing": -1.0},
    }
    LatticeRegressor(features=declared, max_iter=2).fit(X, y).save(tmp_path / "m.pt")
    # num_keypoints and the missing sentinel are not constraints.
    expected = {"x1": {"monotonicity": "increasing", "missing": True}, "x2": {"missing": True}}
    LatticeRegressor.load(tmp_path / "m.pt", features=expected)
    with pytest.raises(ValueError, match="'x1': missing: expected False, the file has True"):
        LatticeRegressor.load(tmp_path / "m.pt", features={"x1": "increasing"})
    with pytest.raises(ValueError, match=r"'x0': categories: expected \['large', 'medium', 'small'\]"):
        LatticeRegressor.load(
            tmp_path / "m.pt",
            features={"x0": {"categories": ["large", "medium", "small"], "monotonicity": 1}},
        )
    with pytest.raises(ValueError, match="declares 'age', which the file's model does not have"):
        LatticeRegressor.load(tmp_path / "m.pt", features={"age": "increasing"})


@pytest.mark.parametrize("count", [0, 1, 2.5, "10"])
def test_the_keypoint_count_is_checked(count):
    X, y = _table(20)
    with pytest.raises(ValueError, match="num_keypoints must be an int >= 2"):
        LatticeRegressor(num_keypoints=count, max_iter=2).fit(X, y)


def test_text_in_a_numeric_column_at_predict_time_names_the_feature():
    pandas = pytest.importorskip("pandas")
    X, y = _table(30)
    frame = pandas.DataFrame(X, columns=["a", "b", "c"])
    model = LatticeRegressor(max_iter=2).fit(frame, y)
    frame["b"] = frame["b"].astype(object)
    frame.loc[3, "b"] = "n/a"
    with pytest.raises(ValueError, match="feature 'b' holds values that are not numbers") as error:
        model.predict(frame)
    assert "categorical" not in str(error.value)


def test_missing_none_means_no_missing_values():
    X, y = _table(20)
    assert not LatticeRegressor(features={"x0": {"missing": None}}, max_iter=2).fit(X, y).features_[0].missing
    X[0, 0] = np.nan
    with pytest.raises(ValueError, match="contains NaN in feature 'x0'"):
        LatticeRegressor(features={"x0": {"missing": None}}, max_iter=2).fit(X, y)


def test_mixed_column_names_are_kept_as_strings():
    pandas = pytest.importorskip("pandas")
    X, y = _table(30)
    frame = pandas.DataFrame(X, columns=["a", 1, "c"])
    model = LatticeRegressor(features={"a": "increasing"}, max_iter=2).fit(frame, y)
    assert list(model.feature_names_in_) == ["a", "1", "c"]
    assert model.features_[0].monotonicity == 1
    np.testing.assert_array_equal(model.predict(frame), model.predict(frame.copy()))


def test_a_label_of_none_is_refused_clearly():
    X = np.random.default_rng(0).uniform(size=(6, 2))
    with pytest.raises(ValueError, match="None"):
        LatticeClassifier(max_iter=2).fit(X, np.array(["a", "b", None, "a", "b", "a"], dtype=object))
