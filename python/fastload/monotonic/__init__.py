"""Monotone models: layers whose monotonicity holds by construction, and tabular estimators.

* ``constraints``: how the layers stay monotone (the maps from free parameters, the
  guarantees they give, rounding included, in its docstring) and the checks ``check_monotone``
  and ``check_finite_parameters``.
* ``calibrators`` (``PWLCalibrator``, ``CategoricalCalibrator``), ``linear``
  (``MonotoneLinear``) and ``lattice`` (``Lattice``, ``LatticeEnsemble``): the building blocks.
  The image models built of them (``MonotonicRegressor``, which ``fastload train`` fits) are
  :mod:`fastload.train.models`'.
* ``estimator``: ``LatticeRegressor`` and ``LatticeClassifier``, scikit-learn style estimators
  for tables (arrays or DataFrames) with features declared by name. What they share: ``features``
  (declarations, reading and encoding the columns, the target), ``fitting`` (the table model and
  its training loop), ``persistence`` (save and load, and what load refuses) and
  ``sklearn_api`` (scikit-learn's bases, or the same methods without it; ``set_output``).
* ``plot``: ``plot_calibrators``, a PNG of a fitted estimator's calibrators.

The estimators and the plot load on first use, so importing the layers (as training does)
imports neither scikit-learn nor matplotlib.
"""

from __future__ import annotations

import importlib

from fastload.monotonic.calibrators import CategoricalCalibrator, PWLCalibrator
from fastload.monotonic.constraints import check_finite_parameters, check_monotone
from fastload.monotonic.lattice import Lattice, LatticeEnsemble
from fastload.monotonic.linear import MonotoneLinear

_LAZY = {
    "LatticeClassifier": "fastload.monotonic.estimator",
    "LatticeRegressor": "fastload.monotonic.estimator",
    "plot_calibrators": "fastload.monotonic.plot",
}

__all__ = [
    "CategoricalCalibrator",
    "Lattice",
    "LatticeClassifier",
    "LatticeEnsemble",
    "LatticeRegressor",
    "MonotoneLinear",
    "PWLCalibrator",
    "check_finite_parameters",
    "check_monotone",
    "plot_calibrators",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
