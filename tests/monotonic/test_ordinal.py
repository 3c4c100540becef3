"""Ordered classes (fastload.monotonic.ordinal and LatticeClassifier(ordinal=True) or an ordered
pandas Categorical y): P(y >= k) is monotone in every declared feature for every k, for any
parameters, not only trained ones; the loss is the likelihood; the order survives save and load."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from monotone_helpers import (  # noqa: F401 (one_thread: an autouse fixture)
    SCALES,
    assert_monotone_up_to_rounding,
    one_thread,
    randomize,
    rounding_bound,
    sweep,
)

from fastload.monotonic import LatticeClassifier
from fastload.monotonic.features import Feature
from fastload.monotonic.fitting import TableModel
from fastload.monotonic.ordinal import CumulativeLink, class_probabilities, ordinal_loss

DIRECTIONS = st.sampled_from([1, -1, 0])


@settings(max_examples=40, deadline=None)
@example(directions=[1, -1, 1, 1, 1], classes=6, seed=14116, scale=30.0, kind="lattice")  # fell 1.6e-6
@given(
    directions=st.lists(DIRECTIONS, min_size=1, max_size=6),
    classes=st.integers(2, 6),
    seed=st.integers(0, 2**16),
    scale=SCALES,
    kind=st.sampled_from(["lattice", "linear"]),
)
def test_every_cumulative_probability_is_monotone_for_any_parameters(directions, classes, seed, scale, kind):
    features = [Feature(f"x{j}", monotonicity=m) for j, m in enumerate(directions)]
    keypoints = [[0.0, 0.3, 0.5, 1.0]] * len(features)
    model = TableModel(features, keypoints, [None] * len(features), 2, 4, None, 1, seed, kind, classes)
    randomize(model, seed, scale)
    base = torch.rand(8, len(features), generator=torch.Generator().manual_seed(seed))
    values = torch.linspace(-0.2, 1.2, 33)
    # A sigmoid may split a tie by an ulp; along an input a lattice keeps monotone only up to
    # the rounding bound constraints.py states, which the sigmoid (slope at most 1/4) shrinks.
    bound = (
        1e-6 + max((rounding_bound(lattice) for lattice in getattr(model, "lattices", [])), default=0.0) / 4
    )
    with torch.no_grad():
        for j, direction in enumerate(directions):
            at_least = sweep(lambda x: torch.sigmoid(model(x)), base, j, values)  # (steps, 8 * (K-1))
            if direction:
                steps = direction * at_least.diff(dim=0)
                assert steps.min() >= -bound, (j, steps.min(), bound)
        probabilities = class_probabilities(model(base))
    assert probabilities.shape == (8, classes) and probabilities.min() >= 0
    torch.testing.assert_close(probabilities.sum(1), torch.ones(8, dtype=probabilities.dtype))


def test_the_loss_is_the_negative_log_likelihood():
    link = CumulativeLink(4)
    with torch.no_grad():
        link.raw.copy_(torch.tensor([-1.0, 0.3, 1.2]))
    cumulative = link(torch.tensor([-2.0, 0.0, 0.5, 3.0]))
    codes = torch.tensor([0, 1, 2, 3])
    naive = -torch.log(class_probabilities(cumulative)[torch.arange(4), codes]).mean()
    torch.testing.assert_close(ordinal_loss(cumulative, codes).mean(), naive)
    with pytest.raises(ValueError, match="num_classes must be >= 2"):
        CumulativeLink(1)


def ordered_table(n: int = 1500, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, 3))
    score = 2 * X[:, 0] - X[:, 1] + 0.3 * rng.normal(size=n)
    return X, np.digitize(score, [0.0, 0.6, 1.2])


def test_an_ordered_categorical_target_gives_monotone_class_at_least_probabilities(tmp_path):
    pandas = pytest.importorskip("pandas")
    X, codes = ordered_table()
    names = ["top", "high", "mid", "low"][::-1]  # alphabetical order is not the order
    y = pandas.Series(pandas.Categorical(np.array(names)[codes], categories=names, ordered=True))
    model = LatticeClassifier(features={"x0": "increasing", "x1": "decreasing"}).fit(X, y)
    assert model.ordinal_ and list(model.classes_) == names
    assert model.score(X, y) > 0.6
    grid = np.tile(X[:50], (21, 1))
    grid[:, 0] = np.repeat(np.linspace(0, 1, 21), 50)
    at_least = np.cumsum(model.predict_proba(grid)[:, ::-1], 1)[:, ::-1].reshape(21, 50, 4)
    assert np.diff(at_least, axis=0).min() >= -1e-6
    assert_monotone_up_to_rounding(model, X[:200])
    model.save(tmp_path / "m.pt")
    loaded = LatticeClassifier.load(tmp_path / "m.pt")
    assert loaded.ordinal_ and list(loaded.classes_) == names
    np.testing.assert_allclose(loaded.predict_proba(X), model.predict_proba(X))


def test_ordinal_true_orders_sorted_labels_and_unordered_classes_keep_the_softmax():
    X, codes = ordered_table(600)
    ordinal = LatticeClassifier(features={"x0": "increasing"}, ordinal=True).fit(X, codes)
    assert ordinal.ordinal_ and ordinal.decision_function(X).shape == (600, 3)
    nominal = LatticeClassifier(features={"x0": "increasing"}).fit(X, codes)
    assert not nominal.ordinal_ and nominal.decision_function(X).shape == (600, 4)
    binary = LatticeClassifier(ordinal=True).fit(X, codes > 1)
    assert not binary.ordinal_  # two classes: the logistic model already is the cumulative one
