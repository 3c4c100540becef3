"""benches/bench_small_tables.py, on two splits: every model gets a mean +- sd row, and the
default's chosen capacity is reported. Its figures are in benches/RESULTS.md."""

import pytest
from script_helpers import bench_script

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def bench():
    with bench_script("bench_small_tables") as module:
        yield module


def test_each_model_gets_a_row_with_its_spread_over_the_splits(bench, capsys):
    bench.run_table("diabetes", 2)
    out = capsys.readouterr().out
    for model in ("LatticeRegressor() (default)", "RidgeCV", "HGB(monotonic_cst)", "MLP"):
        (row,) = [line for line in out.splitlines() if line.startswith(f"| {model} |")]
        assert " ± " in row
    assert "The default chose: kind=lattice, early_stopping=True" in out


def test_the_declarations_give_gradient_boosting_the_same_constraints(bench):
    X, _, features, task = bench.breast_cancer()
    cst = bench.monotonic_cst(X.columns, features)
    assert task == "classification" and cst.count(-1) == len(features) and set(cst) == {0, -1}
