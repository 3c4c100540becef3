"""Classification in `fit`, `fit_many` and `fastload train`: which task a store's labels get,
what classifying refuses, learning, the monotone classifier head, runs equal to their runs alone,
and the command line."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from monotone_helpers import step_piece

import fastload
from fastload import cli
from fastload.monotonic import check_monotone
from fastload.store import Store, StoreWriter
from fastload.train import MonotonicClassifier, TrainConfig, build_model, fit, format_epoch, prepare_images
from fastload.train.checkpoint import load_checkpoint
from fastload.train.data import open_data

SIDE, PER_CLASS = 8, 16
COLORS = {"blue": (40, 60, 210), "green": (50, 200, 60), "red": (210, 50, 40)}  # sorted: class order
FAST = dict(batch_size=8, lr=3e-2, device="cpu", threads=1, progress=False, val_fraction=0.25)
SHARED = dict(epochs=2, batch_size=8, device="cpu", threads=1, deterministic=True, progress=False)


def _colored(color, count: int, rng) -> np.ndarray:
    noise = rng.normal(0, 30, (count, SIDE, SIDE, 3))
    return (np.array(color) + noise).clip(0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Class folders of tiny noisy images, one colour per class, and a CSV of whole numbers
    (an 'age' per image) for the same files."""
    from PIL import Image

    root = tmp_path_factory.mktemp("classes") / "photos"
    rng = np.random.default_rng(0)
    rows = ["path,label"]
    for name, color in COLORS.items():
        (root / name).mkdir(parents=True)
        for i, pixels in enumerate(_colored(color, PER_CLASS, rng)):
            Image.fromarray(pixels).save(root / name / f"{i:02d}.png")
            rows.append(f"{name}/{i:02d}.png,{20 + int(rng.integers(0, 60))}")
    (root.parent / "ages.csv").write_text("\n".join(rows) + "\n")
    return root


@pytest.fixture(scope="module")
def class_store(folders):
    path = folders.parent / "colors.fastload"
    fastload.pack(folders, path, size=SIDE, quiet=True)
    return path


@pytest.fixture(scope="module")
def ages_store(folders):
    path = folders.parent / "ages.fastload"
    fastload.pack(folders, path, size=SIDE, labels=folders.parent / "ages.csv", quiet=True)
    return path


def _store(path, labels, meta=None, label_dtype="int64"):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (len(labels), SIDE, SIDE, 3), dtype=np.uint8)
    with StoreWriter(path, (SIDE, SIDE, 3), label_dtype=label_dtype, meta=meta) as writer:
        writer.extend(images, np.asarray(labels))
    return path


# ---------------------------------------------------------------- which task


def test_a_store_of_class_folders_is_classified_and_learns(class_store):
    logged = []
    result = fit(class_store, epochs=3, log=logged.append, **FAST)
    assert Store(class_store).label_dtype == np.int64
    assert result.task == "classification" and result.config["class_names"] == ["blue", "green", "red"]
    assert all(m["class_names"] == ["blue", "green", "red"] for m in logged)  # the log lines name them
    assert result.baseline_rmse is None and logged == result.history
    assert isinstance(result.model, MonotonicClassifier) and result.model.num_classes == 3
    for metrics in result.history:
        assert "val_rmse" not in metrics
        assert sum(metrics["val_support"]) == len(result.val_indices) == 12
        assert metrics["val_accuracy"] == sum(metrics["val_correct"]) / 12
        assert all(0 <= c <= s for c, s in zip(metrics["val_correct"], metrics["val_support"]))
    labels = np.asarray(Store(class_store).labels)
    assert result.history[0]["val_support"] == np.bincount(labels[result.val_indices], minlength=3).tolist()
    last = result.history[-1]
    # Colours are easy: clearly above always answering the training split's commonest class.
    assert result.baseline_accuracy == last["baseline_accuracy"] <= 0.5
    assert last["val_accuracy"] >= 0.9 and last["val_loss"] < result.history[0]["train_loss"]
    assert "learned_too_little" not in last  # it beat the baseline clearly: nothing to warn of
    # The split is stratified (#45): 25% of each class of 16 is 4 records.
    assert last["val_support"] == [4, 4, 4]


def test_a_run_that_beats_nothing_says_so_with_a_likely_cause(tmp_path, capsys):
    """#45: 35 photos trained 3 epochs ended at the majority baseline's accuracy with nothing
    said. Labels drawn at random leave nothing to learn: the final epoch's line, and its JSON,
    say the model learned little, how it compares with the baseline and why (too few records)."""
    rng = np.random.default_rng(3)
    path = _store(tmp_path / "noise.fastload", rng.integers(0, 4, 35), {"class_names": list("abcd")})
    result = fit(path, epochs=3, **{**FAST, "val_fraction": 0.2})
    last = result.history[-1]
    assert all(s >= 1 for s in last["val_support"])  # stratified: no class left out of validation
    problem = last["learned_too_little"]
    assert "the model learned little: validation error rate" in problem
    assert "too few records (28 to train on)" in problem or "did not fall" in problem
    assert all("learned_too_little" not in m for m in result.history[:-1])  # said once, at the end
    argv = ["train", str(path), *CLI_SHARED, "--val-fraction", "0.2"]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("warning: the model learned little: validation error rate")
    assert cli.main([*argv, "--json"]) == 0
    assert (
        "the model learned little"
        in json.loads(capsys.readouterr().out.splitlines()[-1])["learned_too_little"]
    )


def test_whole_number_csv_labels_are_regressed_as_numbers(ages_store):
    store = Store(ages_store)
    assert store.label_dtype == np.int64 and "class_names" not in store.meta
    result = fit(ages_store, epochs=1, **FAST)
    assert result.task == "regression" and result.baseline_rmse > 0 and result.baseline_accuracy is None
    low, high = result.config["output_range"]
    assert low < np.asarray(store.labels).min() and high > np.asarray(store.labels).max()
    assert np.isfinite(result.history[0]["val_rmse"])


def test_class_folders_can_be_regressed_when_asked(class_store):
    result = fit(class_store, task="regression", epochs=1, **FAST)
    assert result.task == "regression" and "val_rmse" in result.history[0]


def test_whole_numbers_classified_when_asked_make_classes_up_to_the_largest(ages_store):
    largest = int(np.asarray(Store(ages_store).labels).max())
    with pytest.warns(UserWarning, match=rf"lists no class names: .* {largest + 1} classes, 0 to {largest}"):
        result = fit(ages_store, task="classification", epochs=1, **FAST)
    assert result.config["class_names"] == [str(i) for i in range(largest + 1)]
    assert result.model.num_classes == largest + 1 and len(result.history[0]["val_support"]) == largest + 1


# ---------------------------------------------------------------- refusals


def test_classifying_real_valued_labels_is_refused(tmp_path):
    path = _store(tmp_path / "f.fl", [0.5, 1.5, 2.0, 3.0], label_dtype="float64")
    with pytest.raises(ValueError, match=r"float64 labels; classification needs int64 class indices"):
        fit(path, task="classification", **FAST)


@pytest.mark.parametrize(
    "labels, shown", [([0, 1, 2, 1, 0, 1, 0, 1], "2"), ([0, 1, -1, 1, 0, 1, 0, 1], "-1")]
)
def test_labels_outside_the_classes_are_refused(tmp_path, labels, shown):
    path = _store(tmp_path / "s.fl", labels, meta={"class_names": ["cat", "dog"]})
    with pytest.raises(ValueError, match=rf"has labels outside \[0, 2\) \({shown}\)"):
        fit(path, **FAST)


def test_a_validation_store_of_other_classes_is_refused(tmp_path, class_store):
    other = _store(tmp_path / "v.fl", [0, 1, 0, 1], meta={"class_names": ["cat", "dog"]})
    with pytest.raises(ValueError, match=r"lists 2 classes \(cat, dog\), the training store .* 3 classes"):
        fit(class_store, val=other, **FAST)
    unnamed = _store(tmp_path / "u.fl", [0, 1, 2, 1])
    with pytest.raises(ValueError, match=r"lists no classes, the training store"):
        fit(class_store, val=unnamed, **FAST)
    real = _store(tmp_path / "r.fl", [0.0, 1.0], label_dtype="float64")
    with pytest.raises(ValueError, match=r"validation store .* float64 labels"):
        fit(class_store, val=real, **FAST)


def test_negative_labels_of_a_store_without_classes_are_refused_before_any_warning(tmp_path):
    path = _store(tmp_path / "neg.fl", [-1, -2, -1, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"no classes and has negative labels \(smallest -2\)"):
            fit(path, task="classification", **FAST)


def test_labels_too_large_to_be_class_indices_are_refused(tmp_path):
    path = _store(tmp_path / "big.fl", [0, 5, 1_000_000, 3])
    with pytest.raises(ValueError, match=r"labels up to 1,000,000: .* use task regression"):
        fit(path, task="classification", **FAST)


def test_resume_with_another_task_is_refused(class_store, tmp_path):
    ckpt = tmp_path / "run.ckpt"
    fit(class_store, checkpoint=ckpt, max_steps=1, **FAST)
    with pytest.raises(ValueError, match=r"written by a classification run, this run is regression"):
        fit(class_store, resume=ckpt, task="regression", **FAST)


def test_bad_task_and_a_task_per_run_are_refused(class_store):
    with pytest.raises(ValueError, match=r"task must be one of regression, classification or None"):
        fit(class_store, task="ranking", **FAST)
    with pytest.raises(ValueError, match="run a: task cannot differ between runs"):
        fastload.fit_many(class_store, [dict(name="a", task="regression")], **FAST)


# ---------------------------------------------------------------- the monotone classifier head


def test_every_class_logit_of_a_trained_model_is_monotone_in_its_inputs(class_store, tmp_path):
    rng = np.random.default_rng(2)
    inputs = rng.uniform(0, 1, (len(Store(class_store)), 2)).astype(np.float32)
    np.save(tmp_path / "m.npy", inputs)
    result = fit(class_store, monotone_inputs=tmp_path / "m.npy", epochs=2, **FAST)
    images, _ = Store(class_store).gather(np.arange(24))
    x = prepare_images(torch.from_numpy(images), result.config, "cpu")
    logits = result.model(x, torch.from_numpy(inputs[:24]))
    assert logits.shape == (24, 3)
    # Two monotone inputs: exact in the first, within rounding (fastload.monotonic) in the second.
    assert check_monotone(result.model, x, torch.from_numpy(inputs[:24])) <= 1e-5


@settings(max_examples=15, deadline=None)
@given(
    classes=st.integers(2, 4),
    features=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    scale=st.floats(0.1, 5.0),
)
def test_any_classifier_is_monotone_in_each_logit(classes, features, seed, scale):
    """Whatever its parameters (a training run could leave any), every logit is non-decreasing
    in a monotone input, exactly: with one monotone input each lattice is exact under rounding."""
    torch.manual_seed(seed)
    model = MonotonicClassifier(classes, num_features=features, monotone_inputs=1, in_channels=3, seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    images = torch.randn(6, 3, SIDE, SIDE)
    inputs = torch.rand(6, 1)
    assert check_monotone(model, images, inputs, num_steps=16) == 0.0


@settings(max_examples=15, deadline=None)
@given(classes=st.integers(2, 5), seed=st.integers(0, 2**16), scale=st.floats(0.1, 5.0))
def test_an_ordinal_classifier_keeps_every_class_at_least_probability_monotone(classes, seed, scale):
    """ordinal=True: whatever the parameters, P(class >= k) never falls as a monotone input
    rises, for every k, and the class probabilities sum to 1."""
    torch.manual_seed(seed)
    model = MonotonicClassifier(
        classes, num_features=3, monotone_inputs=2, in_channels=3, seed=seed, ordinal=True
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    images = torch.randn(6, 3, SIDE, SIDE)
    inputs = torch.rand(6, 2)
    sweep = torch.linspace(0, 1, 17)
    with torch.no_grad():
        for column in range(2):
            at_least = []
            for value in sweep:
                swept = inputs.clone()
                swept[:, column] = value
                probabilities = model(images, swept).exp()
                at_least.append(probabilities.flip(1).cumsum(1).flip(1))  # P(y >= k), k = 0..K-1
            steps = torch.stack(at_least).diff(dim=0)
            assert steps.min() >= -1e-5, (column, steps.min())
        torch.testing.assert_close(model(images, inputs).exp().sum(1), torch.ones(6))


def test_an_ordinal_run_trains_and_rebuilds_and_a_regression_refuses_it(class_store, ages_store, tmp_path):
    np.save(
        tmp_path / "m.npy", np.random.default_rng(3).uniform(0, 1, len(Store(class_store))).astype(np.float32)
    )
    result = fit(class_store, monotone_inputs=tmp_path / "m.npy", ordinal=True, epochs=6, **FAST)
    assert result.config["ordinal"] and result.model.link is not None
    assert result.history[-1]["val_loss"] < 0.9 * result.history[0]["val_loss"]  # it learns
    rebuilt = build_model(result.config)
    rebuilt.load_state_dict(result.model.state_dict())
    assert rebuilt.link is not None
    with pytest.raises(ValueError, match="ordinal=True orders the classes of a classification"):
        fit(ages_store, ordinal=True, epochs=1, **FAST)


# Class codes that step up where a monotone input passes each of STEPS: 1350 training records
# give place_keypoints 42 bins along it.
STEPS, STEPPED_COUNT = (0.37, 0.7), 1500


@pytest.mark.parametrize(
    "names, ordinal, placed",
    [
        (["low", "high"], False, True),  # two classes: their codes are an order
        (["low", "mid", "high"], True, True),
        (["cat", "dog", "fox"], False, False),  # unordered codes are no scale: quantiles
    ],
)
def test_monotone_input_keypoints_follow_the_codes_of_two_or_ordered_classes(
    tmp_path, names, ordinal, placed
):
    inputs = np.random.default_rng(4).uniform(0, 1, STEPPED_COUNT).astype(np.float32)
    codes = sum(inputs > step for step in STEPS[: len(names) - 1])
    np.save(tmp_path / "m.npy", inputs)
    store = _store(tmp_path / "steps.fl", codes, meta={"class_names": names})
    config = TrainConfig(store, monotone_inputs=tmp_path / "m.npy", ordinal=ordinal, device="cpu")
    data = open_data(config, None)
    (keypoints,) = data.statistics["monotone_input_keypoints"]
    widths = [step_piece(keypoints, step) for step in STEPS[: len(names) - 1]]
    if placed:
        assert max(widths) < 0.04, keypoints
    else:
        quantiles = np.quantile(inputs[data.train_indices], np.linspace(0, 1, len(keypoints)))
        np.testing.assert_allclose(keypoints, quantiles, atol=0.03)
        assert min(widths) > 0.1


def test_cli_ordinal_trains_a_cumulative_link_head(class_store, tmp_path, capsys):
    argv = ["train", str(class_store), "--ordinal", "--checkpoint", str(tmp_path / "run.ckpt")]
    assert cli.main(argv + CLI_SHARED) == 0
    assert "epoch 2/2" in capsys.readouterr().out
    config = load_checkpoint(tmp_path / "run.ckpt")["config"]
    assert config["ordinal"] is True and build_model(config).link is not None


def test_build_model_rebuilds_the_classifier_from_its_config(class_store):
    result = fit(class_store, epochs=1, **FAST)
    rebuilt = build_model(result.config)
    rebuilt.load_state_dict(result.model.state_dict())
    x = torch.randn(4, 3, SIDE, SIDE)
    result.model.eval()
    rebuilt.eval()
    assert torch.equal(rebuilt(x), result.model(x))


# ---------------------------------------------------------------- several runs


RUNS = [dict(name="slow", lr=1e-3, seed=0), dict(name="fast", lr=3e-2, seed=1, schedule="constant")]


def _assert_same_parameters(a, b):
    a, b = a.state_dict(), b.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_classification_runs_end_where_they_would_alone(class_store):
    runs = RUNS + [dict(name="narrow", num_features=4, seed=2)]
    results = fastload.fit_many(class_store, runs, seed=5, **SHARED)
    for run, result in zip(runs, results):
        alone = fit(class_store, data_seed=5, **{k: v for k, v in run.items() if k != "name"}, **SHARED)
        _assert_same_parameters(result.model, alone.model)
        assert result.task == "classification"
        assert [m["val_loss"] for m in result.history] == [m["val_loss"] for m in alone.history]
        assert [m["val_correct"] for m in result.history] == [m["val_correct"] for m in alone.history]


def test_stacked_classification_runs_end_close_to_the_runs_alone(class_store):
    results = fastload.fit_many(class_store, RUNS, stack=True, **SHARED)
    for run, result in zip(RUNS, results):
        alone = fit(class_store, data_seed=0, **{k: v for k, v in run.items() if k != "name"}, **SHARED)
        a, b = result.model.state_dict(), alone.model.state_dict()
        for name in a:
            torch.testing.assert_close(a[name].double(), b[name].double(), rtol=1e-3, atol=1e-4, msg=name)
        np.testing.assert_allclose(
            [m["val_loss"] for m in result.history], [m["val_loss"] for m in alone.history], rtol=1e-3
        )


def test_a_lone_last_record_leaves_classification_its_other_batches(tmp_path):
    """81 training records in batches of 8: the last, alone, would fail BatchNorm; it stays out
    of its epoch, the same for a run alone and in a group."""
    meta = {"class_names": ["a", "b", "c"]}
    path = _store(tmp_path / "lone.fastload", np.arange(90) % 3, meta=meta)
    shared = {**SHARED, "val_fraction": 0.1}
    alone = fit(path, **shared)
    assert alone.task == "classification" and alone.completed and alone.steps == 2 * 10
    (grouped,) = fastload.fit_many(path, [dict(name="only")], **shared)
    _assert_same_parameters(grouped.model, alone.model)


# ---------------------------------------------------------------- reports and the command line


def test_an_epoch_line_shows_accuracy_and_the_counts_of_the_least_accurate_classes():
    metrics = {
        "epoch": 1,
        "epochs": 2,
        "train_loss": 1.0,
        "val_loss": 0.5,
        "val_accuracy": 0.75,
        "baseline_accuracy": 0.25,
        "val_support": [4] * 12,
        "val_correct": [4, 3, 0, 4, 4, 4, 1, 4, 4, 4, 4, 4],
        "images_per_s": 100.0,
        "data_wait_fraction": 0.0,
    }
    line = format_epoch(metrics)
    assert "val loss 0.5  accuracy 75.0% (majority baseline 25.0%)" in line
    assert "least accurate 10 of 12 classes: 2:0/4 6:1/4 1:3/4 0:4/4" in line
    absent = format_epoch({**metrics, "val_support": [0] * 11 + [5], "val_correct": [0] * 12})
    assert "least accurate 10 of 12 classes: 11:0/5 0:0/0" in absent  # no records: no accuracy to rank
    few = format_epoch({**metrics, "val_support": [4, 4], "val_correct": [3, 1]})
    assert few.endswith("correct per class: 0:3/4 1:1/4")
    named = format_epoch(
        {**metrics, "val_support": [4, 4], "val_correct": [3, 1], "class_names": ["cat", "dog"]}
    )
    assert named.endswith("correct per class: cat:3/4 dog:1/4")


CLI_SHARED = [
    "--epochs",
    "2",
    "--batch-size",
    "8",
    "--device",
    "cpu",
    "--threads",
    "1",
    "--val-fraction",
    "0.25",
]


def test_cli_runs_print_accuracy_and_a_table_best_accuracy_first(class_store, capsys):
    argv = ["train", str(class_store), "--runs", "2", "--lr", "1e-4,3e-2", "--seed", "0,1"]
    assert cli.main(argv + CLI_SHARED) == 0
    out = capsys.readouterr().out.splitlines()
    epochs = [line for line in out if " epoch " in line]
    assert len(epochs) == 4
    assert all("accuracy" in line and "correct per class: blue:" in line for line in epochs)
    assert all(" red:" in line and " img/s per run (" in line for line in epochs)
    table = [line for line in out if " epoch " not in line and "warning: " not in line]
    assert table[0].split() == [
        "run",
        "options",
        "val",
        "loss",
        "val",
        "accuracy",
        "steps",
        "state",
        "MB",
        "status",
    ]
    accuracies = [float(row.split()[4].rstrip("%")) for row in table[1:]]
    assert len(accuracies) == 2 and accuracies == sorted(accuracies, reverse=True)


def test_cli_task_flag_and_json_lines(ages_store, capsys):
    argv = ["train", str(ages_store), "--task", "classification", "--json"] + CLI_SHARED
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith(f"fastload train: warning: store {ages_store} lists no class names")
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [m["epoch"] for m in lines] == [1, 2]
    assert {"val_loss", "val_accuracy", "val_support", "val_correct", "baseline_accuracy"} <= lines[0].keys()


def test_cli_help_says_which_labels_each_task_takes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "regression takes float64 labels, or int64 ones" in help_text
    assert "classification takes int64 class indices" in help_text
    with pytest.raises(SystemExit) as usage:
        cli.main(["train", "s.fl", "--task", "ranking"])
    assert usage.value.code == 2


def test_learned_too_little_names_the_likeliest_cause():
    from fastload.train.task import learned_too_little

    def epoch(train_loss, rmse):
        return {"train_loss": train_loss, "val_rmse": rmse, "baseline_rmse": 0.096}

    # The README's regression example before #45: RMSE 0.132 against the mean's 0.096.
    falling = [epoch(1.0, 0.2), epoch(0.5, 0.132)]
    assert "RMSE 0.132 against the mean baseline's 0.096" in learned_too_little(
        "regression", falling, 500, 20
    )
    assert "too few records (500 to train on)" in learned_too_little("regression", falling, 500, 20)
    assert "too few epochs (3)" in learned_too_little("regression", falling, 5000, 3)
    flat = [epoch(1.0, 0.2), epoch(0.99, 0.132)]
    assert "did not fall" in learned_too_little("regression", flat, 5000, 3)
    assert (
        learned_too_little("regression", [epoch(1.0, 0.2), epoch(0.5, 0.0911)], 500, 3) is None
    )  # 5.1% better
    assert learned_too_little("regression", [epoch(1.0, 0.2), epoch(0.5, 0.0913)], 500, 3) is not None  # 4.9%
