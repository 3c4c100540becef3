"""Tests for fastload.monotonic.regularizers through the estimators: each regulariser pulls the
fit the way it says (calibrators flat, straight or smooth; lattices flat or additive; weights
and vertex values toward zero), the guarantees hold whatever the strengths, and a strength
out of range is refused by name."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from monotone_helpers import (
    assert_monotone_up_to_rounding,
    one_thread,  # noqa: F401 (an autouse fixture)
    three_feature_table,
)

from fastload.monotonic import LatticeRegressor
from fastload.monotonic.regularizers import REGULARIZERS

FIXED = {"kind": "lattice", "max_iter": 200}


def _calibrator_outputs(model, j: int) -> torch.Tensor:
    return model.model_.calibrators[j].keypoint_outputs().detach()


def _vertex_values(model) -> torch.Tensor:
    return model.model_.lattices[0].bank.vertex_values(torch.float32).detach()


def _wavy_table(n: int = 300, seed: int = 0):
    """y bends and interacts: the unregularised fit uses both, so a penalty has work to do."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, 3))
    y = np.sin(6 * X[:, 0]) + 2 * X[:, 1] * X[:, 2] + 0.3 * rng.normal(size=n)
    return X, y


@pytest.mark.parametrize(
    ("strength", "measure"),
    [
        ("calibrator_laplacian", lambda m: _calibrator_outputs(m, 0).diff().abs().sum()),
        ("calibrator_hessian", lambda m: _calibrator_outputs(m, 0).diff(2).abs().sum()),
        ("calibrator_wrinkle", lambda m: _calibrator_outputs(m, 0).diff(3).abs().sum()),
        ("lattice_laplacian", lambda m: _vertex_values(m).diff(dim=1).abs().sum()),
        ("lattice_torsion", lambda m: _vertex_values(m).diff(dim=2).diff(dim=3).abs().sum()),
        ("l2", lambda m: _vertex_values(m).abs().sum()),
    ],
)
def test_each_regulariser_pulls_the_fit_its_way(strength, measure):
    X, y = _wavy_table()
    free = LatticeRegressor(**FIXED).fit(X, y)
    held = LatticeRegressor(**FIXED, **{strength: 10.0}).fit(X, y)
    assert float(measure(held)) < 0.5 * float(measure(free))
    assert held.chosen_params_[strength] == 10.0 and held.chosen_params_["kind"] == "lattice"


@pytest.mark.parametrize("kind", ["lattice", "linear"])
@pytest.mark.parametrize("strength", [1e-3, 1.0, 1e3])
def test_the_guarantees_hold_whatever_the_strengths(kind, strength):
    """The penalties shape the fit; the constraints are the layers' maps, untouched by them."""
    X, y = three_feature_table(200)
    features = {"x0": "increasing", "x1": "decreasing", "x2": "convex"}
    model = LatticeRegressor(
        features=features, kind=kind, max_iter=50, **dict.fromkeys(REGULARIZERS, strength)
    )
    model.fit(X, y)
    if kind == "lattice":
        assert_monotone_up_to_rounding(model, X)
    else:  # monotone up to the rounding of its matrix product (MonotoneLinear)
        assert all(v <= 1e-5 * (1 + np.abs(y).max()) for v in model.check_monotone(X).values())
    convex = _calibrator_outputs(model, 2)
    slopes = convex.diff() / torch.tensor(model.keypoints_[2]).diff().float()
    assert (slopes.diff() >= -1e-4 * (1 + slopes.abs().max())).all()


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), 1e308, "strong", True])
def test_a_strength_that_is_not_a_number_in_range_is_refused_by_name(value):
    X, y = three_feature_table(50)
    with pytest.raises(
        ValueError, match=re.escape(f"lattice_torsion must be a number from 0 to 1e+06, got {value!r}")
    ):
        LatticeRegressor(kind="lattice", max_iter=2, lattice_torsion=value).fit(X, y)


def test_a_regularised_linear_model_shrinks_its_weights():
    X, y = _wavy_table()
    free = LatticeRegressor(kind="linear", max_iter=200).fit(X, y)
    held = LatticeRegressor(kind="linear", max_iter=200, l2=10.0).fit(X, y)
    assert held.model_.linear.weight.abs().sum() < 0.5 * free.model_.linear.weight.abs().sum()
