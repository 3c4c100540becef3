"""Tests for fastload.monotonic.persistence: an estimator saved and loaded predicts the same;
altered, hostile or unexpected files are refused before anything is built, and no code from a
file runs; a full disk keeps the old file."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch
from monotone_helpers import (
    one_thread,  # noqa: F401 (an autouse fixture)
    table_with_categories_and_gaps,
    three_feature_table,
)
from train_helpers import disk_full_at

from fastload.monotonic import Lattice, LatticeClassifier, LatticeRegressor


def test_save_and_load_round_trip(tmp_path):
    X, y = table_with_categories_and_gaps()
    declared = {
        "x0": {"categories": ["small", "medium", "large"], "monotonicity": 1},
        "x1": {"missing": True},
    }
    model = LatticeRegressor(features=declared, max_iter=20).fit(X, y)
    model.save(tmp_path / "model.pt")
    loaded = LatticeRegressor.load(tmp_path / "model.pt", features={"x0": declared["x0"]})
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert loaded.get_params() == model.get_params()
    assert loaded.chosen_params_ == model.chosen_params_ and loaded.chosen_params_["early_stopping"]
    labels = (y > 2).astype(int)
    classifier = LatticeClassifier(features={0: "categorical", 1: {"missing": True}}, max_iter=20).fit(
        X, labels
    )
    classifier.save(tmp_path / "classifier.pt")
    again = LatticeClassifier.load(tmp_path / "classifier.pt")
    np.testing.assert_array_equal(again.predict_proba(X), classifier.predict_proba(X))
    np.testing.assert_array_equal(again.classes_, classifier.classes_)
    with pytest.raises(ValueError, match="holds a LatticeClassifier, not a LatticeRegressor"):
        LatticeRegressor.load(tmp_path / "classifier.pt")


def _tamper(path, edit):
    data = torch.load(path, weights_only=True)
    edit(data)
    torch.save(data, path)


@pytest.mark.safety
def test_a_file_saved_before_ensembles_scaled_their_parameters_loads_as_it_was(tmp_path):
    """Format-1 files hold ensembles whose parameters are the vertex values themselves: they
    load into unscaled ensembles and predict what they predicted."""
    X, y = three_feature_table(200)
    X = np.hstack([X, X[:, :2] ** 2])  # 5 features: an ensemble of 3 lattices
    model = LatticeRegressor(max_iter=20).fit(X, y)
    model.save(tmp_path / "model.pt")
    data = torch.load(tmp_path / "model.pt", weights_only=True)
    (raw_name,) = [name for name in data["state"] if name.endswith("bank.raw")]
    data["state"][raw_name] = data["state"][raw_name] * 3  # what format 1 stored for this model
    data["format"] = "fastload.monotonic.estimator/1"
    data["params"]["kind"] = "lattice"  # format 1 held the model's kind; it chose none
    del data["chosen_params"]
    torch.save(data, tmp_path / "format1.pt")
    np.testing.assert_allclose(
        LatticeRegressor.load(tmp_path / "format1.pt").predict(X), model.predict(X), rtol=1e-5
    )
    data["format"] = "fastload.monotonic.estimator/9"
    torch.save(data, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="is not a file written by LatticeRegressor.save"):
        LatticeRegressor.load(tmp_path / "future.pt")


@pytest.mark.parametrize("fraction", [None, 0.2])
def test_a_file_saved_before_n_jobs_and_early_stopping_loads(tmp_path, fraction):
    """Files written while the estimators took ``torch_threads`` and a ``validation_fraction``
    that was None without early stopping load with today's parameters."""
    X, y = three_feature_table(200)
    model = LatticeRegressor(max_iter=20).fit(X, y)
    model.save(tmp_path / "model.pt")
    data = torch.load(tmp_path / "model.pt", weights_only=True)
    for name in ("n_jobs", "early_stopping"):
        del data["params"][name]
    data["params"].update(torch_threads=1, validation_fraction=fraction)
    torch.save(data, tmp_path / "old.pt")
    loaded = LatticeRegressor.load(tmp_path / "old.pt")
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert loaded.early_stopping is (fraction is not None) and loaded.n_jobs is None
    assert loaded.validation_fraction == (0.1 if fraction is None else fraction)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["state"]["constraints"].fill_(0), "declared with feature constraints"),
        (lambda d: d["features"][0].update(monotonicity=0), "disagree with its declaration"),
        (lambda d: d["params"].update(features={"x1": "decreasing"}), "disagree with its declaration"),
        (lambda d: d["state"].pop("constraints"), r"missing: \['constraints'\]"),
    ],
    ids=["state", "features", "params", "no-constraints"],
)
def test_a_file_with_altered_constraints_is_refused(tmp_path, edit, message):
    X, y = three_feature_table(60)
    LatticeRegressor(features={"x0": "increasing", "x1": "decreasing"}, max_iter=2).fit(X, y).save(
        tmp_path / "m.pt"
    )
    _tamper(tmp_path / "m.pt", edit)
    with pytest.raises((ValueError, RuntimeError), match=message):
        LatticeRegressor.load(tmp_path / "m.pt")


def test_load_refuses_a_model_without_the_expected_constraints(tmp_path):
    X, y = three_feature_table(60)
    LatticeRegressor(features={"x0": "increasing"}, max_iter=2).fit(X, y).save(tmp_path / "m.pt")
    with pytest.raises(ValueError, match="'x1': monotonicity: expected decreasing, the file has none"):
        LatticeRegressor.load(tmp_path / "m.pt", features={"x0": "increasing", "x1": "decreasing"})
    with pytest.raises(ValueError, match="declares 'age'"):
        LatticeRegressor.load(tmp_path / "m.pt", features={"age": "increasing"})


@pytest.mark.safety
def test_a_full_disk_during_save_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    X, y = three_feature_table(60)
    model = LatticeRegressor(max_iter=2).fit(X, y)
    path = tmp_path / "m.pt"
    model.save(path)
    before = path.read_bytes()
    disk_full_at(monkeypatch, 1)
    with pytest.raises(OSError, match=rf"cannot write the model file {path}: No space left on device$"):
        model.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt"] and path.read_bytes() == before


def _ensemble_file(tmp_path, **params):
    """A saved regressor: over 3 features, one lattice (1, 2, 2, 2); over 5 features with
    lattice_rank 2, an ensemble of 5 lattices (5, 2, 2)."""
    columns = 5 if params.get("lattice_rank") == 2 else 3
    X = np.random.default_rng(0).uniform(0, 1, (60, columns))
    LatticeRegressor(max_iter=2, **params).fit(X, X.sum(1)).save(tmp_path / "m.pt")
    return tmp_path / "m.pt"


@pytest.mark.safety
@pytest.mark.parametrize(
    ("params", "edit", "message"),
    [
        (
            {},
            {"lattice_size": 150},
            r"lattice_size 150 declares lattices of shape \(1, 150, 150, 150\), but its "
            r"parameters hold \(1, 2, 2, 2\)",
        ),
        ({}, {"lattice_size": 3}, r"lattice_size 3 declares lattices of shape \(1, 3, 3, 3\)"),
        ({}, {"lattice_rank": 1}, r"lattice_rank 1 declares lattices of shape \(6, 2\)"),
        (
            {"lattice_rank": 2},
            {"num_lattices": 10**6},
            r"num_lattices 1000000 declares lattices of shape \(1000000, 2, 2\)",
        ),
        ({"kind": "linear"}, {"kind": "lattice"}, "its kind 'lattice' declares lattices, but it holds none"),
        ({}, {"lattice_size": "big"}, "lattice_size 'big' is not a positive integer"),
    ],
    ids=["lattice_size-150", "lattice_size-3", "lattice_rank", "num_lattices", "kind", "not-a-number"],
)
def test_a_file_declaring_other_sizes_than_it_holds_is_refused_before_building(
    tmp_path, params, edit, message
):
    path = _ensemble_file(tmp_path, **params)
    # The model's kind is the one fit chose (chosen_params), which "kind" edits there too.
    chosen = {k: v for k, v in edit.items() if k == "kind"}
    _tamper(path, lambda d: (d["params"].update(edit), d["chosen_params"].update(chosen)))
    with pytest.raises(ValueError, match=rf"^{path}: .*{message}"):
        LatticeRegressor.load(path)


@pytest.mark.safety
def test_load_runs_no_code_from_the_file(tmp_path):
    torch.save(
        {"format": "fastload.monotonic.estimator/1", "payload": Lattice([2], [1])}, tmp_path / "evil.pt"
    )
    with pytest.raises(ValueError, match=f"^{tmp_path / 'evil.pt'}: .*no code from a file runs") as err:
        LatticeRegressor.load(tmp_path / "evil.pt")
    assert "weights_only=False" not in str(err.value)  # torch's advice would run the file's code
    torch.save({"something": "else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a file written by LatticeRegressor.save"):
        LatticeRegressor.load(tmp_path / "other.pt")


@pytest.mark.parametrize(
    "random_state", [1, None, np.random.RandomState(7)], ids=["int", "None", "RandomState"]
)
def test_a_model_with_an_ensemble_loads_whatever_its_random_state(tmp_path, random_state):
    """Past lattice_rank features the ensemble's subsets come from the seed fit drew."""
    X = np.random.default_rng(0).uniform(size=(40, 6))
    model = LatticeRegressor(features={"x0": "increasing"}, max_iter=2, random_state=random_state)
    model.fit(X, X.sum(1)).save(tmp_path / "m.pt")
    loaded = LatticeRegressor.load(tmp_path / "m.pt")
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert loaded.seed_ == model.seed_


def test_numpy_values_in_the_parameters_save_as_plain_values(tmp_path):
    X, y = table_with_categories_and_gaps(60)
    declared = {
        "x0": {"categories": np.array(["small", "medium", "large"]), "monotonicity": 1},
        "x1": {"missing": np.True_, "num_keypoints": np.int64(4)},
        "x2": {"missing": np.float64(-1.0)},
    }
    model = LatticeRegressor(
        features=declared,
        num_keypoints=np.int64(5),
        learning_rate=np.float64(0.05),
        max_iter=np.int64(2),
        lattice_torsion=np.float32(0.5),
        validation_fraction=np.float64(0.2),
    )
    model.fit(X, y).save(tmp_path / "m.pt")
    loaded = LatticeRegressor.load(tmp_path / "m.pt")
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert loaded.get_params()["num_keypoints"] == 5
    assert loaded.chosen_params_["lattice_torsion"] == 0.5
    model.set_params(features={"x0": {"categories": [object(), "a"]}})  # not refitted: save reads it
    with pytest.raises(ValueError, match="parameter 'features'"):
        model.save(tmp_path / "unsavable.pt")


@pytest.mark.safety
def test_load_compares_the_constraints_and_names_the_field_that_differs(tmp_path):
    X, y = table_with_categories_and_gaps(60)
    declared = {
        "x0": {"categories": ["small", "medium", "large"], "monotonicity": 1},
        "x1": {"monotonicity": "increasing", "missing": True, "num_keypoints": 4},
        "x2": {"missing": -1.0},
    }
    LatticeRegressor(features=declared, max_iter=2).fit(X, y).save(tmp_path / "m.pt")
    # num_keypoints and the missing sentinel are not constraints.
    expected = {"x1": {"monotonicity": "increasing", "missing": True}, "x2": {"missing": True}}
    LatticeRegressor.load(tmp_path / "m.pt", features=expected)
    with pytest.raises(ValueError, match="'x1': missing: expected False, the file has True"):
        LatticeRegressor.load(tmp_path / "m.pt", features={"x1": "increasing"})
    with pytest.raises(ValueError, match=r"'x0': categories: expected \['large', 'medium', 'small'\]"):
        LatticeRegressor.load(
            tmp_path / "m.pt",
            features={"x0": {"categories": ["large", "medium", "small"], "monotonicity": 1}},
        )
    with pytest.raises(ValueError, match="declares 'age', which the file's model does not have"):
        LatticeRegressor.load(tmp_path / "m.pt", features={"age": "increasing"})


@pytest.mark.safety
def test_loading_a_named_pipe_is_refused_without_waiting_for_a_writer(tmp_path):
    """torch.load would open the pipe itself and block until something writes to it."""
    fifo = tmp_path / "model.pt"
    os.mkfifo(fifo)
    outcome = []

    def load():
        try:
            LatticeRegressor.load(fifo)
        except ValueError as exc:
            outcome.append(str(exc))

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(timeout=30)
    if reader.is_alive():  # let the blocked open go, so the thread ends
        with open(fifo, "wb"):
            pass
        pytest.fail("LatticeRegressor.load blocked on a named pipe")
    assert outcome and outcome[0].startswith(f"{fifo}: not a regular file (a named pipe)")


def _saved_model(tmp_path, **params):
    X, y = three_feature_table(60)
    path = tmp_path / "m.pt"
    LatticeRegressor(max_iter=2, **params).fit(X, y).save(path)
    return path


def _set(*keys_and_value):
    """An edit of a loaded file's contents: the value at the nested keys replaced."""
    *keys, value = keys_and_value

    def edit(data):
        for key in keys[:-1]:
            data = data[key]
        data[keys[-1]] = value

    return edit


@pytest.mark.safety
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("state", "calibrators.0.raw", torch.zeros(1).expand(200_000_000)), "calibrators.0.raw"),
        (_set("state", "lattices.0.bank.raw", torch.zeros(1, 1, 1, 1).expand(2**31, 2, 2, 2)), "lattice"),
        (_set("state", "constraints", torch.zeros(1, 1, dtype=torch.int64).expand(2**31, 4)), "constraints"),
        (_set("state", "extra", torch.zeros(1).expand(200_000_000)), "extra"),
        (_set("keypoints", 0, torch.zeros(1).expand(200_000_000)), "keypoints"),
        (_set("fitted", "y_mean", torch.zeros(1).expand(200_000_000)), "y_mean"),
    ],
    ids=["calibrator", "lattice", "constraints", "extra-state", "keypoints", "fitted"],
)
def test_an_expanded_tensor_is_refused_before_anything_is_copied(tmp_path, monkeypatch, edit, message):
    """A stride-0 tensor costs a few bytes in the file and its whole element count once copied:
    every tensor's shape is checked against what the declaration implies first."""
    path = _saved_model(tmp_path)
    _tamper(path, edit)

    def refusing_large(method):
        def guarded(tensor, *args, **kwargs):
            if tensor.numel() > 10**6:
                raise AssertionError(f"a tensor of {tensor.numel()} elements was copied by {method.__name__}")
            return method(tensor, *args, **kwargs)

        return guarded

    for name in ("contiguous", "tolist", "copy_", "clone", "isfinite", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, refusing_large(getattr(torch.Tensor, name)))
    with pytest.raises(ValueError, match=rf"^{path}: .*{message}"):
        LatticeRegressor.load(path)


def _truncate(path):
    path.write_bytes(path.read_bytes()[:1000])


@pytest.mark.safety
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_bytes(b""), "not a readable model file"),
        (_truncate, "not a readable model file"),
        (lambda p: p.write_text("price,area\n1,2\n"), "not a readable model file"),
        (lambda p: (p.unlink(), p.mkdir()), "not a regular file"),
        (lambda p: _tamper(p, lambda d: d.pop("params")), "'params' is missing"),
        (lambda p: _tamper(p, _set("params", [1, 2])), "'params' is a list"),
        (lambda p: _tamper(p, _set("state", 3)), "'state' is a int"),
        (lambda p: _tamper(p, _set("state", "calibrators.0.raw", 3.0)), "calibrators.0.raw"),
        (lambda p: _tamper(p, _set("features", 0, {"shape": 1})), "features"),
        (lambda p: _tamper(p, _set("keypoints", [[0.0, 1.0]])), "keypoints"),
        (lambda p: _tamper(p, _set("keypoints", 0, [1.0, 0.0])), "keypoints of 'x0'"),
        (lambda p: _tamper(p, _set("keypoints", 0, [0.0, float("nan")])), "keypoints of 'x0'"),
        (lambda p: _tamper(p, _set("params", "learning_rates", 1.0)), "learning_rates"),
        (lambda p: _tamper(p, _set("params", "kind", "tree")), "kind must be"),
        (lambda p: _tamper(p, _set("chosen_params", "kind", "tree")), "kind must be"),
        (lambda p: _tamper(p, _set("chosen_params", "l2", -1.0)), "l2 must be"),
        (lambda p: _tamper(p, _set("params", "n_jobs", 2**31)), "n_jobs"),
        (lambda p: _tamper(p, _set("fitted", {})), "y_mean"),
        (lambda p: _tamper(p, _set("fitted", "y_scale", float("inf"))), "y_scale"),
        (lambda p: _tamper(p, lambda d: d["state"]["calibrators.1.raw"].fill_(float("nan"))), "NaN"),
        (lambda p: _tamper(p, lambda d: d["state"]["lattices.0.bank.raw"].fill_(float("inf"))), "NaN"),
        (lambda p: _tamper(p, _set("seed", "zero")), "'seed' is a str"),
    ],
    ids=[
        "empty",
        "truncated",
        "csv",
        "folder",
        "no-params",
        "params-list",
        "state-int",
        "state-float",
        "feature-fields",
        "keypoint-count",
        "keypoints-order",
        "keypoints-nan",
        "unknown-param",
        "bad-kind",
        "bad-chosen-kind",
        "negative-l2",
        "n_jobs",
        "no-y_mean",
        "y_scale-inf",
        "nan-parameter",
        "inf-parameter",
        "seed",
    ],
)
def test_a_model_file_that_fails_to_load_gives_one_value_error_naming_it(tmp_path, damage, message):
    path = _saved_model(tmp_path)
    damage(path)
    with pytest.raises(ValueError, match=f"^{path}: ") as err:
        LatticeRegressor.load(path)
    assert message in str(err.value)
    assert "weights_only=False" not in str(err.value)


@pytest.mark.safety
def test_a_classifier_file_with_broken_classes_is_refused(tmp_path):
    X, y = three_feature_table(60)
    path = tmp_path / "c.pt"
    LatticeClassifier(max_iter=2).fit(X, (y > np.median(y)).astype(int)).save(path)
    _tamper(path, _set("fitted", "classes", [0]))
    with pytest.raises(ValueError, match=f"^{path}: .*classes"):
        LatticeClassifier.load(path)
    _tamper(path, _set("fitted", "classes", list(range(10**6))))
    with pytest.raises(ValueError, match=f"^{path}: "):
        LatticeClassifier.load(path)
