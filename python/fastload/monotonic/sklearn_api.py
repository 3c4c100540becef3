"""What makes the table estimators scikit-learn estimators, with scikit-learn or without it:
its base classes when it is installed (``clone``, tags, pipelines, ``check_estimator``), the
same methods when not, so fastload does not depend on it; and ``set_output``'s containers for
their predictions (NumPy, pandas, polars)."""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional

import numpy as np

from fastload._checks import import_optional

__all__ = ["BaseEstimator", "ClassifierMixin", "OutputContainer", "RegressorMixin"]

try:  # optional: with scikit-learn the estimators are its estimators (clone, tags, pipelines)
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
except ImportError:  # the same methods without it

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
        def score(self, X, y, sample_weight=None) -> float:
            """R^2 of ``predict(X)`` against y, weighted by ``sample_weight``."""
            y = np.asarray(y, dtype=np.float64).ravel()
            weights = (
                np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
            )
            residual = (weights * (y - self.predict(X)) ** 2).sum()
            total = (weights * (y - np.average(y, weights=weights)) ** 2).sum()
            return 1.0 - residual / total if total > 0 else float(residual == 0)

    class ClassifierMixin:  # type: ignore[no-redef]
        def score(self, X, y, sample_weight=None) -> float:
            """Accuracy of ``predict(X)`` against y, weighted by ``sample_weight``."""
            return float(np.average(self.predict(X) == np.asarray(y).ravel(), weights=sample_weight))


class OutputContainer:
    """``set_output`` for estimators whose outputs are predictions, not transforms."""

    def set_output(self, *, transform: Optional[str] = None):
        """The container ``predict``, ``predict_proba``, ``predict_log_proba`` and
        ``decision_function`` return: "default" (NumPy arrays), "pandas" (a Series, or a
        DataFrame whose columns are the classes, indexed as X when X is a DataFrame) or
        "polars"; None leaves it. scikit-learn's call and argument name, which set its
        transformers' output: these estimators have no ``transform``, so it sets their
        predictions' (a Pipeline passes it to transformers only: call it on the estimator).
        ``clone`` keeps it."""
        if transform is None:
            return self
        if transform not in ("default", "pandas", "polars"):
            raise ValueError(
                f"set_output: transform must be 'default', 'pandas', 'polars' or None, got {transform!r}"
            )
        self._sklearn_output_config = {"transform": transform}
        return self

    def _output(self, values: np.ndarray, X, name: str, columns: Optional[List[Any]] = None):
        """``values`` (1-D: one per row of X; 2-D: ``columns``) in the container of
        :meth:`set_output`."""
        container = getattr(self, "_sklearn_output_config", {}).get("transform", "default")
        if container == "default":
            return values
        if container == "pandas":
            pandas = import_optional("pandas", "set_output(transform='pandas')", "pip install pandas")
            index = X.index if isinstance(X, pandas.DataFrame) else None
            if values.ndim == 1:
                return pandas.Series(values, index=index, name=name)
            return pandas.DataFrame(values, index=index, columns=columns)
        polars = import_optional("polars", "set_output(transform='polars')", "pip install polars")
        if values.ndim == 1:
            return polars.Series(name, values)
        return polars.DataFrame({str(c): values[:, j] for j, c in enumerate(columns or [])})
