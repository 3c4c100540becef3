"""Monotone models on tables: :class:`LatticeRegressor` and :class:`LatticeClassifier`.

A practitioner with a table wants to say "the price never falls as the area grows, never rises
with the distance to town" by column name, call ``fit`` and ``predict``, and trust that it holds
for every row the model will ever see. These estimators are calibrated lattices (what TF
Lattice and pytorch-lattice build): each feature goes through its own calibrator
(:class:`~fastload.monotonic.PWLCalibrator` over quantile keypoints of the data, or a
:class:`~fastload.monotonic.CategoricalCalibrator`) into a
:class:`~fastload.monotonic.Lattice` (a
:class:`~fastload.monotonic.LatticeEnsemble` past ``lattice_rank`` features), trained
with L-BFGS over all the rows on the CPU from a fixed seed (:func:`~fastload.monotonic.fitting.train_table_model`
says why), each numeric feature's keypoints placed by the data and the target
(:mod:`~fastload.monotonic.keypoints`). The guarantees are the layers' (stated in
:mod:`fastload.monotonic.constraints`): monotone by construction after every step, exactly under rounding in each
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

How much the model may fit (:mod:`~fastload.monotonic.capacity`): with ``kind="auto"``, the
default, a lattice; a table of 100 to 5,000 rows is fitted with early stopping (a tenth of its
rows held out, from ``random_state``), so that a few hundred rows are not overfitted, and a
larger one to L-BFGS's tolerance, as fast and accurate as before. What fit chose is
``chosen_params_``. The regularisers, TF Lattice's (``calibrator_laplacian`` and the others
:mod:`~fastload.monotonic.regularizers` lists, each 0 by default), shape the fit, never the constraints.

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

This module holds the estimators' interface; what they share lives beside it: the features'
declarations and encoding in :mod:`~fastload.monotonic.features`, the model and its training in
:mod:`~fastload.monotonic.fitting`, save and load in :mod:`~fastload.monotonic.persistence`,
the scikit-learn bases (or their stand-ins) and ``set_output`` in
:mod:`~fastload.monotonic.sklearn_api`.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from fastload._checks import int_in_range
from fastload.errors import NotFittedError
from fastload.monotonic.capacity import Capacity, choose_capacity
from fastload.monotonic.constraints import check_finite_parameters
from fastload.monotonic.features import (
    Feature,
    check_feature_names,
    check_keypoint_count,
    check_table_shape,
    class_labels,
    declare_columns,
    encode_columns,
    regression_target,
    sample_weights,
    table_columns,
)
from fastload.monotonic.fitting import (
    TableModel,
    Training,
    monotone_violations,
    threads_for,
    torch_threads,
    train_table_model,
)
from fastload.monotonic.keypoints import place_keypoints
from fastload.monotonic.ordinal import class_probabilities, ordinal_loss
from fastload.monotonic.persistence import load_estimator, plain_value, save_estimator
from fastload.monotonic.sklearn_api import BaseEstimator, ClassifierMixin, OutputContainer, RegressorMixin

__all__ = ["LatticeClassifier", "LatticeRegressor"]


class _LatticeEstimator(OutputContainer, BaseEstimator):
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
        solver: str = "lbfgs",
        tol: float = 2e-2,
        learning_rate: float = 0.05,
        batch_size: Optional[int] = None,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 20,
        random_state: Optional[int] = 0,
        kind: str = "auto",
        n_jobs: Optional[int] = None,
        ordinal: bool = False,
        calibrator_laplacian: float = 0.0,
        calibrator_hessian: float = 0.0,
        calibrator_wrinkle: float = 0.0,
        lattice_laplacian: float = 0.0,
        lattice_torsion: float = 0.0,
        l2: float = 0.0,
    ):
        self.features = features
        self.lattice_size = lattice_size
        self.num_keypoints = num_keypoints
        self.lattice_rank = lattice_rank
        self.num_lattices = num_lattices
        self.max_iter = max_iter
        self.solver = solver
        self.tol = tol
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.random_state = random_state
        self.kind = kind
        self.n_jobs = n_jobs
        self.ordinal = ordinal  # LatticeClassifier's: its classes are ordered
        self.calibrator_laplacian = calibrator_laplacian
        self.calibrator_hessian = calibrator_hessian
        self.calibrator_wrinkle = calibrator_wrinkle
        self.lattice_laplacian = lattice_laplacian
        self.lattice_torsion = lattice_torsion
        self.l2 = l2

    # ------------------------------------------------------------------------------- inputs

    def _columns(self, X, fitting: bool) -> Tuple[List[Any], Optional[List[str]], Tuple[int, int]]:
        """X's columns, its feature names (DataFrames with string column names) and shape, with
        scikit-learn's checks; predicting also needs a fitted estimator and the features it saw."""
        columns, names, shape = table_columns(X, type(self).__name__)
        if not fitting:
            self._check_fitted()
        check_table_shape(shape)
        if not fitting:
            fitted = getattr(self, "feature_names_in_", None)
            check_feature_names(names, shape, self.n_features_in_, fitted, type(self).__name__)
        return columns, names, shape

    def _prepare(self, X, fitting: bool) -> torch.Tensor:
        """X encoded for the model; fitting also declares its features and learns their
        keypoints or categories."""
        columns, names, shape = self._columns(X, fitting)
        if fitting:
            check_keypoint_count(self.num_keypoints, "")
            self.features_: List[Feature] = declare_columns(self.features, columns, names)
            self.n_features_in_ = shape[1]
            if names is not None:
                self.feature_names_in_ = np.array(names, dtype=object)
            elif hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
            self.keypoints_, self.categories_ = [], []
        return encode_columns(
            self.features_, columns, self.keypoints_, self.categories_, self.num_keypoints, fitting
        )

    # ---------------------------------------------------------------------------- training

    def _seed(self) -> int:
        """The seed fit draws from: ``random_state``'s int (from 0, below 2**62, so that each
        output's seed and NumPy's generators take it), or one drawn from its RandomState."""
        if self.random_state is None:
            return int(np.random.randint(2**31))
        if isinstance(self.random_state, np.random.RandomState):
            return int(self.random_state.randint(2**31))
        return int_in_range(self.random_state, "random_state", minimum=0)

    def _placed_keypoints(self, x: torch.Tensor, target: np.ndarray) -> List[Optional[List[float]]]:
        """Each numeric feature's keypoints moved to where ``target`` changes along it in the
        rows ``x`` (:func:`place_keypoints`); the learned ones where it places none."""
        columns = [None if f.categorical else x[:, j].double().numpy() for j, f in enumerate(self.features_)]
        counts = [f.num_keypoints or self.num_keypoints for f in self.features_]
        placed = place_keypoints(columns, target, counts, self.seed_)
        return [learned if points is None else points for learned, points in zip(self.keypoints_, placed)]

    def _build(self, num_outputs: int, seed: int, scaled: bool = True) -> TableModel:
        return TableModel(
            self.features_,
            self.keypoints_,
            self.categories_,
            self.lattice_size,
            self.lattice_rank,
            self.num_lattices,
            num_outputs,
            seed,
            self.kind_,
            self._ordinal_classes(),
            scaled,
            Capacity.of(self.chosen_params_).straight_start,
        )

    def _ordinal_classes(self) -> Optional[int]:
        """Classes of a cumulative-link head (ordered classes), None without one."""
        return None

    def _train(
        self,
        x: torch.Tensor,
        target: torch.Tensor,
        num_outputs: int,
        loss,
        placement: Optional[np.ndarray],
        weights: Optional[np.ndarray],
        stratify: Optional[torch.Tensor] = None,
    ) -> None:
        """Builds the model from ``random_state`` and trains it (:func:`train_table_model`, each
        sample's ``loss`` weighted by ``weights``, early stopping's split drawn within each class
        of ``stratify``) on ``n_jobs`` threads."""
        with torch_threads(threads_for(self.n_jobs)):
            for name in ("max_iter", "n_iter_no_change"):
                if int(getattr(self, name)) < 1:
                    raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
            if not 0 < self.learning_rate < math.inf:
                raise ValueError(f"learning_rate must be finite and > 0, got {self.learning_rate}")
            self.seed_ = self._seed()  # load builds the same ensemble subsets from it
            if not isinstance(self.early_stopping, (bool, np.bool_)):
                raise ValueError(f"early_stopping must be True or False, got {self.early_stopping!r}")
            own = Capacity.of(self.get_params())  # refuses a strength that is no number >= 0
            capacity = choose_capacity(self.kind, own, len(x))
            self.kind_, self.chosen_params_ = capacity.kind, capacity.params()
            if placement is not None:
                self.keypoints_ = self._placed_keypoints(x, placement)
            model = self._build(num_outputs, self.seed_)
            training = train_table_model(model, x, target, loss, **self._training_options(weights, stratify))
            check_finite_parameters(model)
            self._record(training, [], [])
            self.model_ = model.eval()

    def _resume(
        self, x: torch.Tensor, target: torch.Tensor, loss, weights: Optional[np.ndarray], stratify=None
    ) -> None:
        """partial_fit's training: the fitted model, trained further on these rows."""
        with torch_threads(threads_for(self.n_jobs)):
            model = self.model_.train()
            training = train_table_model(model, x, target, loss, **self._training_options(weights, stratify))
            check_finite_parameters(model)
            self._record(training, self.loss_curve_, getattr(self, "validation_loss_curve_", []))
            self.model_ = model.eval()

    def _record(self, training: Training, loss_curve: List[float], validation_curve: List[float]) -> None:
        """Appends a training's curves to the fitted ones: ``loss_curve_`` (training loss per
        round), ``validation_loss_curve_`` and ``best_validation_loss_`` (with early stopping),
        ``n_iter_`` (rounds in all)."""
        self.loss_curve_: List[float] = list(loss_curve) + training.loss_curve
        self.n_iter_ = len(self.loss_curve_)
        if training.validation_loss_curve:
            self.validation_loss_curve_: List[float] = list(validation_curve) + training.validation_loss_curve
            self.best_validation_loss_ = min(training.validation_loss_curve)
        else:
            for name in ("validation_loss_curve_", "best_validation_loss_"):
                if hasattr(self, name):
                    delattr(self, name)

    def _training_options(
        self, weights: Optional[np.ndarray], stratify: Optional[torch.Tensor]
    ) -> Dict[str, Any]:
        """:func:`train_table_model`'s options: the estimator's, with the early stopping and
        regularisers fit chose (``chosen_params_``)."""
        chosen = Capacity.of(self.chosen_params_)
        return {
            "weights": None if weights is None else torch.tensor(weights, dtype=torch.float32),
            "seed": self.seed_,
            "solver": self.solver,
            "max_iter": self.max_iter,
            "tol": self.tol,
            "learning_rate": self.learning_rate,
            "batch_size": self.batch_size,
            "validation_fraction": chosen.validation_fraction if chosen.early_stopping else None,
            "n_iter_no_change": self.n_iter_no_change,
            "stratify": stratify,
            "regularization": chosen.regularization,
        }

    # ------------------------------------------------------------------------------ output

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet: call fit with appropriate arguments first"
            )

    def _scores(self, X) -> torch.Tensor:
        """The model's raw output, (N, outputs)."""
        x = self._prepare(X, fitting=False)
        with torch.no_grad(), torch_threads(threads_for(self.n_jobs)):
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
        violations = monotone_violations(
            self.model_, x, self.features_, self.categories_, num_steps, threads_for(self.n_jobs)
        )
        return {name: violation * self._score_units() for name, violation in violations.items()}

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
        save_estimator(self, self._fitted_state(), path)

    @classmethod
    def load(cls, path: Union[str, Path], features: Optional[Dict[Union[str, int], Any]] = None):
        """Reads a file written by :meth:`save`. Refuses (ValueError) a file of another
        estimator, one whose stored feature constraints disagree with its own ``features``
        parameter or with its parameters' constraint buffer, and, when ``features`` is given,
        one whose features do not carry exactly those constraints (monotonicity, convexity,
        categorical, missing, and the categories' order where given; not keypoint counts or a
        missing sentinel): what a deployment expects the model to guarantee. Loads with
        ``weights_only=True``: no code from the file runs. Every file that does not load (a
        named pipe, a folder, a damaged or altered file, parameters of other shapes than its
        declaration implies, NaN or infinite values) is one ValueError that starts with
        ``path`` and says what is wrong (:mod:`~fastload.monotonic.persistence`); a missing file
        is the FileNotFoundError naming it."""
        return load_estimator(cls, path, features)


class LatticeRegressor(RegressorMixin, _LatticeEstimator):
    """Calibrated lattice regression, monotone in the declared features (module docstring).

    Trains on standardized targets with the mean squared error; ``predict`` returns ``mean +
    scale * output``, a monotone map, so the guarantees carry over to the predictions. ``score``
    is R^2. Parameters: ``features`` (declarations by name or position), ``lattice_size``
    (vertices per lattice dimension), ``num_keypoints`` (quantile keypoints per numeric
    feature, 2 to 1000, and never more than the feature's distinct values), ``lattice_rank``
    (features per lattice; with more features an ensemble of
    ``num_lattices`` lattices, by default enough to use each feature about twice),
    ``solver`` ("lbfgs": full-batch L-BFGS, the default and fastest; "adam": Adam, for
    minibatches), ``max_iter`` (L-BFGS iterations or Adam epochs), ``tol`` (L-BFGS stops once 5
    iterations improved the training loss by less than this fraction, twice in a row),
    ``learning_rate`` (Adam's), ``batch_size`` (Adam's; None: full batch),
    ``early_stopping`` (hold out ``validation_fraction`` of the rows, drawn from the seed and,
    for a classifier, within each class; stop after ``n_iter_no_change`` rounds without a lower
    validation loss and keep the best round: ``validation_loss_curve_``,
    ``best_validation_loss_``), ``random_state`` (an int, a RandomState or None for a fresh
    seed; the seed fit used is ``seed_``), ``kind`` ("auto", "lattice" or "linear": module
    docstring), the regularisers (module docstring),
    ``n_jobs`` (torch's intra-op threads while fitting and predicting, restored after; None is
    one, -1 every core, as in scikit-learn: on a quiet 2-core machine a second thread cut the
    fit time by a sixth to a third on an Intel CPU and not at all on an AMD one, and it slows
    down a busy machine, benches/RESULTS.md). Fitted: ``chosen_params_`` (the kind, early
    stopping and regularisers fit used), ``loss_curve_`` (training loss per round), ``n_iter_``, ``n_features_in_``, ``feature_names_in_`` (DataFrames with string
    column names). :meth:`set_output` gives pandas or polars predictions.
    """

    def fit(self, X, y, sample_weight=None):
        """Learns keypoints, categories and parameters from X (array or DataFrame) and y, each
        sample's squared error weighted by ``sample_weight`` (None: equal)."""
        if self.ordinal:
            raise ValueError("ordinal=True is LatticeClassifier's: a regression target is already ordered")
        x = self._prepare(X, fitting=True)
        target = regression_target(y, len(x))
        weights = sample_weights(sample_weight, len(x))
        self.y_mean_ = float(np.average(target, weights=weights))
        self.y_scale_ = float(np.sqrt(np.average((target - self.y_mean_) ** 2, weights=weights))) or 1.0
        standardized = torch.tensor((target - self.y_mean_) / self.y_scale_, dtype=torch.float32)
        self._train(x, standardized, 1, self._squared_error, target, weights)
        return self

    def partial_fit(self, X, y, sample_weight=None):
        """Fine-tunes a fitted regressor on more rows (``max_iter`` more iterations from its
        parameters, on its target scale), keeping its keypoints and categories; an unfitted one
        is fitted."""
        if not hasattr(self, "model_"):
            return self.fit(X, y, sample_weight)
        x = self._prepare(X, fitting=False)
        standardized = (regression_target(y, len(x)) - self.y_mean_) / self.y_scale_
        loss = self._squared_error
        self._resume(
            x, torch.tensor(standardized, dtype=torch.float32), loss, sample_weights(sample_weight, len(x))
        )
        return self

    @staticmethod
    def _squared_error(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (out[:, 0] - target) ** 2

    def predict(self, X):
        scores = self._scores(X)[:, 0].double().numpy()
        return self._output(self.y_mean_ + self.y_scale_ * scores, X, "prediction")

    def _score_units(self) -> float:
        return self.y_scale_

    def _fitted_state(self) -> Dict[str, Any]:
        return {"y_mean": self.y_mean_, "y_scale": self.y_scale_}

    def _restore(self, fitted: Dict[str, Any]) -> None:
        for name in ("y_mean", "y_scale"):
            value = fitted.get(name)
            if not isinstance(value, float) or not math.isfinite(value) or (name == "y_scale" and value <= 0):
                raise ValueError(
                    f"its {name} is {value!r:.100}, not a finite number (a positive one for y_scale)"
                )
        self.y_mean_, self.y_scale_ = fitted["y_mean"], fitted["y_scale"]


class LatticeClassifier(ClassifierMixin, _LatticeEstimator):
    """Calibrated lattice classification, binary or multi-class (the module docstring says what
    is monotone in each case).

    Binary: one lattice scores ``classes_[1]`` against ``classes_[0]`` (logistic loss).
    Multi-class: one lattice per class, softmax cross-entropy. Ordered classes (``ordinal=True``,
    in ``np.unique`` order, or an ordered pandas Categorical y, in its categories' order): one
    lattice's score through a cumulative-link head (:mod:`~fastload.monotonic.ordinal`), so
    P(y >= classes_[k]) is monotone in every declared feature for every k. ``decision_function`` gives the
    scores, ``predict_proba`` the probabilities, ``score`` the accuracy. Parameters as
    :class:`LatticeRegressor`'s, and ``ordinal``.
    """

    def fit(self, X, y, sample_weight=None):
        """Learns keypoints, categories and parameters from X (array or DataFrame) and labels y,
        each sample's log-loss weighted by ``sample_weight`` (None: equal)."""
        x = self._prepare(X, fitting=True)
        labels = class_labels(y, len(x))
        weights = sample_weights(sample_weight, len(x))
        ordered = bool(getattr(getattr(y, "cat", None), "ordered", False))
        if ordered:  # an ordered pandas Categorical: its order, the categories present
            present = set(labels.tolist())
            self.classes_ = np.array(
                [c for c in y.cat.categories.tolist() if c in present], dtype=labels.dtype
            )
            lookup = {c: i for i, c in enumerate(self.classes_.tolist())}
            codes = np.array([lookup[c] for c in labels.tolist()])
        else:
            self.classes_, codes = np.unique(labels, return_inverse=True)
        self.ordinal_ = (bool(self.ordinal) or ordered) and len(self.classes_) > 2
        if len(self.classes_) < 2:
            raise ValueError(
                f"{type(self).__name__} needs samples of at least 2 classes in the data, but the data "
                f"contains only one class: {self.classes_[0]!r}"
            )
        codes = torch.tensor(codes.ravel(), dtype=torch.int64)
        # Ordered classes and two classes are an order along which the target changes;
        # codes of unordered classes are no such scale, so they keep quantile keypoints.
        placement = codes.numpy() if len(self.classes_) == 2 or self.ordinal_ else None
        self._train(
            x, self._class_target(codes), self._num_outputs(), self._class_loss(), placement, weights, codes
        )
        return self

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """Fine-tunes a fitted classifier on more rows (``max_iter`` more iterations from its
        parameters), keeping its keypoints, categories and classes (a label it has not seen
        is a ValueError); an unfitted one is fitted, and its rows must hold every one of
        ``classes`` when given (scikit-learn's argument)."""
        if not hasattr(self, "model_"):
            self.fit(X, y, sample_weight)
            if classes is not None and list(np.unique(classes)) != list(self.classes_):
                del self.model_
                raise ValueError(
                    f"the first partial_fit needs rows of every class in classes={list(classes)}, "
                    f"got {list(self.classes_)}"
                )
            return self
        x = self._prepare(X, fitting=False)
        lookup = {c: i for i, c in enumerate(self.classes_.tolist())}
        labels = class_labels(y, len(x)).tolist()
        unseen = sorted({repr(c) for c in labels if c not in lookup})
        if unseen:
            raise ValueError(f"partial_fit got labels the classifier was not fitted on: {', '.join(unseen)}")
        codes = torch.tensor([lookup[c] for c in labels], dtype=torch.int64)
        weights = sample_weights(sample_weight, len(x))
        self._resume(x, self._class_target(codes), self._class_loss(), weights, codes)
        return self

    def _class_target(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.float() if len(self.classes_) == 2 else codes

    def _class_loss(self):
        """Each sample's loss: logistic (two classes), cumulative-link (ordered), softmax."""
        if len(self.classes_) == 2:
            return lambda out, t: F.binary_cross_entropy_with_logits(out[:, 0], t, reduction="none")
        return ordinal_loss if self.ordinal_ else functools.partial(F.cross_entropy, reduction="none")

    def _num_outputs(self) -> int:
        return 1 if len(self.classes_) == 2 or self.ordinal_ else len(self.classes_)

    def _ordinal_classes(self) -> Optional[int]:
        return len(self.classes_) if self.ordinal_ else None

    def decision_function(self, X):
        """Scores: shape (N,) for two classes (the log-odds of ``classes_[1]``), (N, classes)
        for more; for ordered classes (N, classes - 1), column k the log-odds of a class at or
        above ``classes_[k + 1]`` (named "at least" that class in a DataFrame), each monotone
        in the declared features."""
        scores = self._decisions(X)
        if self.ordinal_:
            return self._output(scores, X, "decision", [f"at least {c}" for c in self.classes_[1:].tolist()])
        return self._output(scores, X, "decision", self.classes_.tolist())

    def predict_proba(self, X):
        """Each class's probability, (N, classes) in the order of ``classes_``."""
        return self._output(self._probabilities(X), X, "probability", self.classes_.tolist())

    def predict_log_proba(self, X):
        with np.errstate(divide="ignore"):
            return self._output(np.log(self._probabilities(X)), X, "log_probability", self.classes_.tolist())

    def predict(self, X):
        self._check_fitted()
        if self.ordinal_:
            index = self._probabilities(X).argmax(1)
        else:
            scores = self._decisions(X)
            index = (scores > 0).astype(int) if len(self.classes_) == 2 else scores.argmax(1)
        return self._output(self.classes_[index], X, "prediction")

    def _decisions(self, X) -> np.ndarray:
        scores = self._scores(X).double().numpy()
        return scores[:, 0] if len(self.classes_) == 2 else scores

    def _probabilities(self, X) -> np.ndarray:
        scores = self._decisions(X)
        if self.ordinal_:
            return class_probabilities(torch.from_numpy(scores)).numpy()
        if len(self.classes_) == 2:
            with np.errstate(over="ignore"):  # exp(large) = inf gives the right 0
                positive = 1.0 / (1.0 + np.exp(-scores))
            return np.stack([1.0 - positive, positive], 1)
        shifted = np.exp(scores - scores.max(1, keepdims=True))
        return shifted / shifted.sum(1, keepdims=True)

    def _fitted_state(self) -> Dict[str, Any]:
        return {"classes": [plain_value(c) for c in self.classes_], "ordinal": self.ordinal_}

    def _restore(self, fitted: Dict[str, Any]) -> None:
        classes, ordinal = fitted.get("classes"), fitted.get("ordinal", False)
        if not isinstance(classes, list) or len(set(map(repr, classes))) != len(classes) or len(classes) < 2:
            raise ValueError(f"its classes {classes!r:.200} are not a list of 2 or more distinct labels")
        if not isinstance(ordinal, bool):
            raise ValueError(f"its ordinal is {ordinal!r:.100}, not True or False")
        self.classes_ = np.array(classes)
        self.ordinal_ = ordinal  # False in files saved before ordered classes
