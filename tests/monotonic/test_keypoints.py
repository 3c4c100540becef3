"""Keypoints placed where the target changes (fastload.monotonic.keypoints) and what they buy:
a LatticeRegressor fits a jump wherever it falls, in one feature or in two at once, by default.
Also the L-BFGS training path: its solver options, its sample-then-polish stage and its chunked
loss, which must train the same model as one pass over the rows."""

from __future__ import annotations

import numpy as np
import pytest
from monotone_helpers import one_thread  # noqa: F401 (an autouse fixture)

from fastload.monotonic import LatticeRegressor, fitting
from fastload.monotonic.keypoints import place_keypoints


def uniform_rows(n: int, features: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (n, features))


def test_a_jump_draws_keypoints_around_it_and_a_smooth_target_leaves_quantiles():
    x = uniform_rows(4000, 1)[:, 0]
    noise = 0.1 * np.random.default_rng(1).normal(size=len(x))
    jump = np.asarray(place_keypoints([x], 2.0 * (x > 0.437) + noise, [10])[0])
    assert jump[0] == pytest.approx(x.min()) and jump[-1] == pytest.approx(x.max())
    # The narrowest piece brackets the jump, far narrower than a tenth of the range.
    piece = np.argmin(np.diff(jump))
    assert jump[piece] <= 0.437 + 0.01 and jump[piece + 1] >= 0.437 - 0.01
    assert (np.abs(jump - 0.437) < 0.02).sum() >= 3
    smooth = np.asarray(place_keypoints([x], 2.0 * x + noise, [10])[0])
    np.testing.assert_allclose(smooth, np.quantile(x, np.linspace(0, 1, 10)), atol=0.02)


def test_keypoints_are_distinct_in_float32_and_cover_a_tied_feature():
    x = np.repeat([0.0, 1.0, 2.0], 200) + 1e-9 * np.arange(600)  # ties in float32
    points = place_keypoints([x, None], x, [10, 10])[0]
    assert np.all(np.diff(np.float32(points)) > 0)
    assert points[0] == pytest.approx(0.0) and points[-1] == pytest.approx(2.0, abs=1e-6)


def mse_against(model, target, seed: int = 1):
    X = uniform_rows(3000, model.n_features_in_, seed)
    return float(np.mean((model.predict(X) - target(X)) ** 2))


@pytest.mark.parametrize("where", [0.137, 0.5, 0.613])
def test_a_step_between_quantile_keypoints_is_fitted_by_default(where):
    """With 10 keypoints at quantiles a jump of 2 becomes a ramp over a tenth of the range:
    a test MSE of about 2^2 * 0.11 / 12 = 0.037. Placed keypoints bring it under a tenth of that.
    Fitted to L-BFGS's tolerance, as the default fits a table past 5,000 rows: the placement is
    what this measures, not early stopping, which a 5,000-row table gets from the default."""
    X = uniform_rows(5000, 3)
    target = lambda X: 2.0 * (X[:, 1] > where)  # noqa: E731
    y = target(X) + 0.1 * np.random.default_rng(2).normal(size=len(X))
    features = {"x0": "increasing", "x1": "increasing", "x2": "increasing"}
    model = LatticeRegressor(features=features, kind="lattice").fit(X, y)
    assert mse_against(model, target) < 0.0037
    assert max(model.check_monotone(X[:300]).values()) <= 1e-5


def test_steps_in_two_features_at_once_are_both_fitted():
    X = uniform_rows(6000, 4)
    target = lambda X: 1.0 * (X[:, 0] > 0.3) + 1.5 * (X[:, 2] > 0.7) + 0.5 * X[:, 3]  # noqa: E731
    y = target(X) + 0.1 * np.random.default_rng(3).normal(size=len(X))
    model = LatticeRegressor(features={"x0": "increasing", "x2": "increasing", "x3": "increasing"}).fit(X, y)
    assert mse_against(model, target) < 0.005


def test_lbfgs_options_are_checked():
    X = uniform_rows(100, 2)
    with pytest.raises(ValueError, match="solver must be"):
        LatticeRegressor(solver="sgd").fit(X, X[:, 0])
    with pytest.raises(ValueError, match="tol must be"):
        LatticeRegressor(tol=-1).fit(X, X[:, 0])
    with pytest.raises(ValueError, match="batch_size applies to solver='adam'"):
        LatticeRegressor(batch_size=32).fit(X, X[:, 0])


def test_a_sample_then_all_rows_trains_as_well_as_all_rows(monkeypatch):
    X = uniform_rows(2000, 3)
    y = 2 * X[:, 0] + np.sqrt(X[:, 1]) - X[:, 2] ** 2
    features = {"x0": "increasing", "x1": "increasing", "x2": "decreasing"}
    whole = LatticeRegressor(features=features).fit(X, y)
    monkeypatch.setattr(fitting, "SUBSAMPLE_ROWS", 500)
    sampled = LatticeRegressor(features=features).fit(X, y)
    assert sampled.n_iter_ > fitting.POLISH_ITER  # the sample's iterations, then the polish
    assert mse_against(sampled, lambda X: 2 * X[:, 0] + np.sqrt(X[:, 1]) - X[:, 2] ** 2) < 2 * max(
        mse_against(whole, lambda X: 2 * X[:, 0] + np.sqrt(X[:, 1]) - X[:, 2] ** 2), 1e-3
    )


def test_the_loss_in_chunks_trains_the_model_of_one_pass(monkeypatch):
    X = uniform_rows(600, 3)
    y = X[:, 0] + X[:, 1] * X[:, 2]
    one_pass = LatticeRegressor(features={"x0": "increasing"}, max_iter=20, tol=0).fit(X, y)
    monkeypatch.setattr(fitting, "CHUNK_ROWS", 64)
    chunked = LatticeRegressor(features={"x0": "increasing"}, max_iter=20, tol=0).fit(X, y)
    np.testing.assert_allclose(chunked.loss_curve_, one_pass.loss_curve_, rtol=1e-3)
    np.testing.assert_allclose(chunked.predict(X), one_pass.predict(X), atol=1e-3)


def test_a_seed_gives_the_same_fit_with_or_without_the_sample_stage(monkeypatch):
    X = uniform_rows(1200, 3)
    y = X[:, 0] + (X[:, 1] > 0.4) + 0.1 * np.random.default_rng(4).normal(size=len(X))
    fits = [LatticeRegressor(random_state=7).fit(X, y) for _ in range(2)]
    np.testing.assert_array_equal(fits[0].predict(X), fits[1].predict(X))
    monkeypatch.setattr(fitting, "SUBSAMPLE_ROWS", 400)
    sampled = [LatticeRegressor(random_state=7).fit(X, y) for _ in range(2)]
    np.testing.assert_array_equal(sampled[0].predict(X), sampled[1].predict(X))
    assert sampled[0].keypoints_ == fits[0].keypoints_  # placed from every row below 2^18
