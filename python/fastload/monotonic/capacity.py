"""How much capacity a table model gets when ``kind="auto"`` (the default): on a small table a
lattice trained with early stopping, on a large one today's lattice trained to L-BFGS's
tolerance. ``kind="lattice"`` or ``"linear"`` keeps the estimator's settings as given.

The rule: a table of ``AUTO_MIN_ROWS`` to ``AUTO_MAX_ROWS`` rows is fitted with early
stopping, whatever ``early_stopping`` says: ``validation_fraction`` of its rows (drawn from the
fit's seed, within each class for a classifier) are held out, training stops once
``n_iter_no_change`` rounds have not lowered their loss, and the best round is kept. Its
calibrators start as straight lines in their inputs (``straight_start``), not as equal steps
between quantile keypoints: a fit stopped early stays near where it started, so it is pulled
toward a model linear in the raw inputs, the first model a statistician fits, as ridge pulls
toward zero (on diabetes: 3002 +- 407 test MSE against 3188 +- 309 starting from equal steps,
RidgeCV 2963 +- 300, benches/RESULTS.md; on breast_cancer it costs log-loss, 0.116 against 0.091). The
regularisers the estimator sets (:mod:`~fastload.monotonic.regularizers`) apply either way.

Why early stopping: a calibrated lattice has a free output per keypoint and vertex, which a few
hundred rows cannot pin down, and full-batch L-BFGS run to its tolerance fits their noise; the
held-out rows measure when it starts to, on any target, at the cost of one fit. Why not
cross-validation over the regularisers' strengths, which was tried first (benches/RESULTS.md,
issue 46): five strengths over three folds cost 15 fits, and the folds' losses ranked them by
the noise of L-BFGS's stopping point more than by the strength: on a 400-row three-class
table it chose a strength whose test log-loss was 0.39 against the unregularised fit's 0.32,
where early stopping gave 0.29; on diabetes early stopping and the best fixed strength were
within a standard deviation of each other. Why only small tables: from 10,000 rows the
unregularised lattice's test error is below gradient boosting's (benches/RESULTS.md), and
holding out rows would cost accuracy and an evaluation per round there; below
``AUTO_MIN_ROWS`` the held-out share is too few rows to measure a loss on.

The choice is reproducible from ``random_state`` (the held-out rows come from the fit's seed)
and visible in the fitted ``chosen_params_``.
"""

from __future__ import annotations

from typing import Dict, NamedTuple

from fastload.monotonic.regularizers import Regularization

__all__ = ["AUTO_MAX_ROWS", "AUTO_MIN_ROWS", "KINDS", "Capacity", "choose_capacity"]

AUTO_MIN_ROWS, AUTO_MAX_ROWS = 100, 5000
# The estimators' kinds: "auto" chooses the settings of a lattice by the table's size.
KINDS = ("auto", "lattice", "linear")


class Capacity(NamedTuple):
    """What a model is fitted with: its kind ("lattice" or "linear"), its regularisers,
    whether it stops early (holding out ``validation_fraction`` of the rows), and whether its
    calibrators start as straight lines in their inputs."""

    kind: str
    regularization: Regularization
    early_stopping: bool
    validation_fraction: float
    straight_start: bool

    def params(self) -> Dict[str, object]:
        """As the estimator's parameters name them (its ``chosen_params_``)."""
        return {
            "kind": self.kind,
            "early_stopping": self.early_stopping,
            "validation_fraction": self.validation_fraction,
            "straight_start": self.straight_start,
            **self.regularization.items(),
        }

    @classmethod
    def of(cls, params: Dict[str, object]) -> Capacity:
        """From ``chosen_params_`` (or an estimator's parameters)."""
        return cls(
            params["kind"],
            Regularization.of(params),
            bool(params["early_stopping"]),
            params["validation_fraction"],
            bool(params.get("straight_start", False)),  # an estimator's parameters: False
        )


def choose_capacity(kind: str, own: Capacity, count: int) -> Capacity:
    """The capacity to fit ``count`` rows with: ``own`` (the estimator's settings) for
    ``kind`` "lattice" or "linear"; for "auto", a lattice with ``own``'s regularisers, and
    early stopping on from ``AUTO_MIN_ROWS`` to ``AUTO_MAX_ROWS`` rows (module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    if kind != "auto":
        return own._replace(kind=kind)
    small = AUTO_MIN_ROWS <= count <= AUTO_MAX_ROWS
    return own._replace(kind="lattice", early_stopping=own.early_stopping or small, straight_start=small)
