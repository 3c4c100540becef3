"""benches/bench_monotonic.py's comparison table: that `table --quick` gives every (task, method)
row, and that its worst-decrease measure sees a decrease where there is one and none elsewhere.
The full table is in benches/RESULTS.md; pytorch-lattice and scikit-learn rows appear only when
those packages are installed."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from script_helpers import bench_script


@pytest.fixture(scope="module")
def bench():
    with bench_script("bench_monotonic") as module:
        yield module


def test_quick_table_has_a_row_per_task_and_method(bench):
    with bench.one_thread():
        rows = bench.table_rows(bench.QUICK)
    expected = [
        (task, n, method)
        for task, n, monotonicities, _ in bench._tasks(bench.QUICK)
        for method in bench.methods(len(monotonicities))
    ]
    assert [(row.task, row.n, row.method) for row in rows] == expected
    assert {task for task, _, _ in expected} == {"step", "sigmoid", "log", "tabular 8-D"}
    for row in rows:
        assert len(row.rmses) == len(row.seconds) == bench.QUICK.seeds
        assert all(math.isfinite(r) and r > 0 for r in row.rmses), row
        assert row.worst_grid >= 0 and row.worst_pairs >= 0
    assert {"fastload", "fastload LatticeRegressor"} <= {row.method for row in rows}
    for row in rows:
        if row.method.startswith("fastload") and row.task != "tabular 8-D":
            # A calibrator, and a lattice in its first monotone input, are monotone under rounding
            # (fastload.monotonic.constraints' docstring); the regressor's affine unscaling keeps it.
            assert row.worst_grid == row.worst_pairs == 0.0, row
        if row.method.startswith("fastload") or row.method.startswith("sklearn"):
            assert row.worst_grid <= 1e-5 and row.worst_pairs <= 1e-5, row
    table = bench.markdown(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert table[2].startswith("| step | 200 | fastload | ")


def test_worst_decrease_of_a_decreasing_function_is_its_drop(bench):
    budget = bench.QUICK
    spacing = (bench.DOMAIN[1] - bench.DOMAIN[0]) / (budget.grid_points - 1)
    grid, pairs = bench.worst_decrease(lambda x: -x[:, 0], [1], budget)
    assert grid == pytest.approx(spacing)
    assert spacing < pairs <= bench.DOMAIN[1] - bench.DOMAIN[0]
    assert bench.worst_decrease(lambda x: -x[:, 0], [-1], budget) == (0.0, 0.0)
    assert bench.worst_decrease(lambda x: x[:, 0], [1], budget) == (0.0, 0.0)


def test_worst_decrease_on_eight_inputs_looks_only_along_monotone_ones(bench):
    monotonicities = bench.TABULAR_MONOTONICITIES  # 3 increasing, 1 decreasing, 4 free

    def monotone(x):
        return x[:, :3].sum(1) - x[:, 3] + np.sin(10 * x[:, 4]) + x[:, 5] * x[:, 6]

    assert bench.worst_decrease(monotone, monotonicities, bench.QUICK) == (0.0, 0.0)
    grid, pairs = bench.worst_decrease(lambda x: monotone(x) + x[:, 3] ** 2 * 3, monotonicities, bench.QUICK)
    assert grid > 0 and pairs > 0  # now increasing in the decreasing input 3 above x3 = 1/6


def test_worst_decrease_refuses_nan_predictions(bench):
    """NaN compares as neither larger nor smaller: unchecked, a NaN model would pass as monotone."""

    def predict(x):
        return np.where(x[:, 0] > 0.5, np.nan, x[:, 0])

    with pytest.raises(ValueError, match="NaN or infinite"):
        bench.worst_decrease(predict, [1], bench.QUICK)


@settings(max_examples=20, deadline=None)
@given(step_at=st.floats(0.05, 0.95), drop=st.floats(0.01, 10.0))
def test_worst_decrease_finds_a_hidden_drop(bench, step_at, drop):
    """An increasing ramp with one downward step of ``drop``: the grid sees all of it but the
    ramp's rise over one grid step; random pairs straddling the step see most of it."""
    budget = bench.QUICK

    def predict(x):
        return x[:, 0] - drop * (x[:, 0] > step_at)

    spacing = (bench.DOMAIN[1] - bench.DOMAIN[0]) / (budget.grid_points - 1)
    grid, pairs = bench.worst_decrease(predict, [1], budget)
    assert drop - spacing - 1e-9 <= grid <= drop
    assert drop / 2 - 0.1 <= pairs <= drop
