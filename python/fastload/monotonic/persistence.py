"""Saving and loading the estimators: one torch file of plain values and tensors, written
atomically (:mod:`fastload.files`) and read with ``weights_only=True``, so no code from a file
runs. A file is read through fastload's one input rule
(:func:`~fastload.files.read_regular_file`: a regular file under ``MAX_MODEL_FILE_BYTES``, a
named pipe refused without waiting) and checked before anything is built from it: every field's
type, its features' constraints against the declaration stored with it (and, when the caller
gives one, against the one it expects), its keypoints, the lattice sizes its parameters declare
against the parameters it holds, and then every state tensor's shape and dtype against the
model its declaration builds, and its values for NaN and infinity, before any is copied. A
tensor whose strides repeat one element (``torch.zeros(1).expand(2**33)``) costs a few bytes in
a file and its whole element count once copied: only where a tensor is expected, with the shape
expected, does it get that far. Every refusal is a ValueError that starts with the file's path."""

from __future__ import annotations

import contextlib
import io
import math
import numbers
import pickle
import re
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch
from torch import nn

from fastload.files import read_regular_file, replace_atomically
from fastload.monotonic.capacity import KINDS, Capacity
from fastload.monotonic.features import MAX_KEYPOINTS, Feature, declared_features
from fastload.monotonic.fitting import TableModel, threads_for
from fastload.monotonic.regularizers import REGULARIZERS, Regularization

__all__ = [
    "FORMAT",
    "FORMATS",
    "MAX_MODEL_FILE_BYTES",
    "check_lattice_shapes",
    "check_keypoints",
    "chosen_params",
    "check_state_shapes",
    "load_checked_state",
    "load_estimator",
    "plain_value",
    "read_estimator_file",
    "refusals_naming",
    "save_estimator",
    "saved_params",
    "scaled_ensembles",
    "stored_features",
]

FORMAT = "fastload.monotonic.estimator/3"
# Format 2: the same contents, saved before the estimators chose their capacity (kind="auto")
# and had regularisers: no "chosen_params", and their kind is the model's.
UNCHOSEN_FORMAT = "fastload.monotonic.estimator/2"
# Format 1: as format 2, saved before ensembles scaled their vertex parameters.
UNSCALED_FORMAT = "fastload.monotonic.estimator/1"
FORMATS = (FORMAT, UNCHOSEN_FORMAT, UNSCALED_FORMAT)
# The largest model file load reads: a model's lattices hold at most MAX_LATTICE_ENTRIES
# (2**24) float32 values per output, 64 MiB, so this leaves room for a few outputs.
MAX_MODEL_FILE_BYTES = 2**30
# What each field of a file holds (save_estimator writes them).
_FIELD_TYPES = {
    "format": str,
    "estimator": str,
    "params": dict,
    "features": list,
    "feature_names_in": (list, type(None)),
    "keypoints": list,
    "categories": list,
    "fitted": dict,
    "n_iter": int,
    "seed": int,
    "state": dict,
}


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


_FEATURE_FIELDS = {f.name for f in fields(Feature)}


def _loaded_feature(path: Union[str, Path], stored: Any) -> Feature:
    """A feature from a file's fields; ValueError naming the file for anything but the fields a
    :class:`Feature` has."""
    if not isinstance(stored, dict) or set(stored) != _FEATURE_FIELDS:
        raise ValueError(
            f"{path}: its features hold {stored!r:.200}, not the fields {sorted(_FEATURE_FIELDS)}; "
            "the file was altered"
        )
    categories = stored["categories"]
    if not (categories is None or isinstance(categories, list)):
        raise ValueError(
            f"{path}: feature {stored['name']!r} lists categories {categories!r:.200}; the file was altered"
        )
    return Feature(**{**stored, "categories": None if categories is None else tuple(categories)})


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
        "chosen_params": _plain_param(estimator.chosen_params_, "chosen_params_"),
        "n_iter": estimator.n_iter_,
        "seed": estimator.seed_,
        "state": estimator.model_.state_dict(),
    }
    with replace_atomically(path, "model file") as f:
        torch.save(contents, f)


def read_estimator_file(path: Union[str, Path], estimator: str) -> Dict[str, Any]:
    """The contents of a file that :func:`save_estimator` wrote for an ``estimator`` (a class
    name): read whole by :func:`~fastload.files.read_regular_file` (a named pipe, a folder or a
    file over ``MAX_MODEL_FILE_BYTES`` is refused), unpickled with ``weights_only=True`` from
    those bytes, and each field's type checked, with no tensor outside the state. ValueError
    naming ``path`` for another file or estimator, a damaged file or one holding code; a missing
    or unreadable file is the OSError naming it."""
    raw = read_regular_file(path, MAX_MODEL_FILE_BYTES, "model file")
    try:
        data = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # a damaged file fails anywhere in torch's reader, as any type
        found = re.search(r"GLOBAL (\S+)", str(exc))
        if isinstance(exc, pickle.UnpicklingError) and found:
            raise ValueError(
                f"{path}: not a model file: it refers to {found.group(1)}, and no code from a file runs"
            ) from None
        raise ValueError(f"{path}: not a readable model file ({_reading_failure(exc)})") from None
    if not isinstance(data, dict) or data.get("format") not in FORMATS:
        raise ValueError(f"{path} is not a file written by {estimator}.save")
    _check_fields(path, data)
    if data["estimator"] != estimator:
        raise ValueError(f"{path} holds a {data['estimator']}, not a {estimator}")
    return data


# The lines of torch's weights-only refusal that are its advice, not the failure; the advice
# (rerun with weights_only=False) would run a file's code, so it is never passed on.
_TORCH_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def _reading_failure(exc: Exception) -> str:
    """What went wrong in torch's reader, in one line without its advice."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    failure = [line for line in lines if not line.startswith(_TORCH_ADVICE)]
    return f"{type(exc).__name__}: {failure[0] if failure else 'the file ends early':.200}"


def _check_fields(path: Union[str, Path], data: Dict[str, Any]) -> None:
    """Refuses a file whose fields are missing or of other types than save writes, whose lists
    per feature differ in length, whose state holds anything but named tensors, or that holds a
    tensor anywhere else (where nothing checks its size)."""
    for name, kind in _FIELD_TYPES.items():
        if name not in data:
            raise ValueError(f"{path}: its field {name!r} is missing; the file was altered")
        value = data[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(
                f"{path}: its field {name!r} is a {type(value).__name__}, not what save writes; "
                "the file was altered"
            )
    for name in ("n_iter", "seed"):  # as fit counts and draws them
        if not 0 <= data[name] < 2**62:
            raise ValueError(f"{path}: its {name} {data[name]} is outside [0, 2**62); the file was altered")
    count = len(data["features"])
    names = data["feature_names_in"]
    for name, held in [("keypoints", data["keypoints"]), ("categories", data["categories"])] + (
        [] if names is None else [("feature_names_in", names)]
    ):
        if len(held) != count:
            raise ValueError(
                f"{path}: its {name} list {len(held)} features, its features {count}; the file was altered"
            )
    for name, value in data["state"].items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise ValueError(
                f"{path}: its parameter {name!r:.100} holds a {type(value).__name__}, not a tensor"
            )
    stray = _tensors_in({k: v for k, v in data.items() if k != "state"}, "")
    if stray:
        raise ValueError(
            f"{path}: {', '.join(stray[:5])} hold tensors, which only its parameters may; the file was altered"
        )


def _tensors_in(value: Any, where: str) -> List[str]:
    """Where in ``value`` (nested dicts and lists) a tensor is."""
    if isinstance(value, torch.Tensor):
        return [where]
    if isinstance(value, dict):
        return [t for key, item in value.items() for t in _tensors_in(item, f"{where}[{key!r:.50}]")]
    if isinstance(value, (list, tuple)):
        return [t for j, item in enumerate(value) for t in _tensors_in(item, f"{where}[{j}]")]
    return []


def check_keypoints(
    path: Union[str, Path], features: List[Feature], keypoints: List[Any], categories: List[Any]
) -> None:
    """Refuses a file whose numeric features do not each hold from 2 to ``MAX_KEYPOINTS``
    finite, increasing keypoints, or whose categorical features hold keypoints or no category
    list (what a calibrator is built from, before it is built)."""
    for feature, points, cats in zip(features, keypoints, categories):
        if feature.categorical:
            if points is not None or not isinstance(cats, list) or not cats:
                raise ValueError(
                    f"{path}: categorical feature {feature.name!r} holds no categories; the file was altered"
                )
            continue
        if cats is not None or not isinstance(points, list) or not 2 <= len(points) <= MAX_KEYPOINTS:
            raise ValueError(
                f"{path}: the keypoints of {feature.name!r} are not a list of 2 to {MAX_KEYPOINTS} numbers; "
                "the file was altered"
            )
        numbers_only = all(isinstance(p, numbers.Real) and not isinstance(p, bool) for p in points)
        if (
            not numbers_only
            or not all(math.isfinite(p) for p in points)
            or any(b <= a for a, b in zip(points, points[1:]))
        ):
            raise ValueError(
                f"{path}: the keypoints of {feature.name!r} are not finite and increasing; the file was altered"
            )


def chosen_params(data: Dict[str, Any]) -> Dict[str, Any]:
    """What a file's model was fitted with (``chosen_params_``: kind, early stopping,
    regularisers, how its calibrators started), checked: a file saved before fit chose them was
    fitted with its parameters' kind and early stopping, no regulariser, and even steps."""
    if data["format"] != FORMAT:
        params = saved_params(data)
        return Capacity(
            params.get("kind"),
            Regularization(),
            params["early_stopping"],
            params.get("validation_fraction", 0.1),
            False,
        ).params()
    chosen = data.get("chosen_params")
    fields = set(Capacity._fields) - {"regularization"} | set(REGULARIZERS)
    if not isinstance(chosen, dict) or set(chosen) != fields:
        raise ValueError(f"its chosen_params {chosen!r:.200} do not hold just {sorted(fields)}")
    Capacity.of(chosen)  # refuses a strength out of range
    return dict(chosen)


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
    stored = [_loaded_feature(path, f) for f in data["features"]]
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


def check_state_shapes(path: Union[str, Path], model: nn.Module, state: Dict[str, torch.Tensor]) -> None:
    """Refuses a file's state (ValueError naming the file and the parameter) unless it holds
    exactly the tensors of ``model``, built from the file's declaration, each of their shape
    and dtype and, for floating-point ones, finite: checked before any is copied, so a tensor
    of a repeated element cannot grow into its element count, and a NaN or infinite parameter
    cannot load into a model that predicts NaN."""
    expected = model.state_dict()
    unexpected = sorted(set(state) - set(expected))
    missing = sorted(set(expected) - set(state))
    if unexpected or missing:
        raise ValueError(
            f"{path}: its parameters do not fit its declaration (unexpected: {unexpected[:5]}, "
            f"missing: {missing[:5]}); the file was altered"
        )
    for name, wanted in expected.items():
        held = state[name]
        if held.shape != wanted.shape or held.dtype != wanted.dtype:
            raise ValueError(
                f"{path}: its parameter {name} is {held.dtype} of shape {tuple(held.shape)}, where its "
                f"declaration implies {wanted.dtype} of shape {tuple(wanted.shape)}; the file was altered"
            )
        if held.is_floating_point() and not torch.isfinite(held).all():
            raise ValueError(
                f"{path}: its parameter {name} holds NaN or infinite values; the file is damaged"
            )


def check_linear_shape(
    path: Union[str, Path], state: Dict[str, Any], num_features: int, num_outputs: int
) -> None:
    """Refuses (ValueError naming the file) a linear model whose weights are not one per
    feature and output, before a layer of that size is built."""
    held = state.get("linear.raw_weight")
    shape = tuple(held.shape) if isinstance(held, torch.Tensor) else None
    if shape != (num_outputs, num_features):
        raise ValueError(
            f"{path}: its declaration implies linear weights of shape {(num_outputs, num_features)}, but "
            f"its parameters hold {shape}; the file was altered"
        )


@contextlib.contextmanager
def refusals_naming(path: Union[str, Path]):
    """Every refusal raised in the block as a ValueError that starts with ``path``: the checks of
    the constructor, the layers and the estimators' restored state speak of parameters, and a
    file's reader needs to know which file holds them. A TypeError there is a field of the
    wrong type that no earlier check knew of."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith(str(path)):
            raise
        raise ValueError(f"{path}: {exc}; the file was altered") from None


def load_checked_state(model: nn.Module, state: Dict[str, Any], path: Union[str, Path]) -> None:
    """Loads a file's parameters into ``model``, which refuses a state with other constraints;
    ValueError naming the file for any mismatch."""
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"{path}: its parameters do not fit its declaration ({exc})") from None


def load_estimator(cls, path: Union[str, Path], features: Optional[Dict[Union[str, int], Any]]):
    """The estimator of class ``cls`` that :func:`save_estimator` wrote to ``path``: the file
    read and its fields checked (:func:`read_estimator_file`), its declaration and what fit
    learned checked, the model built from them, and its state checked against that model
    (:func:`check_state_shapes`) before it is loaded; ``features``, when given, are the
    constraints the caller expects (:func:`stored_features`). Every refusal is a ValueError
    starting with ``path``."""
    data = read_estimator_file(path, cls.__name__)
    with refusals_naming(path):
        params = saved_params(data)
        unknown = sorted(set(params) - set(cls().get_params()))
        if unknown:
            raise ValueError(f"{path}: it sets parameters {cls.__name__} does not have: {unknown}")
        estimator = cls(**params)
        if estimator.kind not in KINDS:
            raise ValueError(f"kind must be one of {list(KINDS)}, got {estimator.kind!r}")
        threads_for(estimator.n_jobs)  # refused by name here, not at the first predict
        stored = stored_features(path, data, estimator.features, features)
        check_keypoints(path, stored, data["keypoints"], data["categories"])
        estimator.features_, estimator.n_features_in_ = stored, len(stored)
        if data["feature_names_in"] is not None:
            estimator.feature_names_in_ = np.array(data["feature_names_in"], dtype=object)
        estimator.keypoints_, estimator.categories_ = data["keypoints"], data["categories"]
        estimator._restore(data["fitted"])
        estimator.n_iter_, estimator.seed_ = data["n_iter"], data["seed"]
        chosen = chosen_params(data)
        estimator.kind_, estimator.chosen_params_ = chosen["kind"], chosen
        outputs = estimator._num_outputs()
        if estimator.kind_ == "lattice":  # the linear model's size follows from the listed features
            sizes = {
                "lattice_size": estimator.lattice_size,
                "lattice_rank": estimator.lattice_rank,
                "num_lattices": estimator.num_lattices,
            }
            check_lattice_shapes(path, data["state"], sizes, len(stored), outputs)
        elif estimator.kind_ == "linear":  # any other kind is refused by the model
            check_linear_shape(path, data["state"], len(stored), outputs)
        model = estimator._build(outputs, estimator.seed_, scaled_ensembles(data))
        check_state_shapes(path, model, data["state"])
        load_checked_state(model, data["state"], path)  # refuses a state with other constraints
        estimator.model_ = model.eval()
        return estimator
