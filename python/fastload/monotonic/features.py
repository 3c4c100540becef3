"""A table's features and target as the estimators read them: each feature's declaration (a
word, None or a dict, by name or position; :mod:`fastload.monotonic.estimator` describes them)
parsed into a :class:`Feature`, the columns of a NumPy array or a DataFrame checked as
scikit-learn checks them, and encoded into one float32 tensor of numbers, category codes and
NaN for missing values, learning each feature's keypoints (quantiles) or categories while
fitting; and the target ``y`` checked for a regressor or a classifier."""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from fastload._checks import import_optional
from fastload.monotonic.constraints import CURVATURES, as_direction

try:  # scikit-learn's warning class when it is there, so its checks recognise the warning
    from sklearn.exceptions import DataConversionWarning
except ImportError:

    class DataConversionWarning(UserWarning):  # type: ignore[no-redef]
        """A target was reshaped to what the estimator needs."""


__all__ = [
    "MAX_KEYPOINTS",
    "Feature",
    "check_feature_names",
    "check_keypoint_count",
    "check_table_shape",
    "class_labels",
    "declare_columns",
    "declared_features",
    "encode_columns",
    "parse_spec",
    "regression_target",
    "sample_weights",
    "table_columns",
]

# The most keypoints a numeric feature's calibrator may have. Why a bound: the calibrator's
# parameters and the quantiles that place its keypoints grow with the count asked for, not with
# the data (3 million keypoints on 50 rows took 2.4 GB), and past a thousand pieces each piece
# of even a million-row table holds too few rows to estimate (gradient boosting bins into 255).
MAX_KEYPOINTS = 1000
# The largest magnitude a numeric value may have: the model computes in float32, in which a
# larger value is infinite.
FLOAT32_MAX = float(np.finfo(np.float32).max)

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
class Feature:
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


def check_keypoint_count(count: Any, where: str) -> int:
    """``count`` as an int from 2 (fewer keypoints make a constant calibrator) to
    ``MAX_KEYPOINTS``; ValueError naming ``where`` otherwise."""
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or not 2 <= count <= MAX_KEYPOINTS:
        raise ValueError(f"{where}num_keypoints must be an int >= 2 and <= {MAX_KEYPOINTS}, got {count!r}")
    return int(count)


def parse_spec(name: str, spec: Any, categorical_column: bool) -> Feature:
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
        num_keypoints = check_keypoint_count(num_keypoints, f"feature {name!r}: ")
    return Feature(
        name,
        monotonicity,
        convexity,
        categorical,
        categories,
        missing is not False,
        missing_value,
        num_keypoints,
    )


def _is_frame_column(column) -> bool:
    return hasattr(column, "dtype") and hasattr(column, "to_numpy") and hasattr(column, "iloc")


def _numeric_series(column) -> bool:
    import pandas.api.types as types

    return types.is_numeric_dtype(column.dtype) or types.is_bool_dtype(column.dtype)


def declared_features(
    features: Optional[Dict[Union[str, int], Any]],
    labels: List[str],
    categorical: List[bool],
    only_declared: bool = False,
    source: str = "X",
) -> List[Feature]:
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
        parse_spec(labels[j], specs.get(j), categorical[j])
        for j in range(len(labels))
        if not only_declared or j in specs
    ]


def declare_columns(
    features: Optional[Dict[Union[str, int], Any]], columns: List[Any], names: Optional[List[str]]
) -> List[Feature]:
    """Each column's parsed declaration, from ``features`` by name or position (an array's
    columns are named ``x0``, ``x1``, ...); a DataFrame's non-numeric column is categorical."""
    labels = names or [f"x{j}" for j in range(len(columns))]
    text = [_is_frame_column(c) and not _numeric_series(c) for c in columns]
    return declared_features(features, labels, text)


def _is_frame(X) -> bool:
    return hasattr(X, "columns") and hasattr(X, "iloc") and hasattr(X, "dtypes")


def _missing_mask(values: np.ndarray) -> np.ndarray:
    """None, NaN (and pandas' NA and NaT) in an object column."""
    try:
        import pandas

        return np.asarray(pandas.isna(values), dtype=bool)
    except ImportError:
        return np.array([v is None or (isinstance(v, float) and math.isnan(v)) for v in values], dtype=bool)


def _polars_as_pandas(X):
    """A polars DataFrame as a pandas one, column by column (polars' own ``to_pandas`` needs
    pyarrow): an Enum column becomes an ordered Categorical, whose order declares a monotone
    categorical feature as a pandas one does."""
    pandas = import_optional("pandas", "a polars DataFrame as X", "pip install pandas")
    import polars

    columns = {}
    for name in X.columns:
        column = X.get_column(name)
        if isinstance(column.dtype, polars.Enum):
            order = column.dtype.categories.to_list()
            columns[name] = pandas.Categorical(
                column.cast(polars.String).to_list(), categories=order, ordered=True
            )
        else:
            columns[name] = column.to_numpy()
    return pandas.DataFrame(columns)


def table_columns(X, estimator: str) -> Tuple[List[Any], Optional[List[str]], Tuple[int, int]]:
    """X's columns, its feature names (DataFrames with string column names) and shape, with the
    checks and messages of scikit-learn's own input validation; ``estimator`` names the
    estimator in them."""
    if X is None:
        raise ValueError(f"{estimator} needs X, got None")
    if hasattr(X, "nnz") and hasattr(X, "toarray"):
        raise TypeError("sparse input is not supported: densify it with X.toarray()")
    if type(X).__module__.startswith("polars") and hasattr(X, "get_column"):
        X = _polars_as_pandas(X)
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
    return columns, names, shape


def check_table_shape(shape: Tuple[int, int]) -> None:
    """Refuses a table without features or without samples, in scikit-learn's words."""
    if shape[1] == 0:
        raise ValueError(f"0 feature(s) (shape={shape}) while a minimum of 1 is required.")
    if shape[0] == 0:
        raise ValueError(f"Found array with 0 sample(s) (shape={shape}) while a minimum of 1 is required.")


def check_feature_names(
    names: Optional[List[str]],
    shape: Tuple[int, int],
    n_features_in: int,
    fitted: Optional[Sequence[str]],
    estimator: str,
) -> None:
    """Refuses a table to predict from whose feature count or names differ from those fit saw
    (``n_features_in``, ``fitted``), and warns, as scikit-learn does, when only one of the two
    has names."""
    if shape[1] != n_features_in:
        raise ValueError(
            f"X has {shape[1]} features, but {estimator} is expecting {n_features_in} features as input."
        )
    # stacklevel 4: the estimator's method that was given X (via _prepare and _columns).
    if names is None and fitted is not None:
        warnings.warn(
            f"X does not have valid feature names, but {estimator} was fitted with feature names",
            UserWarning,
            stacklevel=4,
        )
    elif names is not None and fitted is None:
        warnings.warn(
            f"X has feature names, but {estimator} was fitted without feature names",
            UserWarning,
            stacklevel=4,
        )
    elif names is not None and list(fitted) != names:
        raise ValueError(
            f"The feature names should match those that were passed during fit: fitted with "
            f"{list(fitted)}, got {names}"
        )


def encode_columns(
    features: Sequence[Feature],
    columns: List[Any],
    keypoints: List[Optional[List[float]]],
    categories: List[Optional[List[Any]]],
    num_keypoints: int,
    fitting: bool,
) -> torch.Tensor:
    """Columns -> float32 tensor: numbers, category codes, NaN for missing values. Fitting
    appends each feature's keypoints (numbers) or categories to the empty ``keypoints`` and
    ``categories``, the estimator's ``keypoints_`` and ``categories_``; otherwise encoding
    reads them."""
    encoded = np.empty((len(columns[0]), len(columns)), dtype=np.float64)
    for j, (feature, column) in enumerate(zip(features, columns)):
        if feature.categorical:
            encoded[:, j] = _encode_categories(j, feature, column, categories, keypoints, fitting)
        else:
            encoded[:, j] = _encode_numbers(feature, column, num_keypoints, keypoints, categories, fitting)
    return torch.tensor(encoded, dtype=torch.float32)


def _encode_numbers(
    feature: Feature, column, num_keypoints: int, keypoints: list, categories: list, fitting: bool
) -> np.ndarray:
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
    beyond = np.abs(np.where(missing, 0.0, values)) > FLOAT32_MAX
    if beyond.any():
        raise ValueError(
            f"feature {feature.name!r} holds {values[beyond][0]:g}, beyond float32's range "
            f"(+-{FLOAT32_MAX:.3g}), in which the model computes; rescale the feature"
        )
    if missing.any() and not feature.missing:
        raise ValueError(
            f"Input X contains NaN in feature {feature.name!r}; declare it "
            "{'missing': True} to learn an output for missing values"
        )
    values = np.where(missing, np.nan, values)
    if fitting:
        present = values[~missing]
        # Never more quantiles than values: the distinct ones among them cap the count.
        count = min(feature.num_keypoints or num_keypoints, max(len(present), 2))
        # Quantiles, so each piece sees about as many samples; distinct in float32.
        points = (
            np.unique(np.quantile(present, np.linspace(0, 1, count)).astype(np.float32))
            if len(present)
            else []
        )
        if len(points) < 2:  # a constant (or absent) feature: any two keypoints around it
            low = float(points[0]) if len(points) else 0.0
            points = np.array([low, low + max(1.0, abs(low) * 1e-3)])
        keypoints.append([float(p) for p in points])
        categories.append(None)
    return values


def _encode_categories(
    j: int, feature: Feature, column, categories: list, keypoints: list, fitting: bool
) -> np.ndarray:
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
            learned = list(feature.categories)
        elif _is_frame_column(column) and getattr(getattr(column, "cat", None), "ordered", False):
            learned = column.cat.categories.tolist()  # an ordered Categorical declares it
        elif feature.monotonicity:
            raise ValueError(
                f"feature {feature.name!r} is monotone but the order of its categories is not "
                "declared: pass categories=[...] in its spec (lowest first), or an ordered "
                "pandas Categorical"
            )
        else:
            distinct = list(dict.fromkeys(values[~missing].tolist()))
            try:
                learned = sorted(distinct)
            except TypeError:  # mixed types: order of appearance
                learned = distinct
        keypoints.append(None)
        categories.append(learned)
    lookup = {c: i for i, c in enumerate(categories[j])}
    codes = np.full(len(values), np.nan)
    for i, value in enumerate(values):
        if missing[i]:
            continue
        code = lookup.get(value)
        if code is None:
            if fitting or not feature.missing:
                raise ValueError(
                    f"feature {feature.name!r} has the value {value!r}, which is not one of its "
                    f"categories {categories[j]}"
                    + ("" if fitting else "; declare it {'missing': True} to treat unseen values as missing")
                )
            continue  # an unseen category is a missing value
        codes[i] = code
    return codes


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


def regression_target(y, count: int) -> np.ndarray:
    y = _target_vector(y, count, "LatticeRegressor").astype(np.float64)
    if np.isnan(y).any():
        raise ValueError("Input y contains NaN.")
    if np.isinf(y).any():
        raise ValueError("Input y contains infinity or a value too large for dtype('float64').")
    beyond = np.abs(y) > FLOAT32_MAX  # its variance would overflow float64, and the model is float32
    if beyond.any():
        raise ValueError(
            f"Input y holds {y[beyond][0]:g}, beyond float32's range (+-{FLOAT32_MAX:.3g}), in which "
            "the model computes; rescale the target"
        )
    return y


def class_labels(y, count: int) -> np.ndarray:
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


def sample_weights(sample_weight, count: int) -> Optional[np.ndarray]:
    """``sample_weight`` checked: None, or ``count`` finite non-negative numbers, not all zero
    (a scalar weighs every sample alike), returned divided by the largest."""
    if sample_weight is None:
        return None
    weights = np.asarray(sample_weight, dtype=np.float64)
    if weights.ndim == 0:
        weights = np.full(count, float(weights))
    if weights.shape != (count,):
        raise ValueError(f"sample_weight.shape == {weights.shape}, expected {(count,)}!")
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise ValueError("sample_weight must be finite and non-negative")
    if not weights.max() > 0:
        raise ValueError("sample_weight sums to zero: no sample to learn from")
    # Only the ratios count: divided by the largest, weights of 1e308 cannot overflow their sum
    # nor weights of 1e-320 vanish in float32, and every fit gets the same weights.
    return weights / weights.max()
