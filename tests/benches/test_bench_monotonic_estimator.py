"""benches/bench_monotonic_estimator.py, on tiny sizes: the comparison gives each model's fit
time, test error and (for the lattice model) its worst violation, and ``--scaling`` a row per
setting. Its figures are in benches/RESULTS.md."""

import math

import pytest
from script_helpers import bench_script

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def bench():
    with bench_script("bench_monotonic_estimator") as module:
        yield module


@pytest.mark.parametrize("task", ["step", "ordinal"])
def test_the_comparison_measures_every_model(bench, task):
    results = bench.measure(task, 400, repeats=1)
    assert set(results) == {"lattice", "HGB", "HGB 1 thread"}
    for model, (seconds, error, worst) in results.items():
        assert seconds > 0 and 0 <= error < 1.5
        assert math.isnan(worst) != (model == "lattice")
    assert 0 <= results["lattice"][2] < 1e-4


def test_scaling_gives_a_row_per_setting(bench, capsys):
    bench.scaling([300], repeats=1)
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[2:]]
    settings = [tuple(cell.strip() for cell in row[:4]) for row in rows]
    assert settings == [
        ("300", "6", "10", "1"),
        ("300", "12", "10", "1"),
        ("300", "24", "10", "1"),
        ("300", "6", "20", "1"),
        ("300", "6", "40", "1"),
        ("300", "6", "10", "2"),
    ]
    assert all(float(row[4]) > 0 and int(row[5]) >= 1 for row in rows)
