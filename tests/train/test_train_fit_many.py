"""`fastload.fit_many` and `fastload train --runs`: several models trained on one stream of
batches, each ending exactly where it would alone; one run stopping without the others."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import fastload
from fastload import cli
from fastload.store import StoreWriter
from fastload.train import config as train_config
from fastload.train import fit, format_epoch, stacked
from fastload.train import trainer as train_mod

COUNT, SIDE = 40, 8
SHARED = dict(epochs=2, batch_size=8, device="cpu", threads=1, deterministic=True)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("many") / "bright.fastload"
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (COUNT, SIDE, SIDE, 3), dtype=np.uint8)
    with StoreWriter(path, (SIDE, SIDE, 3)) as writer:
        writer.extend(images, images.reshape(COUNT, -1).mean(1) / 255.0)
    return path


def _assert_same_parameters(a, b):
    a, b = a.state_dict(), b.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


RUNS = [
    dict(name="slow", lr=1e-3, seed=0),
    dict(name="fast", lr=3e-2, seed=1, schedule="constant", weight_decay=0.01),
    dict(name="small-lattice", lr=3e-3, seed=2, lattice_size=2, num_features=4),
]


def test_each_run_ends_where_it_would_alone(store_path):
    logged = []
    results = fastload.fit_many(store_path, RUNS, seed=5, log=logged.append, **SHARED)
    assert [r.name for r in results] == ["slow", "fast", "small-lattice"]
    for run, result in zip(RUNS, results):
        options = {k: v for k, v in run.items() if k != "name"}
        alone = fit(store_path, data_seed=5, **options, **SHARED)
        _assert_same_parameters(result.model, alone.model)
        assert result.completed and result.stopped is None and result.steps == alone.steps
        assert [m["val_rmse"] for m in result.history] == [m["val_rmse"] for m in alone.history]
        assert result.state_bytes > 0
    assert [(m["run"], m["epoch"]) for m in logged] == [
        (n, e) for e in (1, 2) for n in ("slow", "fast", "small-lattice")
    ]
    # The group's order of batches follows data_seed, not the runs' model seeds.
    other_order = fit(
        store_path, seed=1, **{k: v for k, v in RUNS[1].items() if k not in ("name", "seed")}, **SHARED
    )
    assert not torch.equal(next(other_order.model.parameters()), next(results[1].model.parameters()))


@pytest.mark.parametrize("stop_after", [7, 5])  # in the middle of epoch 2; after epoch 1's last batch
def test_runs_stopped_together_resume_together_exactly(store_path, tmp_path, stop_after):
    runs = RUNS[:2]
    straight = fastload.fit_many(store_path, runs, **SHARED)
    stopped = fastload.fit_many(store_path, runs, checkpoint=tmp_path, max_steps=stop_after, **SHARED)
    assert [r.steps for r in stopped] == [stop_after] * 2 and not any(r.completed for r in stopped)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fast.ckpt", "slow.ckpt"]
    resumed = fastload.fit_many(store_path, runs, resume=tmp_path, checkpoint=tmp_path, **SHARED)
    for a, b in zip(straight, resumed):
        assert b.completed and b.steps == a.steps
        _assert_same_parameters(a.model, b.model)
        assert [m["val_rmse"] for m in a.history] == [m["val_rmse"] for m in b.history]


def test_resume_refuses_runs_stopped_at_different_places(store_path, tmp_path):
    fastload.fit_many(store_path, RUNS[:1], checkpoint=tmp_path, max_steps=3, **SHARED)
    fastload.fit_many(store_path, RUNS[1:2], checkpoint=tmp_path, max_steps=4, **SHARED)
    with pytest.raises(
        ValueError, match=r"checkpoints stopped at different places \(slow: step 3, fast: step 4\)"
    ):
        fastload.fit_many(store_path, RUNS[:2], resume=tmp_path, **SHARED)


def test_a_diverging_run_stops_alone(store_path, monkeypatch):
    monkeypatch.setattr(train_config, "MAX_LR", 1e31)
    logged = []
    runs = [dict(name="good", lr=3e-3), dict(name="bad", lr=1e30)]
    good, bad = fastload.fit_many(store_path, runs, log=logged.append, **SHARED)
    assert good.completed and good.stopped is None and len(good.history) == 2
    assert not bad.completed and bad.stopped.startswith("diverged: step ") and "non-finite" in bad.stopped
    assert bad.history == []
    assert [m for m in logged if "stopped" in m] == [
        {"run": "bad", "step": bad.steps, "stopped": bad.stopped}
    ]
    _assert_same_parameters(good.model, fit(store_path, lr=3e-3, **SHARED).model)


def test_patience_stops_a_run_that_stops_improving(store_path, monkeypatch):
    # The run "flat" is made to score the same validation errors every epoch.
    errors = train_mod.Trainer.errors

    def flat_errors(self, x, y, m):
        return torch.ones(2, dtype=torch.float64) if self.name == "flat" else errors(self, x, y, m)

    monkeypatch.setattr(train_mod.Trainer, "errors", flat_errors)
    logged = []
    runs = [dict(name="flat"), dict(name="moving")]
    flat, moving = fastload.fit_many(
        store_path, runs, patience=2, log=logged.append, **{**SHARED, "epochs": 5}
    )
    assert flat.stopped == "no better validation RMSE for 2 epochs (patience 2)" and not flat.completed
    assert len(flat.history) == 3 and flat.steps == 3 * 5
    assert moving.completed and len(moving.history) == 5
    assert {"run": "flat", "step": 15, "stopped": flat.stopped} in logged


@pytest.mark.parametrize(
    "runs, shared, message",
    [
        ([], {}, "runs is empty"),
        ([dict(lr=0)], {}, "run run0: lr must be above 0"),
        ([dict(name="a", batch_size=4)], {}, "run a: batch_size cannot differ between runs"),
        ([dict(name="a"), dict(name="a")], {}, "run name 'a' must be unique"),
        ([dict(name="../x")], {}, "run name '../x'"),
        ([dict(backbone="vgg")], {}, "run run0: backbone must be one of"),
        ([dict(num_features=10**8)], {}, "run run0: num_features must be between 1 and 4096"),
        ([dict()], {"checkpoint": "/nonexistent/folder"}, "its parent /nonexistent does not exist"),
        ([dict()], {"resume": "/nonexistent/folder"}, "must be an existing folder"),
    ],
)
def test_bad_runs_are_refused_before_training(store_path, runs, shared, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        fastload.fit_many(store_path, runs, **{**SHARED, **shared})


# The forms of runs: Python takes what `fastload train` takes, with the same meaning.


def _assert_same_runs(a, b):
    assert [r.name for r in a] == [r.name for r in b]
    for x, y in zip(a, b):
        _assert_same_parameters(x.model, y.model)
        assert x.history == y.history or [m["val_rmse"] for m in x.history] == [
            m["val_rmse"] for m in y.history
        ]


def test_runs_given_as_a_runs_file_are_the_runs_it_lists(store_path, tmp_path):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(RUNS[:2]))
    from_file = fastload.fit_many(store_path, path, **SHARED)
    _assert_same_runs(from_file, fastload.fit_many(store_path, RUNS[:2], **SHARED))
    assert [r.name for r in fastload.fit_many(store_path, str(path), max_steps=1, **SHARED)] == [
        "slow",
        "fast",
    ]


def test_a_number_of_runs_takes_per_run_lists_as_the_command_line_takes_comma_lists(store_path, capsys):
    """fit_many(store, 2, lr=[a, b], seed=3) is `fastload train --runs 2 --lr a,b --seed 3`: the
    same runs, named run0 and run1, on the same data (data_seed: the shared seed)."""
    logged = []
    listed = fastload.fit_many(store_path, 2, lr=[1e-3, 3e-2], seed=3, log=logged.append, **SHARED)
    as_dicts = fastload.fit_many(store_path, [dict(lr=1e-3), dict(lr=3e-2)], seed=3, data_seed=3, **SHARED)
    _assert_same_runs(listed, as_dicts)
    argv = ["train", str(store_path), "--runs", "2", "--lr", "1e-3,3e-2", "--seed", "3", "--json"]
    assert cli.main(argv + CLI_SHARED) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(m["run"], m["val_rmse"]) for m in printed] == [(m["run"], m["val_rmse"]) for m in logged]


def test_per_run_lists_of_one_value_or_tuples_apply_like_the_command_line(store_path):
    # `--runs 2 --seed 4,5 --lr 1e-2`: a list of one value is every run's; the data follow
    # data_seed 0 when the seeds differ (there is no shared seed).
    listed = fastload.fit_many(store_path, 2, seed=(4, 5), lr=[1e-2], **SHARED)
    runs = [dict(seed=4, lr=1e-2), dict(seed=5, lr=1e-2)]
    _assert_same_runs(listed, fastload.fit_many(store_path, runs, data_seed=0, **SHARED))
    alone = fit(store_path, seed=5, lr=1e-2, data_seed=0, **SHARED)
    _assert_same_parameters(listed[1].model, alone.model)
    np.testing.assert_array_equal(listed[1].val_indices, alone.val_indices)


@pytest.mark.parametrize(
    "runs, shared, error, message",
    [
        (2, {"lr": [1e-3, 2e-3, 3e-3]}, ValueError, "lr gives 3 values for runs 2: give 1 or 2"),
        (2, {"seed": []}, ValueError, "seed gives 0 values for runs 2"),
        ([{}, {}], {"lr": [1e-3, 2e-3]}, ValueError, "lr is a list of 2 values, one per run"),
        (0, {}, ValueError, "runs must be between 1 and 1024 .*, not 0"),
        (True, {}, TypeError, "runs must be a list of dicts .* not bool"),
        ({"lr": 1e-3}, {}, TypeError, "not dict"),
        (2, {"lr": [0, 1e-3]}, ValueError, "run run0: lr must be above 0"),
    ],
)
def test_bad_forms_of_runs_are_refused_naming_the_option(store_path, runs, shared, error, message):
    with pytest.raises(error, match=message):
        fastload.fit_many(store_path, runs, **{**SHARED, **shared})


def test_a_bad_runs_file_is_refused_naming_it(store_path, tmp_path):
    path = tmp_path / "runs.json"
    path.write_text("[{")
    with pytest.raises(ValueError, match=r"runs file .*runs\.json: not JSON"):
        fastload.fit_many(store_path, path, **SHARED)


@pytest.mark.safety
@pytest.mark.parametrize("runs", [100_000, [{}] * 1025], ids=["a number", "a list"])
def test_more_runs_than_a_group_trains_are_refused_before_any_work_in_one_line(runs, store_path, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("a store was opened or a model built")

    monkeypatch.setattr("fastload.train.open_data", no_work)
    count = runs if isinstance(runs, int) else len(runs)
    with pytest.raises(ValueError) as refused:
        fastload.fit_many(store_path, runs, **SHARED)
    assert str(refused.value) == (
        f"runs must be between 1 and 1024 (the most runs a group trains at once; train the others as "
        f"another group), not {count}"
    )


@pytest.mark.safety
def test_cli_runs_100000_is_a_one_line_usage_error(store_path, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", str(store_path), "--device", "cpu", "--runs", "100000"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.splitlines()[-1] == (
        "fastload train: error: argument --runs: must be between 1 and 1024 (the most runs a group "
        "trains at once; train the others as another group), not 100000"
    )


def test_runs_that_cannot_fit_in_memory_are_refused(store_path, monkeypatch):
    monkeypatch.setattr("fastload.train.machine_memory", lambda: 1000)
    with pytest.raises(
        ValueError, match=r"2 runs need [\d.]+ MB for parameters and optimizer state .* than the 0\.0 MB"
    ):
        fastload.fit_many(store_path, [dict(), dict()], **SHARED)


CLI_SHARED = ["--epochs", "2", "--batch-size", "8", "--device", "cpu", "--threads", "1"]


def test_cli_runs_print_a_line_per_run_and_epoch_and_a_sorted_table(store_path, tmp_path, capsys):
    argv = ["train", str(store_path), "--runs", "3", "--lr", "1e-3,3e-2,1e-2", "--seed", "0,1,2"]
    assert cli.main(argv + CLI_SHARED + ["--checkpoint", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    epochs = [line for line in out if " epoch " in line]
    assert [line.split()[:3] for line in epochs] == [
        [f"run{i}", "epoch", f"{e}/2"] for e in (1, 2) for i in range(3)
    ]
    table = [line for line in out if " epoch " not in line and " warning: " not in line]
    assert table[0].split()[:2] == ["run", "options"] and len(table) == 4
    rmses = [float(row.split()[4]) for row in table[1:]]
    assert rmses == sorted(rmses) and all(row.split()[-1] == "done" for row in table[1:])
    assert {row.split()[1] for row in table[1:]} == {"lr=0.001", "lr=0.03", "lr=0.01"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run0.ckpt", "run1.ckpt", "run2.ckpt"]


def test_cli_runs_json_gives_one_line_per_run_per_epoch(store_path, capsys):
    argv = ["train", str(store_path), "--runs", "2", "--lr", "1e-3,1e-2", "--stack", "--json"]
    assert cli.main(argv + CLI_SHARED) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [(m["run"], m["epoch"]) for m in lines] == [("run0", 1), ("run1", 1), ("run0", 2), ("run1", 2)]
    assert "val RMSE" in captured.err  # the table goes to stderr, leaving stdout JSON only


def test_cli_runs_file_names_the_runs(store_path, tmp_path, capsys):
    runs = tmp_path / "runs.json"
    runs.write_text(
        json.dumps([{"name": "a", "lr": 0.001}, {"name": "b", "seed": 3, "schedule": "constant"}])
    )
    assert cli.main(["train", str(store_path), "--runs-file", str(runs)] + CLI_SHARED) == 0
    table = capsys.readouterr().out.splitlines()[-2:]
    assert sorted(row.split()[0] for row in table) == ["a", "b"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--runs", "3", "--lr", "1e-3,3e-3"], "--lr gives 2 values for --runs 3: give 1 or 3"),
        (["--seed", "0,1"], "--seed gives 2 values for one run"),
        (["--runs", "2", "--schedule", "cosine,linear"], "must be one of cosine, constant, not 'linear'"),
        (["--runs", "2", "--lr", "1e-3,0"], "must be above 0"),
    ],
)
def test_cli_per_run_lists_of_the_wrong_length_are_usage_errors(store_path, flags, message, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", str(store_path)] + flags + CLI_SHARED)
    assert exited.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not JSON"),
        ('{"lr": 1}', "expected a non-empty JSON list of objects"),
        ('[{"epochs": 3}]', "epochs cannot differ"),
    ],
)
def test_cli_bad_runs_file_exits_1_naming_it(store_path, tmp_path, content, message, capsys):
    runs = tmp_path / "runs.json"
    runs.write_text(content)
    assert cli.main(["train", str(store_path), "--runs-file", str(runs)] + CLI_SHARED) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_reports_a_diverged_run_and_exits_0_while_another_finished(store_path, monkeypatch, capsys):
    monkeypatch.setattr(train_config, "MAX_LR", 1e31)
    assert cli.main(["train", str(store_path), "--runs", "2", "--lr", "3e-3,1e30"] + CLI_SHARED) == 0
    captured = capsys.readouterr()
    assert "run1  stopped at step" in captured.out and "diverged: step" in captured.out
    assert captured.out.splitlines()[-1].split()[0] == "run1" and captured.out.splitlines()[-1].endswith(
        "diverged"
    )
    assert "fastload train: run run1 stopped after" in captured.err
    assert cli.main(["train", str(store_path), "--runs", "2", "--lr", "1e30"] + CLI_SHARED) == 1


# Stacked runs agree with the runs alone within float rounding, not bitwise: vmapped kernels
# may sum in another order, and two epochs of AdamW carry the differences on.
STACK_TOLERANCE = dict(rtol=1e-3, atol=1e-4)


def _assert_close_parameters(a, b):
    a, b = a.state_dict(), b.state_dict()
    for name in a:
        torch.testing.assert_close(a[name].double(), b[name].double(), **STACK_TOLERANCE, msg=name)


def test_stacked_runs_end_close_to_the_runs_alone(store_path, monkeypatch):
    stacked_steps = []
    step = stacked.StackedStep.step

    def counted_step(self, *args):
        stacked_steps.append([t.name for t in self.trainers])
        step(self, *args)

    monkeypatch.setattr(stacked.StackedStep, "step", counted_step)
    runs = RUNS[:2] + [dict(name="third", lr=1e-2, seed=3)] + RUNS[2:]  # three of one architecture
    results = fastload.fit_many(store_path, runs, stack=True, **SHARED)
    assert stacked_steps == [["slow", "fast", "third"]] * 10  # small-lattice steps alone
    for run, result in zip(runs, results):
        alone = fit(store_path, data_seed=0, **{k: v for k, v in run.items() if k != "name"}, **SHARED)
        _assert_close_parameters(result.model, alone.model)
        assert result.completed and result.steps == alone.steps
        np.testing.assert_allclose(
            [m["val_rmse"] for m in result.history], [m["val_rmse"] for m in alone.history], rtol=1e-3
        )
    # The stacked models hold their own storage afterwards, not slices of one stack.
    first = [p.untyped_storage().data_ptr() for p in results[0].model.parameters()]
    second = [p.untyped_storage().data_ptr() for p in results[1].model.parameters()]
    assert not set(first) & set(second)


def test_runs_on_a_store_with_a_lone_last_record_see_the_same_batches(tmp_path):
    """17 training records in batches of 8: the 17th would be a batch alone, which BatchNorm
    cannot train on, stacked or not; every run leaves out the same one, as it would alone."""
    path = tmp_path / "lone.fastload"
    rng = np.random.default_rng(2)
    with StoreWriter(path, (SIDE, SIDE, 3)) as writer:
        writer.extend(rng.integers(0, 256, (19, SIDE, SIDE, 3), dtype=np.uint8), rng.random(19))
    runs = RUNS[:2]
    results = fastload.fit_many(path, runs, **SHARED)
    stacked = fastload.fit_many(path, runs, stack=True, **SHARED)
    for run, result, in_stack in zip(runs, results, stacked):
        alone = fit(path, data_seed=0, **{k: v for k, v in run.items() if k != "name"}, **SHARED)
        assert result.steps == in_stack.steps == alone.steps == 2 * 2
        _assert_same_parameters(result.model, alone.model)
        _assert_close_parameters(in_stack.model, alone.model)


def test_a_diverging_run_leaves_its_stack(store_path, monkeypatch):
    monkeypatch.setattr(train_config, "MAX_LR", 1e31)
    runs = [dict(name="good", lr=3e-3), dict(name="bad", lr=1e30), dict(name="also-good", lr=1e-2, seed=1)]
    good, bad, also = fastload.fit_many(store_path, runs, stack=True, **SHARED)
    assert bad.stopped.startswith("diverged: step ") and not bad.completed
    assert good.completed and also.completed
    _assert_close_parameters(good.model, fit(store_path, lr=3e-3, **SHARED).model)
    _assert_close_parameters(also.model, fit(store_path, lr=1e-2, seed=1, data_seed=0, **SHARED).model)


def test_a_missing_checkpoint_folder_is_created_one_level_as_mkdir(store_path, tmp_path, capsys):
    fastload.fit_many(store_path, RUNS[:1], checkpoint=tmp_path / "runs", max_steps=2, **SHARED)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["slow.ckpt"]
    argv = ["train", str(store_path), "--runs", "2", "--checkpoint", f"{tmp_path}/cli/", "--max-steps", "2"]
    assert cli.main(argv + CLI_SHARED) == 0
    assert sorted(p.name for p in (tmp_path / "cli").iterdir()) == ["run0.ckpt", "run1.ckpt"]
    capsys.readouterr()
    assert (
        cli.main(["train", str(store_path), "--runs", "2", "--checkpoint", f"{tmp_path}/a/b"] + CLI_SHARED)
        == 1
    )
    assert f"its parent {tmp_path}/a does not exist" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="a file of that name exists"):
        fastload.fit_many(store_path, RUNS[:1], checkpoint=tmp_path / "file", **SHARED)


def test_stacked_runs_print_no_pytorch_request_for_an_issue(store_path, capsys):
    argv = ["train", str(store_path), "--runs", "2", "--lr", "1e-3,1e-2", "--stack", "--epochs", "1"]
    assert cli.main(argv + CLI_SHARED[2:]) == 0
    err = capsys.readouterr().err
    assert "Please file us an issue" not in err and "performance drop" not in err


def test_the_command_prints_a_warning_raised_while_training_in_fastloads_words(
    store_path, capsys, monkeypatch
):
    real = fastload.train.fit_many

    def warns_then_trains(*args, **kwargs):
        warnings.warn(
            "There is a performance drop because we have not yet implemented the batching rule for aten::mul. Please file us an issue.",
            stacklevel=2,
        )
        return real(*args, **kwargs)

    monkeypatch.setattr(fastload.train, "fit_many", warns_then_trains)
    argv = ["train", str(store_path), "--runs", "2", "--lr", "1e-3,1e-2", "--stack", "--epochs", "1"]
    assert cli.main(argv + CLI_SHARED[2:]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "fastload train: warning: stacked runs: PyTorch's vmap has no batched kernel for aten::mul, so it "
        "computes that operation one run at a time: the results are the same, the speed-up of --stack is "
        "smaller (PyTorch's own message asks to report this to PyTorch, not to fastload)"
    ]


def test_epoch_lines_of_a_group_give_img_s_per_run_and_for_all_runs(store_path):
    logged = []
    fastload.fit_many(store_path, RUNS[:2], log=logged.append, **{**SHARED, "epochs": 1})
    assert [m["run"] for m in logged] == ["slow", "fast"]
    together = sum(m["images_per_s"] for m in logged)
    assert all(m["images_per_s_all_runs"] == pytest.approx(together) for m in logged)
    line = format_epoch(logged[0])
    assert f"{logged[0]['images_per_s']:,.0f} img/s per run ({together:,.0f} all runs)" in line
    alone = fit(store_path, **{**SHARED, "epochs": 1}).history[0]
    assert "images_per_s_all_runs" not in alone and " img/s per run" not in format_epoch(alone)
