"""Monotone models on tables: :class:`LatticeRegressor` and :class:`LatticeClassifier`.

A practitioner with a table wants to say "the price never falls as the area grows, never rises
with the distance to town" by column name, call ``fit`` and ``predict``, and trust that it holds
for every row the model will ever see. These estimators are calibrated lattices (what TF
Lattice and pytorch-lattice build): each feature goes through its own calibrator
(:class:`~fastload.monotonic.PWLCalibrator` over quantile keypoints of the data, or a
:class:`~fastload.monotonic.CategoricalCalibrator`) into a
:class:`~fastload.monotonic.Lattice` (a
:class:`~fastload.monotonic.LatticeEnsemble` past ``lattice_rank`` features), trained
with Adam on the CPU from a fixed seed. The guarantees are the layers' (their module
docstring): monotone by construction after every step, exactly under rounding in each
calibrator and in a lattice's first monotone input, within a stated rounding bound in the others;
:meth:`check_monotone` measures it on data. They cover present values: a missing value (NaN,
None or a declared sentinel) gets its own learned output, so across a sentinel such as -1 the
raw input is not monotone.

Why the names: ``LatticeRegressor``/``LatticeClassifier`` say the model family and follow
scikit-learn's naming; ``MonotonicRegressor`` is the image model that ``fastload train`` fits.
With scikit-learn installed they are scikit-learn estimators (``clone``, pipelines, grid
search, ``check_estimator``); without it they keep the same methods, so fastload does not
depend on it. Features are declared by name::

    LatticeRegressor(features={"age": "increasing", "debt": "decreasing", "region": "categorical",
                               "income": {"monotonicity": "increasing", "convexity": "concave",
                                          "missing": True}})

A spec is ``"increasing"``, ``"decreasing"``, ``"categorical"``, ``"convex"``, ``"concave"``,
None, or a dict of ``monotonicity``, ``convexity``, ``categorical``, ``categories`` (their
order: a monotone categorical feature is monotone in it, and needs it unless its column is an
ordered pandas Categorical), ``missing`` (True: NaN or None is a missing value with its own
learned output; a value: that value too; False or None: no missing values) and
``num_keypoints``.
Undeclared features are free; a DataFrame column that is not numeric is categorical. A NumPy
array's columns are named ``x0``, ``x1``, ... (or declared by position); a DataFrame's column
names are strings (``str`` of each when some are not). NaN in a feature not
declared ``missing`` is an error, as in scikit-learn.

``kind="linear"`` replaces the lattice by a weighted sum of the calibrated features (TF
Lattice's calibrated linear model): weights are non-negative on monotone, convex and concave
features, so a convex (concave) feature makes the prediction itself convex (concave) in it
between its first and last keypoint (the calibrators are constant outside), not only its
calibrator; fewer interactions, faster to train. Monotone up to the rounding of
its matrix product (:class:`~fastload.monotonic.MonotoneLinear`), not exactly.

Multi-class: one lattice per class gives that class's score (its logit), and each score is
monotone in the declared features; a softmax probability of one class is not (it also falls
when another class's score rises), so for multi-class the guarantee is about
``decision_function``. Binary: ``predict_proba[:, 1]``, the probability of ``classes_[1]``, is
monotone (a sigmoid of the score, monotone in real arithmetic; its float evaluation may tie-split
by an ulp).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import numbers
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fastload.errors import NotFittedError
from fastload.files import replace_atomically
from fastload.monotonic.calibrators import CategoricalCalibrator, PWLCalibrator
from fastload.monotonic.constraints import (
    CURVATURES,
    as_direction,
    check_declared_buffer,
    check_finite_parameters,
    check_monotone,
)
from fastload.monotonic.lattice import Lattice, LatticeEnsemble
from fastload.monotonic.linear import MonotoneLinear

try:  # optional: with scikit-learn the estimators are its estimators (clone, tags, pipelines)
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
    from sklearn.exceptions import DataConversionWarning
except ImportError:  # the same methods without it

    class DataConversionWarning(UserWarning):  # type: ignore[no-redef]
        """A target was reshaped to what the estimator needs."""

    class BaseEstimator:  # type: ignore[no-redef]
        """``get_params``/``set_params`` from the constructor's arguments, as scikit-learn's."""

        @classmethod
        def _get_param_names(cls) -> List[str]:
            return sorted(p for p in inspect.signature(cls.__init__).parameters if p != "self")

        def get_params(self, deep: bool = True) -> Dict[str, Any]:
            return {name: getattr(self, name) for name in self._get_param_names()}

        def set_params(self, **params):
            for name, value in params.items():
                if name not in self._get_param_names():
                    raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}")
                setattr(self, name, value)
            return self

    class RegressorMixin:  # type: ignore[no-redef]
        def score(self, X, y) -> float:
            """R^2 of ``predict(X)`` against y."""
            y = np.asarray(y, dtype=np.float64).ravel()
            residual = ((y - self.predict(X)) ** 2).sum()
            total = ((y - y.mean()) ** 2).sum()
            return 1.0 - residual / total if total > 0 else float(residual == 0)

    class ClassifierMixin:  # type: ignore[no-redef]
        def score(self, X, y) -> float:
            """Accuracy of ``predict(X)`` against y."""
            return float(np.mean(self.predict(X) == np.asarray(y).ravel()))


__all__ = ["LatticeClassifier", "LatticeRegressor"]

_FORMAT = "fastload.monotonic.estimator/1"
_SPEC_KEYS = ("monotonicity", "convexity", "categorical", "categories", "missing", "num_keypoints")
_SPEC_WORDS = {
    "increasing": {"monotonicity": 1},
    "decreasing": {"monotonicity": -1},
    "categorical": {"categorical": True},
    "convex": {"convexity": 1},
    "concave": {"convexity": -1},
    "none": {},
}


@dataclass(frozen=True)
class _Feature:
    """One feature's declaration, parsed and checked."""

    name: str
    monotonicity: int = 0
    convexity: int = 0
    categorical: bool = False
    categories: Optional[Tuple[Any, ...]] = None
    missing: bool = False
    missing_value: Any = None
    num_keypoints: Optional[int] = None

    @property
    def description(self) -> str:
        words = [
            {1: "increasing", -1: "decreasing"}.get(self.monotonicity, ""),
            {1: "convex", -1: "concave"}.get(self.convexity, ""),
            "categorical" if self.categorical else "",
            "may be missing" if self.missing else "",
        ]
        return ", ".join(w for w in words if w) or "free"


def _check_keypoint_count(count: Any, where: str) -> int:
    """``count`` as an int >= 2 (fewer keypoints make a constant calibrator); ValueError naming
    ``where`` otherwise."""
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 2:
        raise ValueError(f"{where}num_keypoints must be an int >= 2, got {count!r}")
    return int(count)


def _parse_spec(name: str, spec: Any, categorical_column: bool) -> _Feature:
    """A feature's declaration from its spec (a word, None or a dict); ValueError naming the
    feature for anything else."""
    if spec is None or isinstance(spec, str):
        if spec is not None and spec.lower() not in _SPEC_WORDS:
            raise ValueError(
                f"feature {name!r}: unknown spec {spec!r}; use one of {sorted(_SPEC_WORDS)}, None or a dict"
            )
        fields: Dict[str, Any] = dict(_SPEC_WORDS[spec.lower()]) if spec is not None else {}
    elif isinstance(spec, dict):
        unknown = sorted(set(spec) - set(_SPEC_KEYS))
        if unknown:
            raise ValueError(
                f"feature {name!r}: unknown keys {unknown}; a spec dict takes {list(_SPEC_KEYS)}"
            )
        fields = dict(spec)
    else:
        raise ValueError(f"feature {name!r}: a spec is a word, None or a dict, got {spec!r}")
    monotonicity = as_direction(fields.get("monotonicity"))
    convexity = as_direction(fields.get("convexity"), CURVATURES)
    if monotonicity not in (-1, 0, 1):
        raise ValueError(
            f"feature {name!r}: monotonicity must be 'increasing', 'decreasing' or None, got {monotonicity!r}"
        )
    if convexity not in (-1, 0, 1):
        raise ValueError(
            f"feature {name!r}: convexity must be 'convex', 'concave' or None, got {convexity!r}"
        )
    categories = fields.get("categories")
    categorical = bool(fields.get("categorical", False)) or categories is not None or categorical_column
    if categorical and convexity:
        raise ValueError(f"feature {name!r}: a categorical feature cannot be convex or concave")
    if categories is not None:
        categories = tuple(categories)
        if not categories or len(set(categories)) != len(categories):
            raise ValueError(
                f"feature {name!r}: categories must be distinct and not empty, got {list(categories)}"
            )
    missing = fields.get("missing")
    if missing is None or isinstance(missing, (bool, np.bool_)):
        missing = bool(missing)  # None: no missing values, as False
    missing_value = None if isinstance(missing, bool) else missing
    if (
        missing_value is not None
        and not categorical
        and not (isinstance(missing_value, numbers.Real) and math.isfinite(missing_value))
    ):
        raise ValueError(f"feature {name!r}: missing is True, False or a finite number, got {missing!r}")
    num_keypoints = fields.get("num_keypoints")
    if num_keypoints is not None:
        num_keypoints = _check_keypoint_count(num_keypoints, f"feature {name!r}: ")
    return _Feature(
        name,
        monotonicity,
        convexity,
        categorical,
        categories,
        missing is not False,
        missing_value,
        num_keypoints,
    )


def _is_frame(X) -> bool:
    return hasattr(X, "columns") and hasattr(X, "iloc") and hasattr(X, "dtypes")


def _missing_mask(values: np.ndarray) -> np.ndarray:
    """None, NaN (and pandas' NA and NaT) in an object column."""
    try:
        import pandas

        return np.asarray(pandas.isna(values), dtype=bool)
    except ImportError:
        return np.array([v is None or (isinstance(v, float) and math.isnan(v)) for v in values], dtype=bool)


def _plain(value, what: str = "the label"):
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
    return None if value is None else _plain(value, f"the parameter {name!r}, which holds")


@contextlib.contextmanager
def _torch_threads(count: Optional[int]):
    """torch's intra-op thread count set to ``count`` for the block (None: left alone)."""
    if count is None:
        yield
        return
    if int(count) < 1:
        raise ValueError(f"torch_threads must be >= 1 or None, got {count}")
    before = torch.get_num_threads()
    torch.set_num_threads(int(count))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _TableModel(nn.Module):
    """Calibrators, one per feature, into ``num_outputs`` lattices (or ensembles). Its
    ``constraints`` buffer, one row (monotonicity, convexity, categorical, missing) per
    feature, is checked against a loaded state, so a state cannot bring other constraints."""

    def __init__(
        self,
        features: Sequence[_Feature],
        keypoints: Sequence[Optional[Sequence[float]]],
        categories: Sequence[Optional[Sequence[Any]]],
        lattice_size: int,
        lattice_rank: int,
        num_lattices: Optional[int],
        num_outputs: int,
        seed: int,
        kind: str,
    ):
        super().__init__()
        top = lattice_size - 1.0
        calibrators: List[nn.Module] = []
        for feature, points, cats in zip(features, keypoints, categories):
            if feature.categorical:
                calibrators.append(
                    CategoricalCalibrator(
                        len(cats), feature.monotonicity, 0.0, top, impute_missing=feature.missing
                    )
                )
            else:
                calibrators.append(
                    PWLCalibrator(
                        input_keypoints=points,
                        monotonicity=feature.monotonicity,
                        output_min=0.0,
                        output_max=top,
                        convexity=feature.convexity,
                        impute_missing=feature.missing,
                    )
                )
        self.calibrators = nn.ModuleList(calibrators)
        count = len(features)
        self.linear = None
        if kind == "linear":
            # Non-negative weights keep each calibrator's direction and its convexity.
            signs = [1 if f.monotonicity or f.convexity else 0 for f in features]
            self.linear = MonotoneLinear(count, num_outputs, signs)
        # Each calibrator turns its feature the declared way, so the lattice increases in it.
        mono = [1 if f.monotonicity else 0 for f in features]
        number, *sizes = self.lattice_shape(count, lattice_size, lattice_rank, num_lattices)
        lattices: List[nn.Module] = []
        for k in range(num_outputs if kind == "lattice" else 0):
            if count <= lattice_rank:
                lattices.append(Lattice(sizes, mono))
            else:
                lattices.append(LatticeEnsemble(count, lattice_rank, number, lattice_size, mono, seed + k))
        self.lattices = nn.ModuleList(lattices)
        constraints = [[f.monotonicity, f.convexity, int(f.categorical), int(f.missing)] for f in features]
        self.register_buffer("constraints", torch.tensor(constraints, dtype=torch.int64))

    @staticmethod
    def lattice_shape(
        count: int, lattice_size: int, lattice_rank: int, num_lattices: Optional[int]
    ) -> Tuple[int, ...]:
        """The shape of each output's lattice vertex parameter (``lattices.K.bank.raw``): one
        lattice over the ``count`` features, or an ensemble of lattices over ``lattice_rank``
        features each."""
        if count <= lattice_rank:
            return (1,) + (lattice_size,) * count
        return (num_lattices or math.ceil(2 * count / lattice_rank),) + (lattice_size,) * lattice_rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, features) encoded values (category codes, NaN for missing) -> (N, num_outputs)."""
        calibrated = torch.stack([cal(x[:, j]) for j, cal in enumerate(self.calibrators)], 1)
        if self.linear is not None:
            return self.linear(calibrated)
        return torch.stack([lattice(calibrated) for lattice in self.lattices], 1)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        check_declared_buffer(
            self,
            state_dict,
            prefix,
            "constraints",
            "feature constraints (monotonicity, convexity, categorical, missing)",
        )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class _Sweep(nn.Module):
    """``model`` with feature ``column`` replaced by ``sign`` times the swept values, the shape
    :func:`~fastload.monotonic.check_monotone` sweeps upward."""

    def __init__(self, model: nn.Module, column: int, sign: int):
        super().__init__()
        self.model, self.column, self.sign = model, column, sign

    def forward(self, x: torch.Tensor, swept: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, self.column] = self.sign * swept[:, 0]
        return self.model(x)


class _LatticeEstimator(BaseEstimator):
    """What the regressor and the classifier share: declarations, encoding, training, checks,
    save and load."""

    def __init__(
        self,
        features: Optional[Dict[Union[str, int], Any]] = None,
        lattice_size: int = 2,
        num_keypoints: int = 10,
        lattice_rank: int = 4,
        num_lattices: Optional[int] = None,
        max_iter: int = 300,
        learning_rate: float = 0.05,
        batch_size: Optional[int] = None,
        validation_fraction: Optional[float] = None,
        n_iter_no_change: int = 20,
        random_state: Optional[int] = 0,
        kind: str = "lattice",
        torch_threads: Optional[int] = 1,
    ):
        self.features = features
        self.lattice_size = lattice_size
        self.num_keypoints = num_keypoints
        self.lattice_rank = lattice_rank
        self.num_lattices = num_lattices
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.random_state = random_state
        self.kind = kind
        self.torch_threads = torch_threads

    # ------------------------------------------------------------------------------- inputs

    def _columns(self, X, fitting: bool) -> Tuple[List[Any], Optional[List[str]], Tuple[int, int]]:
        """X's columns, its feature names (DataFrames with string column names) and shape; the
        checks and messages of scikit-learn's own input validation."""
        if X is None:
            raise ValueError(f"{type(self).__name__} needs X, got None")
        if hasattr(X, "nnz") and hasattr(X, "toarray"):
            raise TypeError("sparse input is not supported: densify it with X.toarray()")
        if _is_frame(X):
            # Names as strings once any is a string, so a mixed frame's names still declare.
            names = [str(c) for c in X.columns] if any(isinstance(c, str) for c in X.columns) else None
            shape = tuple(X.shape)
            columns = [X.iloc[:, j] for j in range(shape[1])]
        else:
            array = np.asarray(X)
            if np.iscomplexobj(array):
                raise ValueError("Complex data not supported")
            if array.ndim != 2:
                raise ValueError(
                    f"Expected a 2D array, got a {array.ndim}D array instead. Reshape your data either "
                    "using array.reshape(-1, 1) if your data has a single feature or array.reshape(1, -1) "
                    "if it contains a single sample."
                )
            names, shape, columns = None, array.shape, [array[:, j] for j in range(array.shape[1])]
        if not fitting:
            self._check_fitted()
        if shape[1] == 0:
            raise ValueError(f"0 feature(s) (shape={shape}) while a minimum of 1 is required.")
        if shape[0] == 0:
            raise ValueError(
                f"Found array with 0 sample(s) (shape={shape}) while a minimum of 1 is required."
            )
        if not fitting:
            if shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has {shape[1]} features, but {type(self).__name__} is expecting "
                    f"{self.n_features_in_} features as input."
                )
            fitted = getattr(self, "feature_names_in_", None)
            if names is None and fitted is not None:
                warnings.warn(
                    f"X does not have valid feature names, but {type(self).__name__} was fitted with feature names",
                    UserWarning,
                    stacklevel=3,
                )
            elif names is not None and fitted is None:
                warnings.warn(
                    f"X has feature names, but {type(self).__name__} was fitted without feature names",
                    UserWarning,
                    stacklevel=3,
                )
            elif names is not None and list(fitted) != names:
                raise ValueError(
                    f"The feature names should match those that were passed during fit: fitted with "
                    f"{list(fitted)}, got {names}"
                )
        return columns, names, shape

    def _declare(self, columns: List[Any], names: Optional[List[str]]) -> List[_Feature]:
        """Each column's parsed declaration, from ``features`` by name or position; a
        DataFrame's non-numeric column is categorical."""
        labels = names or [f"x{j}" for j in range(len(columns))]
        text = [_is_frame_column(c) and not _numeric_series(c) for c in columns]
        return _redeclare(self.features, labels, text)

    def _encode(self, columns: List[Any], fitting: bool) -> torch.Tensor:
        """Columns -> float32 tensor: numbers, category codes, NaN for missing values; fitting
        also learns each feature's keypoints (numbers) or categories."""
        encoded = np.empty((len(columns[0]), len(columns)), dtype=np.float64)
        if fitting:
            self.keypoints_, self.categories_ = [], []
        for j, (feature, column) in enumerate(zip(self.features_, columns)):
            encode = self._encode_categories if feature.categorical else self._encode_numbers
            encoded[:, j] = encode(j, feature, column, fitting)
        return torch.tensor(encoded, dtype=torch.float32)

    def _encode_numbers(self, j: int, feature: _Feature, column, fitting: bool) -> np.ndarray:
        try:
            if _is_frame_column(column):
                column = column.to_numpy(dtype=np.float64, na_value=np.nan)
            values = np.asarray(column, dtype=np.float64)
        except (ValueError, TypeError) as error:
            hint = "; declare it 'categorical'" if fitting else ""
            raise type(error)(  # ValueError or TypeError, as NumPy's (scikit-learn checks which)
                f"feature {feature.name!r} holds values that are not numbers ({error}){hint}"
            ) from error
        missing = np.isnan(values)
        if feature.missing_value is not None:
            missing |= values == feature.missing_value
        if np.isinf(values).any():
            raise ValueError(f"Input X contains infinity in feature {feature.name!r}")
        if missing.any() and not feature.missing:
            raise ValueError(
                f"Input X contains NaN in feature {feature.name!r}; declare it "
                "{'missing': True} to learn an output for missing values"
            )
        values = np.where(missing, np.nan, values)
        if fitting:
            present = values[~missing]
            count = feature.num_keypoints or self.num_keypoints
            # Quantiles, so each piece sees about as many samples; distinct in float32.
            points = (
                np.unique(np.quantile(present, np.linspace(0, 1, count)).astype(np.float32))
                if len(present)
                else []
            )
            if len(points) < 2:  # a constant (or absent) feature: any two keypoints around it
                low = float(points[0]) if len(points) else 0.0
                points = np.array([low, low + max(1.0, abs(low) * 1e-3)])
            self.keypoints_.append([float(p) for p in points])
            self.categories_.append(None)
        return values

    def _encode_categories(self, j: int, feature: _Feature, column, fitting: bool) -> np.ndarray:
        values = np.asarray(column.to_numpy() if _is_frame_column(column) else column, dtype=object)
        values = np.array([v.item() if isinstance(v, np.generic) else v for v in values], dtype=object)
        missing = _missing_mask(values)
        if feature.missing_value is not None:
            missing |= np.array([v == feature.missing_value for v in values], dtype=bool)
        if missing.any() and not feature.missing:
            raise ValueError(
                f"Input X contains NaN (or None) in feature {feature.name!r}; declare it "
                "{'missing': True} to learn an output for missing values"
            )
        if fitting:
            if feature.categories is not None:
                categories = list(feature.categories)
            elif _is_frame_column(column) and getattr(getattr(column, "cat", None), "ordered", False):
                categories = column.cat.categories.tolist()  # an ordered Categorical declares it
            elif feature.monotonicity:
                raise ValueError(
                    f"feature {feature.name!r} is monotone but the order of its categories is not "
                    "declared: pass categories=[...] in its spec (lowest first), or an ordered "
                    "pandas Categorical"
                )
            else:
                distinct = list(dict.fromkeys(values[~missing].tolist()))
                try:
                    categories = sorted(distinct)
                except TypeError:  # mixed types: order of appearance
                    categories = distinct
            self.keypoints_.append(None)
            self.categories_.append(categories)
        lookup = {c: i for i, c in enumerate(self.categories_[j])}
        codes = np.full(len(values), np.nan)
        for i, value in enumerate(values):
            if missing[i]:
                continue
            code = lookup.get(value)
            if code is None:
                if fitting or not feature.missing:
                    raise ValueError(
                        f"feature {feature.name!r} has the value {value!r}, which is not one of its "
                        f"categories {self.categories_[j]}"
                        + (
                            ""
                            if fitting
                            else "; declare it {'missing': True} to treat unseen values as missing"
                        )
                    )
                continue  # an unseen category is a missing value
            codes[i] = code
        return codes

    def _prepare(self, X, fitting: bool) -> torch.Tensor:
        columns, names, shape = self._columns(X, fitting)
        if fitting:
            _check_keypoint_count(self.num_keypoints, "")
            self.features_ = self._declare(columns, names)
            self.n_features_in_ = shape[1]
            if names is not None:
                self.feature_names_in_ = np.array(names, dtype=object)
            elif hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        return self._encode(columns, fitting)

    # ---------------------------------------------------------------------------- training

    def _seed(self) -> int:
        if self.random_state is None:
            return int(np.random.randint(2**31))
        if isinstance(self.random_state, np.random.RandomState):
            return int(self.random_state.randint(2**31))
        return int(self.random_state)

    def _build(self, num_outputs: int, seed: int) -> _TableModel:
        if int(self.lattice_size) < 2:
            raise ValueError(f"lattice_size must be >= 2, got {self.lattice_size}")
        if int(self.lattice_rank) < 1:
            raise ValueError(f"lattice_rank must be >= 1, got {self.lattice_rank}")
        if self.kind not in ("lattice", "linear"):
            raise ValueError(f"kind must be 'lattice' or 'linear', got {self.kind!r}")
        with torch.random.fork_rng(devices=[]):  # lattices draw initial noise from the global RNG
            torch.manual_seed(seed)
            return _TableModel(
                self.features_,
                self.keypoints_,
                self.categories_,
                int(self.lattice_size),
                int(self.lattice_rank),
                self.num_lattices,
                num_outputs,
                seed,
                self.kind,
            )

    def _train(self, x: torch.Tensor, target: torch.Tensor, num_outputs: int, loss) -> None:
        with _torch_threads(self.torch_threads):
            self._train_in_threads(x, target, num_outputs, loss)

    def _train_in_threads(self, x: torch.Tensor, target: torch.Tensor, num_outputs: int, loss) -> None:
        """Adam, full batch or minibatches, from ``random_state``; with ``validation_fraction``
        stops after ``n_iter_no_change`` epochs without a better validation loss and keeps the
        best epoch's parameters."""
        for name in ("max_iter", "n_iter_no_change"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        self.seed_ = self._seed()  # load builds the same ensemble subsets from it
        model = self._build(num_outputs, self.seed_)
        generator = torch.Generator().manual_seed(self.seed_)
        train_x, train_t, val_x, val_t = x, target, None, None
        if self.validation_fraction is not None:
            if not 0 < self.validation_fraction < 1:
                raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction}")
            held = round(len(x) * self.validation_fraction)
            if not 1 <= held < len(x):
                raise ValueError(
                    f"validation_fraction={self.validation_fraction} of {len(x)} samples leaves no "
                    "training or no validation sample"
                )
            order = torch.randperm(len(x), generator=generator)
            train_x, train_t = x[order[held:]], target[order[held:]]
            val_x, val_t = x[order[:held]], target[order[:held]]
        batch = len(train_x) if self.batch_size is None else int(self.batch_size)
        if batch < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {self.batch_size}")
        optimizer = torch.optim.Adam(model.parameters(), lr=self.learning_rate)
        best, best_state, waited = math.inf, None, 0
        self.loss_curve_: List[float] = []
        for _ in range(int(self.max_iter)):
            order = torch.randperm(len(train_x), generator=generator) if batch < len(train_x) else None
            total = 0.0
            for start in range(0, len(train_x), batch):
                rows = slice(None) if order is None else order[start : start + batch]
                step_loss = loss(model(train_x[rows]), train_t[rows])
                optimizer.zero_grad()
                step_loss.backward()
                optimizer.step()
                total += step_loss.item() * (len(train_x) if order is None else len(rows))
            self.loss_curve_.append(total / len(train_x))
            if val_x is not None:
                with torch.no_grad():
                    current = loss(model(val_x), val_t).item()
                if current < best:
                    best, best_state, waited = current, copy.deepcopy(model.state_dict()), 0
                else:
                    waited += 1
                    if waited >= int(self.n_iter_no_change):
                        break
        if best_state is not None:
            model.load_state_dict(best_state)
        check_finite_parameters(model)
        self.n_iter_ = len(self.loss_curve_)
        self.model_ = model.eval()

    # ------------------------------------------------------------------------------ output

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet: call fit with appropriate arguments first"
            )

    def _scores(self, X) -> torch.Tensor:
        """The model's raw output, (N, outputs)."""
        x = self._prepare(X, fitting=False)
        with torch.no_grad(), _torch_threads(self.torch_threads):
            return self.model_(x)

    def _score_units(self) -> float:
        """Scale of a raw output in the units of what the estimator reports."""
        return 1.0

    def check_monotone(self, X, num_steps: int = 32) -> Dict[str, float]:
        """Largest violation of each declared monotone feature, in the units of ``predict``
        (regressor) or ``decision_function`` (classifier): each one sweeps in its direction
        over ``num_steps`` values (numbers: the range in X widened by half its span each side;
        categories: each one in order) while every row of X keeps its other values. 0.0 for a
        monotone model, which these are by construction; the layers' docstring says where
        rounding may leave a tiny positive value. Raises ValueError on NaN outputs."""
        x = self._prepare(X, fitting=False)
        worst = {}
        for j, feature in enumerate(self.features_):
            if not feature.monotonicity:
                continue
            sign, values = feature.monotonicity, x[:, j : j + 1]
            sweep_range, steps = None, num_steps
            if feature.categorical:
                last = float(len(self.categories_[j]) - 1)
                sweep_range, steps = ((0.0, last) if sign > 0 else (-last, 0.0)), max(int(last) + 1, 2)
            present = values[~torch.isnan(values)]
            values = values.nan_to_num(present.min().item() if len(present) else 0.0)
            sweep = _Sweep(self.model_, j, sign).eval()  # check_monotone restores this mode after
            with _torch_threads(self.torch_threads):
                violation = check_monotone(sweep, x, sign * values, steps, sweep_range)
            worst[feature.name] = violation * self._score_units()
        return worst

    # ---------------------------------------------------------------------------- save/load

    def _fitted_state(self) -> Dict[str, Any]:
        """What fit learned besides the parameters, keypoints and categories (per estimator)."""
        return {}

    def _restore(self, fitted: Dict[str, Any]) -> None:
        """Sets what :meth:`_fitted_state` saved."""

    def _num_outputs(self) -> int:
        return 1

    def save(self, path: Union[str, Path]) -> None:
        """Writes the declaration, what fit learned and the parameters to ``path``: a torch file
        of plain values and tensors, which :meth:`load` reads with ``weights_only=True`` (NumPy
        scalars become Python's, a RandomState the seed fit drew from it; ValueError naming a
        parameter that holds anything else). Written atomically by the output rule
        (:mod:`fastload.files`): a device, FIFO or folder at ``path`` is refused, a symbolic link
        written through, and a failed write (OSError "cannot write the model file PATH: No space
        left on device") leaves the previous file intact."""
        self._check_fitted()
        names = getattr(self, "feature_names_in_", None)
        params = self.get_params(deep=False)
        if isinstance(params["random_state"], np.random.RandomState):
            params["random_state"] = self.seed_  # what fit drew from it
        contents = {
            "format": _FORMAT,
            "estimator": type(self).__name__,
            "params": {name: _plain_param(value, name) for name, value in params.items()},
            "features": [_saved_feature(f) for f in self.features_],
            "feature_names_in": None if names is None else [str(n) for n in names],
            "keypoints": self.keypoints_,
            "categories": [None if c is None else [_plain(v) for v in c] for c in self.categories_],
            "fitted": self._fitted_state(),
            "n_iter": self.n_iter_,
            "seed": self.seed_,
            "state": self.model_.state_dict(),
        }
        with replace_atomically(path, "model file") as f:
            torch.save(contents, f)

    @classmethod
    def load(cls, path: Union[str, Path], features: Optional[Dict[Union[str, int], Any]] = None):
        """Reads a file written by :meth:`save`. Refuses (ValueError) a file of another
        estimator, one whose stored feature constraints disagree with its own ``features``
        parameter or with its parameters' constraint buffer, and, when ``features`` is given,
        one whose features do not carry exactly those constraints (monotonicity, convexity,
        categorical, missing, and the categories' order where given; not keypoint counts or a
        missing sentinel): what a deployment expects the model to guarantee. Loads with
        ``weights_only=True``: no code from the file runs."""
        data = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a file written by {cls.__name__}.save")
        if data["estimator"] != cls.__name__:
            raise ValueError(f"{path} holds a {data['estimator']}, not a {cls.__name__}")
        estimator = cls(**data["params"])
        stored = [_loaded_feature(f) for f in data["features"]]
        labels = [f.name for f in stored]
        # Categorical by dtype alone (a DataFrame's text column) is not in the declaration.
        by_dtype = [f.categorical for f in stored]
        declared = _redeclare(estimator.features, labels, by_dtype)
        if declared != stored:
            raise ValueError(
                f"{path}: its features {[f.description for f in stored]} disagree with its declaration "
                f"{[f.description for f in declared]}; the file was altered"
            )
        if features is not None:
            expected = _redeclare(features, labels, by_dtype, only_declared=True, source="the file's model")
            differ = [
                difference
                for e in expected
                for difference in _constraint_differences(
                    e, stored[labels.index(e.name)], data["categories"][labels.index(e.name)]
                )
            ]
            if differ:
                raise ValueError(f"{path} does not declare the expected features: " + "; ".join(differ))
        estimator.features_, estimator.n_features_in_ = stored, len(stored)
        if data["feature_names_in"] is not None:
            estimator.feature_names_in_ = np.array(data["feature_names_in"], dtype=object)
        estimator.keypoints_, estimator.categories_ = data["keypoints"], data["categories"]
        estimator._restore(data["fitted"])
        estimator.n_iter_, estimator.seed_ = data["n_iter"], data["seed"]
        estimator._check_declared_sizes(path, data["state"])
        model = estimator._build(estimator._num_outputs(), estimator.seed_)
        try:
            model.load_state_dict(data["state"])  # refuses a state with other constraints
        except RuntimeError as exc:
            raise ValueError(f"{path}: its parameters do not fit its declaration ({exc})") from None
        estimator.model_ = model.eval()
        return estimator

    def _check_declared_sizes(self, path, state: Dict[str, Any]) -> None:
        """Refuses (ValueError naming the file and the parameter) a loaded declaration whose
        lattices differ from the parameters stored with it: the sizes come from the file's
        parameters and are checked before anything is built, so an altered ``lattice_size``
        cannot make :meth:`load` allocate more than the file holds."""
        if self.kind != "lattice":
            return  # the linear model's size follows from the features, which the file lists
        fields = {"lattice_size": self.lattice_size, "lattice_rank": self.lattice_rank}
        fields["num_lattices"] = self.num_lattices
        for name, value in fields.items():
            if not (value is None and name == "num_lattices") and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
            ):
                raise ValueError(f"{path}: {name} {value!r} is not a positive integer")
        expected = _TableModel.lattice_shape(len(self.features_), *fields.values())
        for k in range(self._num_outputs()):
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


_CONSTRAINT_WORDS = {
    "monotonicity": {1: "increasing", -1: "decreasing", 0: "none"},
    "convexity": {1: "convex", -1: "concave", 0: "none"},
}


def _constraint_differences(
    expected: _Feature, stored: _Feature, categories: Optional[List[Any]]
) -> List[str]:
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


def _saved_feature(feature: _Feature) -> Dict[str, Any]:
    fields = asdict(feature)
    if feature.categories is not None:
        fields["categories"] = [_plain(c) for c in feature.categories]
    if feature.missing_value is not None:
        fields["missing_value"] = _plain(feature.missing_value)
    return fields


def _loaded_feature(fields: Dict[str, Any]) -> _Feature:
    categories = fields["categories"]
    return _Feature(**{**fields, "categories": None if categories is None else tuple(categories)})


def _is_frame_column(column) -> bool:
    return hasattr(column, "dtype") and hasattr(column, "to_numpy") and hasattr(column, "iloc")


def _numeric_series(column) -> bool:
    import pandas.api.types as types

    return types.is_numeric_dtype(column.dtype) or types.is_bool_dtype(column.dtype)


def _redeclare(
    features: Optional[Dict[Union[str, int], Any]],
    labels: List[str],
    categorical: List[bool],
    only_declared: bool = False,
    source: str = "X",
) -> List[_Feature]:
    """Parsed declarations of the features ``labels`` (by name or position); ``categorical``
    marks columns categorical whatever the declaration says (their dtype made them so). With
    ``only_declared`` just the declared ones; a key that is no feature of ``source`` is an error."""
    specs: Dict[int, Any] = {}
    for key, spec in (features or {}).items():
        j = int(key) if isinstance(key, numbers.Integral) and not isinstance(key, bool) else None
        if j is None and key in labels:
            j = labels.index(key)
        if j is None or not 0 <= j < len(labels):
            raise ValueError(
                f"features declares {key!r}, which {source} does not have (its features: {labels})"
            )
        if j in specs:
            raise ValueError(f"feature {labels[j]!r} is declared twice (by name and by position)")
        specs[j] = spec
    return [
        _parse_spec(labels[j], specs.get(j), categorical[j])
        for j in range(len(labels))
        if not only_declared or j in specs
    ]


class LatticeRegressor(RegressorMixin, _LatticeEstimator):
    """Calibrated lattice regression, monotone in the declared features (module docstring).

    Trains on standardized targets with the mean squared error; ``predict`` returns ``mean +
    scale * output``, a monotone map, so the guarantees carry over to the predictions. ``score``
    is R^2. Parameters: ``features`` (declarations by name or position), ``lattice_size``
    (vertices per lattice dimension), ``num_keypoints`` (quantile keypoints per numeric
    feature), ``lattice_rank`` (features per lattice; with more features an ensemble of
    ``num_lattices`` lattices, by default enough to use each feature about twice),
    ``max_iter`` (epochs), ``learning_rate`` (Adam's), ``batch_size`` (None: full batch),
    ``validation_fraction`` and ``n_iter_no_change`` (early stopping), ``random_state`` (an
    int, a RandomState or None for a fresh seed; the seed fit used is ``seed_``), ``kind`` ("lattice", or "linear": module docstring),
    ``torch_threads`` (torch's intra-op threads while fitting and predicting, restored after;
    these tensors are small, so one thread is fastest: benches/RESULTS.md; None leaves torch's
    setting).
    """

    def fit(self, X, y):
        """Learns keypoints, categories and parameters from X (array or DataFrame) and y."""
        x = self._prepare(X, fitting=True)
        target = _regression_target(y, len(x))
        self.y_mean_ = float(target.mean())
        self.y_scale_ = float(target.std()) or 1.0
        standardized = torch.tensor((target - self.y_mean_) / self.y_scale_, dtype=torch.float32)
        self._train(x, standardized, 1, lambda out, t: F.mse_loss(out[:, 0], t))
        return self

    def predict(self, X) -> np.ndarray:
        scores = self._scores(X)[:, 0].double().numpy()
        return self.y_mean_ + self.y_scale_ * scores

    def _score_units(self) -> float:
        return self.y_scale_

    def _fitted_state(self) -> Dict[str, Any]:
        return {"y_mean": self.y_mean_, "y_scale": self.y_scale_}

    def _restore(self, fitted: Dict[str, Any]) -> None:
        self.y_mean_, self.y_scale_ = fitted["y_mean"], fitted["y_scale"]


class LatticeClassifier(ClassifierMixin, _LatticeEstimator):
    """Calibrated lattice classification, binary or multi-class (the module docstring says what
    is monotone in each case).

    Binary: one lattice scores ``classes_[1]`` against ``classes_[0]`` (logistic loss).
    Multi-class: one lattice per class, softmax cross-entropy. ``decision_function`` gives the
    scores, ``predict_proba`` the probabilities, ``score`` the accuracy. Parameters as
    :class:`LatticeRegressor`'s.
    """

    def fit(self, X, y):
        """Learns keypoints, categories and parameters from X (array or DataFrame) and labels y."""
        x = self._prepare(X, fitting=True)
        self.classes_, codes = np.unique(_class_labels(y, len(x)), return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(
                f"{type(self).__name__} needs samples of at least 2 classes in the data, but the data "
                f"contains only one class: {self.classes_[0]!r}"
            )
        codes = torch.tensor(codes.ravel(), dtype=torch.int64)
        if len(self.classes_) == 2:
            self._train(x, codes.float(), 1, lambda out, t: F.binary_cross_entropy_with_logits(out[:, 0], t))
        else:
            self._train(x, codes, len(self.classes_), F.cross_entropy)
        return self

    def _num_outputs(self) -> int:
        return 1 if len(self.classes_) == 2 else len(self.classes_)

    def decision_function(self, X) -> np.ndarray:
        """Scores: shape (N,) for two classes (the log-odds of ``classes_[1]``), (N, classes)
        for more."""
        scores = self._scores(X).double().numpy()
        return scores[:, 0] if len(self.classes_) == 2 else scores

    def predict_proba(self, X) -> np.ndarray:
        scores = self.decision_function(X)
        if len(self.classes_) == 2:
            with np.errstate(over="ignore"):  # exp(large) = inf gives the right 0
                positive = 1.0 / (1.0 + np.exp(-scores))
            return np.stack([1.0 - positive, positive], 1)
        shifted = np.exp(scores - scores.max(1, keepdims=True))
        return shifted / shifted.sum(1, keepdims=True)

    def predict_log_proba(self, X) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def predict(self, X) -> np.ndarray:
        scores = self.decision_function(X)
        index = (scores > 0).astype(int) if len(self.classes_) == 2 else scores.argmax(1)
        return self.classes_[index]

    def _fitted_state(self) -> Dict[str, Any]:
        return {"classes": [_plain(c) for c in self.classes_]}

    def _restore(self, fitted: Dict[str, Any]) -> None:
        self.classes_ = np.array(fitted["classes"])


def _target_vector(y, count: int, name: str) -> np.ndarray:
    if y is None:
        raise ValueError(f"{name} requires y to be passed, but the target y is None")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        warnings.warn(
            "A column-vector y was passed when a 1d array was expected. Please change the shape of y "
            "to (n_samples,), for example using ravel().",
            DataConversionWarning,
            stacklevel=4,
        )
        y = y[:, 0]
    if y.ndim != 1:
        raise ValueError(f"y should be a 1d array, got an array of shape {y.shape} instead.")
    if len(y) != count:
        raise ValueError(
            f"Found input variables with inconsistent numbers of samples: X has {count}, y has {len(y)}"
        )
    return y


def _regression_target(y, count: int) -> np.ndarray:
    y = _target_vector(y, count, "LatticeRegressor").astype(np.float64)
    if np.isnan(y).any():
        raise ValueError("Input y contains NaN.")
    if np.isinf(y).any():
        raise ValueError("Input y contains infinity or a value too large for dtype('float64').")
    return y


def _class_labels(y, count: int) -> np.ndarray:
    y = _target_vector(y, count, "LatticeClassifier")
    if y.dtype == object and _missing_mask(y).any():
        raise ValueError("Input y contains None or NaN: every sample needs a class label")
    if y.dtype.kind == "f":
        if not np.isfinite(y).all():
            raise ValueError("Input y contains NaN or infinity.")
        if (y != np.round(y)).any():
            raise ValueError(
                "Unknown label type: continuous. LatticeClassifier needs class labels; "
                "for a continuous target use LatticeRegressor"
            )
    return y
