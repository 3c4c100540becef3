"""Tests for fastload.monotonic.features through the estimators: declarations by name or
position and their refusals, categories in declared order, missing values and unseen
categories, keypoint counts, column names, and the checks of X and y."""

from __future__ import annotations

import numpy as np
import pytest
from monotone_helpers import (
    assert_monotone_up_to_rounding,
    one_thread,  # noqa: F401 (an autouse fixture)
    table_with_categories_and_gaps,
    three_feature_table,
)

from fastload.monotonic import LatticeClassifier, LatticeRegressor


def test_categories_in_declared_order_and_missing_values_get_their_own_output():
    X, y = table_with_categories_and_gaps()
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
    assert_monotone_up_to_rounding(model, X)
    outputs = model.model_.calibrators[0].category_outputs()
    assert (outputs.diff() >= 0).all()
    unseen = X[:3].copy()
    unseen[:, 0] = "huge"
    with pytest.raises(ValueError, match="'huge', which is not one of its categories"):
        model.predict(unseen)


def test_an_unseen_category_is_missing_when_the_feature_may_be():
    X, y = table_with_categories_and_gaps()
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
    X, y = three_feature_table(50)
    X[3, 1] = column
    with pytest.raises(ValueError, match=message):
        LatticeRegressor(max_iter=2).fit(X, y)


def test_text_in_a_numeric_feature_asks_for_a_categorical_declaration():
    X, y = table_with_categories_and_gaps()
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
    X, y = three_feature_table(20)
    with pytest.raises(ValueError, match=message):
        LatticeRegressor(features=features, max_iter=2).fit(X, y)


def test_a_monotone_category_order_must_be_declared():
    pandas = pytest.importorskip("pandas")
    X, y = table_with_categories_and_gaps(60)
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


@pytest.mark.parametrize("count", [0, 1, 2.5, "10"])
def test_the_keypoint_count_is_checked(count):
    X, y = three_feature_table(20)
    with pytest.raises(ValueError, match="num_keypoints must be an int >= 2"):
        LatticeRegressor(num_keypoints=count, max_iter=2).fit(X, y)


@pytest.mark.safety
def test_the_keypoint_count_is_bounded_for_the_estimator_and_each_feature():
    X, y = three_feature_table(50)
    with pytest.raises(ValueError, match="num_keypoints must be an int >= 2 and <= 1000, got 3000000"):
        LatticeRegressor(num_keypoints=3_000_000, max_iter=2).fit(X, y)
    with pytest.raises(ValueError, match="feature 'x1': num_keypoints must be an int >= 2 and <= 1000"):
        LatticeRegressor(features={"x1": {"num_keypoints": 10**7}}, max_iter=2).fit(X, y)


def test_keypoints_are_capped_by_the_distinct_values_of_a_feature(monkeypatch):
    """Quantiles at more positions than a feature has values only repeat them: the count asked
    for is cut to the values before any is computed."""
    X, y = three_feature_table(200)
    X[:, 1] = np.round(X[:, 1] * 4)  # five distinct values
    quantile = np.quantile
    positions = []

    def counted(values, q, *args, **kwargs):
        positions.append(np.size(q))
        return quantile(values, q, *args, **kwargs)

    monkeypatch.setattr(np, "quantile", counted)
    model = LatticeRegressor(num_keypoints=1000, max_iter=2).fit(X, y)
    assert len(model.keypoints_[1]) <= 5
    assert max(positions) <= 200  # never more positions than rows, let alone 1000
    assert_monotone_up_to_rounding(model, X)


@pytest.mark.safety
def test_a_value_beyond_float32_names_the_feature_not_a_parameter():
    X, y = three_feature_table(50)
    X[0, 2] = 1e308
    with pytest.raises(ValueError, match="feature 'x2' holds 1e\\+308, beyond float32") as err:
        LatticeRegressor(max_iter=2).fit(X, y)
    assert "input_keypoints" not in str(err.value)
    model = LatticeRegressor(max_iter=2).fit(*three_feature_table(50))
    with pytest.raises(ValueError, match="feature 'x2' holds -1e\\+308, beyond float32"):
        model.predict(np.array([[0.0, 0.0, -1e308]]))
    with pytest.raises(ValueError, match="Input y holds 1e\\+308, beyond float32"):
        LatticeRegressor(max_iter=2).fit(X[1:], np.r_[np.zeros(48), 1e308])


def test_text_in_a_numeric_column_at_predict_time_names_the_feature():
    pandas = pytest.importorskip("pandas")
    X, y = three_feature_table(30)
    frame = pandas.DataFrame(X, columns=["a", "b", "c"])
    model = LatticeRegressor(max_iter=2).fit(frame, y)
    frame["b"] = frame["b"].astype(object)
    frame.loc[3, "b"] = "n/a"
    with pytest.raises(ValueError, match="feature 'b' holds values that are not numbers") as error:
        model.predict(frame)
    assert "categorical" not in str(error.value)


def test_missing_none_means_no_missing_values():
    X, y = three_feature_table(20)
    assert not LatticeRegressor(features={"x0": {"missing": None}}, max_iter=2).fit(X, y).features_[0].missing
    X[0, 0] = np.nan
    with pytest.raises(ValueError, match="contains NaN in feature 'x0'"):
        LatticeRegressor(features={"x0": {"missing": None}}, max_iter=2).fit(X, y)


def test_mixed_column_names_are_kept_as_strings():
    pandas = pytest.importorskip("pandas")
    X, y = three_feature_table(30)
    frame = pandas.DataFrame(X, columns=["a", 1, "c"])
    model = LatticeRegressor(features={"a": "increasing"}, max_iter=2).fit(frame, y)
    assert list(model.feature_names_in_) == ["a", "1", "c"]
    assert model.features_[0].monotonicity == 1
    np.testing.assert_array_equal(model.predict(frame), model.predict(frame.copy()))


def test_a_label_of_none_is_refused_clearly():
    X = np.random.default_rng(0).uniform(size=(6, 2))
    with pytest.raises(ValueError, match="None"):
        LatticeClassifier(max_iter=2).fit(X, np.array(["a", "b", None, "a", "b", "a"], dtype=object))
