"""Saving and loading the estimators: one torch file of plain values and tensors, written
atomically (:mod:`fastload.files`) and read with ``weights_only=True``, so no code from a file
runs. A file is checked before anything is built from it: its features' constraints against the
declaration stored with it (and, when the caller gives one, against the one it expects), and the
lattice sizes its parameters declare against the parameters it holds."""

from __future__ import annotations

import numbers
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch
from torch import nn

from fastload.files import replace_atomically
from fastload.monotonic.features import Feature, declared_features
from fastload.monotonic.fitting import TableModel

__all__ = [
    "FORMAT",
    "check_lattice_shapes",
    "load_checked_state",
    "plain_value",
    "read_estimator_file",
    "save_estimator",
    "saved_params",
    "scaled_ensembles",
    "stored_features",
]

FORMAT = "fastload.monotonic.estimator/2"
# Format 1: the same contents, saved before ensembles scaled their vertex parameters.
UNSCALED_FORMAT = "fastload.monotonic.estimator/1"


def plain_value(value, what: str = "the label"):
    """A category, class label or parameter value as a Python scalar, which a weights-only load
    accepts."""
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, (str, int, float, bool)):
        raise ValueError(
            f"cannot save {what} {value!r} of type {type(value).__name__}: use str, int or float values"
        )
    return value


def _plain_param(value, name: str):
    """A parameter's value as plain Python (dicts, lists, scalars, None), so a saved file always
    loads; ValueError naming the parameter for anything else."""
    if isinstance(value, dict):
        return {_plain_param(k, name): _plain_param(v, name) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain_param(v, name) for v in value]
    return None if value is None else plain_value(value, f"the parameter {name!r}, which holds")


_CONSTRAINT_WORDS = {
    "monotonicity": {1: "increasing", -1: "decreasing", 0: "none"},
    "convexity": {1: "convex", -1: "concave", 0: "none"},
}


def _constraint_differences(expected: Feature, stored: Feature, categories: Optional[List[Any]]) -> List[str]:
    """How ``stored`` (whose learned categories, in order, are ``categories``) breaks the
    constraints ``expected`` declares, one line per field; keypoint counts and a missing value's
    sentinel are not constraints, and the categories' order counts where ``expected`` gives it."""
    fields = ["monotonicity", "convexity", "categorical", "missing"]
    have = {f: getattr(stored, f) for f in fields}
    if expected.categories is not None:
        fields.append("categories")
        have["categories"] = None if categories is None else tuple(categories)

    def shown(field: str, value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else _CONSTRAINT_WORDS.get(field, {}).get(value, value)

    return [
        f"{expected.name!r}: {field}: expected {shown(field, getattr(expected, field))}, "
        f"the file has {shown(field, have[field])}"
        for field in fields
        if getattr(expected, field) != have[field]
    ]


def _saved_feature(feature: Feature) -> Dict[str, Any]:
    fields = asdict(feature)
    if feature.categories is not None:
        fields["categories"] = [plain_value(c) for c in feature.categories]
    if feature.missing_value is not None:
        fields["missing_value"] = plain_value(feature.missing_value)
    return fields


def _loaded_feature(fields: Dict[str, Any]) -> Feature:
    categories = fields["categories"]
    return Feature(**{**fields, "categories": None if categories is None else tuple(categories)})


def save_estimator(estimator, fitted: Dict[str, Any], path: Union[str, Path]) -> None:
    """Writes a fitted estimator's declaration, what fit learned (``fitted``: what its class
    learned besides keypoints, categories and parameters) and its parameters to ``path``.
    NumPy scalars become Python's, a RandomState the seed fit drew from it; ValueError names a
    parameter that holds anything else. Written by :func:`~fastload.files.replace_atomically`."""
    names = getattr(estimator, "feature_names_in_", None)
    params = estimator.get_params(deep=False)
    if isinstance(params["random_state"], np.random.RandomState):
        params["random_state"] = estimator.seed_  # what fit drew from it
    contents = {
        "format": FORMAT,
        "estimator": type(estimator).__name__,
        "params": {name: _plain_param(value, name) for name, value in params.items()},
        "features": [_saved_feature(f) for f in estimator.features_],
        "feature_names_in": None if names is None else [str(n) for n in names],
        "keypoints": estimator.keypoints_,
        "categories": [None if c is None else [plain_value(v) for v in c] for c in estimator.categories_],
        "fitted": fitted,
        "n_iter": estimator.n_iter_,
        "seed": estimator.seed_,
        "state": estimator.model_.state_dict(),
    }
    with replace_atomically(path, "model file") as f:
        torch.save(contents, f)


def read_estimator_file(path: Union[str, Path], estimator: str) -> Dict[str, Any]:
    """The contents of a file that :func:`save_estimator` wrote for an ``estimator`` (a class
    name), read with ``weights_only=True``; ValueError for another file or estimator."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") not in (FORMAT, UNSCALED_FORMAT):
        raise ValueError(f"{path} is not a file written by {estimator}.save")
    if data["estimator"] != estimator:
        raise ValueError(f"{path} holds a {data['estimator']}, not a {estimator}")
    return data


def scaled_ensembles(data: Dict[str, Any]) -> bool:
    """Whether a file's lattice ensembles scale their vertex parameters by the lattice count
    (:class:`~fastload.monotonic.LatticeEnsemble`'s ``parameter_scale``): not in format 1."""
    return data["format"] != UNSCALED_FORMAT


def saved_params(data: Dict[str, Any]) -> Dict[str, Any]:
    """The constructor arguments a file stores, in today's names: files saved before
    ``n_jobs`` and ``early_stopping`` hold ``torch_threads`` (1 then, as ``n_jobs=None`` now)
    and a ``validation_fraction`` that was None without early stopping."""
    params = dict(data["params"])
    params.pop("torch_threads", None)
    if "early_stopping" not in params:
        fraction = params.pop("validation_fraction", None)
        params["early_stopping"] = fraction is not None
        if fraction is not None:
            params["validation_fraction"] = fraction
    return params


def stored_features(
    path: Union[str, Path],
    data: Dict[str, Any],
    declared: Optional[Dict[Union[str, int], Any]],
    expected: Optional[Dict[Union[str, int], Any]],
) -> List[Feature]:
    """The features a file's ``data`` stores, refused (ValueError naming ``path``) when they
    disagree with the ``features`` parameter stored with them (``declared``), or, when
    ``expected`` is given, do not carry exactly the constraints it declares (monotonicity,
    convexity, categorical, missing, and the categories' order where given)."""
    stored = [_loaded_feature(f) for f in data["features"]]
    labels = [f.name for f in stored]
    # Categorical by dtype alone (a DataFrame's text column) is not in the declaration.
    by_dtype = [f.categorical for f in stored]
    redeclared = declared_features(declared, labels, by_dtype)
    if redeclared != stored:
        raise ValueError(
            f"{path}: its features {[f.description for f in stored]} disagree with its declaration "
            f"{[f.description for f in redeclared]}; the file was altered"
        )
    if expected is not None:
        wanted = declared_features(expected, labels, by_dtype, only_declared=True, source="the file's model")
        differ = [
            difference
            for e in wanted
            for difference in _constraint_differences(
                e, stored[labels.index(e.name)], data["categories"][labels.index(e.name)]
            )
        ]
        if differ:
            raise ValueError(f"{path} does not declare the expected features: " + "; ".join(differ))
    return stored


def check_lattice_shapes(
    path: Union[str, Path],
    state: Dict[str, Any],
    fields: Dict[str, Any],
    num_features: int,
    num_outputs: int,
) -> None:
    """Refuses (ValueError naming the file and the parameter) a loaded declaration whose
    lattices differ from the parameters stored with it: the sizes (``fields``: the file's
    ``lattice_size``, ``lattice_rank`` and ``num_lattices``) are checked before anything is
    built, so an altered ``lattice_size`` cannot make a load allocate more than the file holds."""
    for name, value in fields.items():
        if not (value is None and name == "num_lattices") and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
        ):
            raise ValueError(f"{path}: {name} {value!r} is not a positive integer")
    expected = TableModel.lattice_shape(num_features, *fields.values())
    for k in range(num_outputs):
        held = state.get(f"lattices.{k}.bank.raw")
        shape = tuple(held.shape) if isinstance(held, torch.Tensor) else None
        if shape == expected:
            continue
        if shape is None:
            raise ValueError(
                f"{path}: its kind 'lattice' declares lattices, but it holds none; the file was altered"
            )
        if len(shape) != len(expected):
            field = "lattice_rank"
        elif shape[1:] != expected[1:]:
            field = "lattice_size"
        else:
            field = "num_lattices"
        raise ValueError(
            f"{path}: its {field} {fields[field]!r} declares lattices of shape {expected}, but its "
            f"parameters hold {shape} for output {k}; the file was altered"
        )


def load_checked_state(model: nn.Module, state: Dict[str, Any], path: Union[str, Path]) -> None:
    """Loads a file's parameters into ``model``, which refuses a state with other constraints;
    ValueError naming the file for any mismatch."""
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"{path}: its parameters do not fit its declaration ({exc})") from None
