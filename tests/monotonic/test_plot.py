"""Tests for fastload.monotonic.plot: plot_calibrators writes a PNG, and names matplotlib when
it is missing."""

from __future__ import annotations

import sys

import pytest
from monotone_helpers import (
    one_thread,  # noqa: F401 (an autouse fixture)
    table_with_categories_and_gaps,
    three_feature_table,
)

import fastload
from fastload.monotonic import LatticeRegressor, plot_calibrators


def test_plot_calibrators_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    X, y = table_with_categories_and_gaps()
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
    X, y = three_feature_table(30)
    model = LatticeRegressor(max_iter=2).fit(X, y)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(fastload.MissingDependencyError, match="plot_calibrators needs matplotlib"):
        plot_calibrators(model, tmp_path / "x.png")
