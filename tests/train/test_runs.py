"""The runs of a group (train/runs.py): per-run lists split as the caller spells the options,
the exit status of a group, and the table of runs sorted best first. How `fit_many` and
`fastload train --runs` take runs end to end is in tests/train/test_train_fit_many.py."""

import pytest

from fastload.train.runs import exit_status, resolve_runs, runs_from_values, runs_table, split_values


def test_split_values_names_options_as_the_caller_spells_them():
    assert split_values({"lr": [1.0], "seed": [1, 2]}, 2) == ({"lr": 1.0}, {"seed": [1, 2]})
    assert split_values({"lr": [1.0]}) == ({"lr": 1.0}, {})
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    with pytest.raises(ValueError, match="^--weight-decay gives 2 values for --runs 3: give 1 or 3$"):
        split_values({"weight_decay": [0, 1]}, 3, spell=flag)
    with pytest.raises(ValueError, match=r"^--seed gives 2 values for one run: give 1 \(or use --runs\)$"):
        split_values({"seed": [0, 1]}, spell=flag)
    assert runs_from_values({"lr": [1, 2], "seed": [3, 4]}, 2) == [dict(lr=1, seed=3), dict(lr=2, seed=4)]
    assert runs_from_values({}, 2) == [{}, {}]
    assert resolve_runs(2, {"lr": [1, 2], "epochs": 3}) == ([dict(lr=1), dict(lr=2)], {"epochs": 3})


class _Stopped:
    def __init__(self, stopped):
        self.stopped = stopped


@pytest.mark.parametrize(
    "stops, status",
    [
        ([None], 0),
        (["diverged: step 3"], 1),
        (["diverged: step 3", "diverged: step 4"], 1),
        (["diverged: step 3", None], 0),
        (["no better validation RMSE for 2 epochs (patience 2)"], 0),
    ],
)
def test_the_exit_status_is_1_only_when_every_run_diverged(stops, status):
    assert exit_status([_Stopped(s) for s in stops]) == status


class _Result:
    """What runs_table reads of a FitResult."""

    def __init__(self, name, task, last):
        self.name, self.task, self.history = name, task, [last]
        self.completed, self.stopped, self.steps, self.state_bytes = True, None, 10, 1000


def test_runs_table_breaks_ties_by_validation_loss_then_error():
    classified = [
        _Result("run0", "classification", {"val_accuracy": 0.5, "val_loss": 1.366}),
        _Result("run1", "classification", {"val_accuracy": 0.25, "val_loss": 0.9}),
        _Result("run2", "classification", {"val_accuracy": 0.5, "val_loss": 1.27}),
    ]
    rows = runs_table(classified, [{"lr": 1}, {"lr": 2}, {"lr": 3}]).splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["run2", "run0", "run1"]
    regressed = [
        _Result("run0", "regression", {"val_rmse": 0.2, "val_mae": 0.15}),
        _Result("run1", "regression", {"val_rmse": 0.2, "val_mae": 0.1}),
    ]
    rows = runs_table(regressed, [{}, {}]).splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["run1", "run0"]
