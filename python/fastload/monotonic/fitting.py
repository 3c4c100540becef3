"""How the estimators fit: :class:`TableModel` (a calibrator per feature into a lattice, an
ensemble of lattices or a monotone linear layer per output), built from a seed, trained with
full-batch L-BFGS (or Adam minibatches) on the CPU, with early stopping on a validation split,
on a set number of torch threads, and swept to measure its largest monotonicity violation per
feature."""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import nn

from fastload._checks import is_int
from fastload.inspect import usable_cores
from fastload.monotonic.calibrators import CategoricalCalibrator, Located, PWLCalibrator
from fastload.monotonic.constraints import check_declared_buffer, check_monotone
from fastload.monotonic.features import Feature
from fastload.monotonic.lattice import Lattice, LatticeEnsemble
from fastload.monotonic.linear import MonotoneLinear
from fastload.monotonic.ordinal import CumulativeLink
from fastload.monotonic.regularizers import Regularization

__all__ = [
    "MAX_JOBS",
    "TableModel",
    "Training",
    "monotone_violations",
    "threads_for",
    "torch_threads",
    "train_table_model",
    "validation_split",
]


# The most threads n_jobs may ask for, either way: past any machine's cores, and torch's thread
# count is a C int (2**31 threads overflowed it).
MAX_JOBS = 4096


def threads_for(n_jobs: Optional[int]) -> int:
    """Threads for ``n_jobs``, counted as scikit-learn and joblib count them: None is one, -1
    every core this process may run on, -2 all but one, and so on."""
    if n_jobs is None:
        return 1
    if not is_int(n_jobs) or n_jobs == 0 or abs(n_jobs) > MAX_JOBS:
        raise ValueError(
            f"n_jobs must be a non-zero int or None, from -{MAX_JOBS} to {MAX_JOBS} threads, got {n_jobs!r}"
        )
    if n_jobs > 0:
        return int(n_jobs)
    return max(1, usable_cores() + 1 + int(n_jobs))


@contextlib.contextmanager
def torch_threads(count: int):
    """torch's intra-op thread count set to ``count`` for the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(count))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class TableModel(nn.Module):
    """Calibrators, one per feature, into ``num_outputs`` lattices (or ensembles), or into a
    monotone linear layer with ``kind="linear"``; initial values drawn from ``seed`` (the global
    RNG is left as it was), a bad size or kind a ValueError naming it. With
    ``ordinal_classes`` (and one output) a :class:`~fastload.monotonic.ordinal.CumulativeLink`
    turns the output into that many classes' cumulative log-odds. Its
    ``constraints`` buffer, one row (monotonicity, convexity, categorical, missing) per
    feature, is checked against a loaded state, so a state cannot bring other constraints. An
    ensemble's vertex parameters are scaled by its lattice count (``scaled_ensembles``; False:
    as in model files saved before that, whose parameters mean unscaled values). With
    ``straight_start`` the numeric calibrators start as straight lines in their inputs
    (:class:`~fastload.monotonic.PWLCalibrator`)."""

    def __init__(
        self,
        features: Sequence[Feature],
        keypoints: Sequence[Optional[Sequence[float]]],
        categories: Sequence[Optional[Sequence[Any]]],
        lattice_size: int,
        lattice_rank: int,
        num_lattices: Optional[int],
        num_outputs: int,
        seed: int,
        kind: str,
        ordinal_classes: Optional[int] = None,
        scaled_ensembles: bool = True,
        straight_start: bool = False,
    ):
        if int(lattice_size) < 2:
            raise ValueError(f"lattice_size must be >= 2, got {lattice_size}")
        if int(lattice_rank) < 1:
            raise ValueError(f"lattice_rank must be >= 1, got {lattice_rank}")
        if kind not in ("lattice", "linear"):
            raise ValueError(f"kind must be 'lattice' or 'linear', got {kind!r}")
        super().__init__()
        lattice_size, lattice_rank = int(lattice_size), int(lattice_rank)
        with torch.random.fork_rng(devices=[]):  # lattices draw initial noise from the global RNG
            torch.manual_seed(seed)
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
                            straight_start=straight_start,
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
                    # Vertex parameters scaled by the lattice count, for L-BFGS (LatticeEnsemble).
                    scale = number if scaled_ensembles else 1.0
                    lattices.append(
                        LatticeEnsemble(
                            count, lattice_rank, number, lattice_size, mono, seed + k, parameter_scale=scale
                        )
                    )
            self.lattices = nn.ModuleList(lattices)
            # Ordered classes: the one output becomes cumulative log-odds (fastload.monotonic.ordinal).
            self.link = CumulativeLink(ordinal_classes) if ordinal_classes else None
            constraints = [
                [f.monotonicity, f.convexity, int(f.categorical), int(f.missing)] for f in features
            ]
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
        return self.evaluate(self.locate(x))

    def locate(self, x: torch.Tensor) -> List[Located]:
        """Where each feature's values fall in its calibrator: what training computes once."""
        return [cal.locate(x[:, j]) for j, cal in enumerate(self.calibrators)]

    def evaluate(self, located: Sequence[Located]) -> torch.Tensor:
        """The output at inputs :meth:`locate` placed, (N, num_outputs)."""
        calibrated = torch.stack([cal.interpolate(at) for cal, at in zip(self.calibrators, located)], 1)
        if self.linear is not None:
            out = self.linear(calibrated)
        else:
            out = torch.stack([lattice(calibrated) for lattice in self.lattices], 1)
        return out if self.link is None else self.link(out[:, 0])

    def penalty(self, regularization: Regularization) -> torch.Tensor:
        """The regularisers' sum over this model's calibrators, lattices and linear layer
        (:mod:`~fastload.monotonic.regularizers`)."""
        return regularization.penalty(self.calibrators, self.lattices, self.linear)

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


class Training(NamedTuple):
    """What :func:`train_table_model` reports: the training loss after each round (an L-BFGS
    iteration, or an Adam epoch), and the validation loss after each round with early stopping
    (empty without)."""

    loss_curve: List[float]
    validation_loss_curve: List[float]


def train_table_model(
    model: TableModel,
    x: torch.Tensor,
    target: torch.Tensor,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    weights: Optional[torch.Tensor] = None,
    seed: int,
    solver: str,
    max_iter: int,
    tol: float,
    learning_rate: float,
    batch_size: Optional[int],
    validation_fraction: Optional[float],
    n_iter_no_change: int,
    stratify: Optional[torch.Tensor] = None,
    regularization: Optional[Regularization] = None,
) -> Training:
    """Trains ``model`` in place. ``loss`` gives each sample's loss; the training loss is their
    mean weighted by ``weights`` (sample weights; None: equal).

    ``solver="lbfgs"``: full-batch L-BFGS with a strong-Wolfe line search. Why: the model has a
    few hundred parameters and the loss is smooth in them, so a quasi-Newton step over all the
    rows converges in tens of iterations where first-order steps need hundreds, and each
    iteration is a handful of large tensor operations (no per-batch Python). The inputs' cells
    are located once (:meth:`TableModel.locate`), not at every evaluation, and the loss runs
    over chunks of ``CHUNK_ROWS`` rows; past ``SUBSAMPLE_ROWS`` rows most iterations run on a
    sample of that many, then at most ``POLISH_ITER`` over all. Stops once 5 iterations improved
    the loss by less than ``tol`` (relative) and, after a fresh start of its curvature memory,
    5 more did too. ``solver="adam"``: Adam with
    ``learning_rate``, full batch (``batch_size`` None) or minibatches shuffled from ``seed``,
    for ``max_iter`` epochs. With ``validation_fraction`` (either solver; early stopping) that
    share of the rows, drawn from ``seed`` within each class of ``stratify`` (a classifier's
    codes, so every class is in both parts), is held out; training stops after
    ``n_iter_no_change`` rounds without a better validation loss and keeps the best round's
    parameters. ``regularization``'s penalty (:meth:`TableModel.penalty`) adds to the loss
    that either solver minimises (once per L-BFGS evaluation, once per Adam step); the L-BFGS
    curve is that objective, Adam's the rows' loss, and the validation loss never has it."""
    if solver not in ("lbfgs", "adam"):
        raise ValueError(f"solver must be 'lbfgs' or 'adam', got {solver!r}")
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    if solver == "lbfgs" and batch_size is not None:
        raise ValueError("batch_size applies to solver='adam' (L-BFGS takes every row at each step)")
    generator = torch.Generator().manual_seed(seed)
    weights = torch.ones(len(x)) if weights is None else weights
    train_x, train_t, train_w, val_x, val_t, val_w = x, target, weights, None, None, None
    if validation_fraction is not None:
        held, kept = validation_split(len(x), validation_fraction, stratify, generator)
        train_x, train_t, train_w = x[kept], target[kept], weights[kept]
        val_x, val_t, val_w = x[held], target[held], weights[held]
    batch = len(train_x) if batch_size is None else int(batch_size)
    if batch < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    located = model.locate(train_x)
    val_located = None if val_x is None else model.locate(val_x)
    stopping = _EarlyStopping(model, val_located, val_t, val_w, loss, n_iter_no_change)
    penalty = (lambda: model.penalty(regularization)) if regularization else None  # None or all 0
    if solver == "lbfgs":
        curve: List[float] = []
        if len(train_t) > SUBSAMPLE_ROWS:
            # Most iterations on a sample, then a few over every row from there: the sample's
            # optimum is already close for a model of a few hundred parameters.
            rows = torch.randperm(len(train_t), generator=generator)[:SUBSAMPLE_ROWS]
            sample = [at.take(rows) for at in located]
            curve += _lbfgs(
                model, sample, train_t[rows], train_w[rows], loss, int(max_iter), tol, stopping, penalty
            )
            max_iter = min(int(max_iter), POLISH_ITER)
        curve += _lbfgs(model, located, train_t, train_w, loss, int(max_iter), tol, stopping, penalty)
    else:
        curve = _adam(
            model,
            located,
            train_t,
            train_w,
            loss,
            int(max_iter),
            learning_rate,
            batch,
            generator,
            stopping,
            penalty,
        )
    stopping.restore_best()
    return Training(curve, stopping.curve)


def validation_split(
    count: int, fraction: float, stratify: Optional[torch.Tensor], generator: torch.Generator
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(held-out rows, training rows): ``fraction`` of ``count`` rows drawn from ``generator``,
    that share of each class of ``stratify`` when given."""
    if not 0 < fraction < 1:
        raise ValueError(f"validation_fraction must be in (0, 1), got {fraction}")
    order = torch.randperm(count, generator=generator)
    groups = [order] if stratify is None else [order[stratify[order] == code] for code in stratify.unique()]
    parts = [
        (group[: round(len(group) * fraction)], group[round(len(group) * fraction) :]) for group in groups
    ]
    held, kept = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    if len(held) == 0 or len(kept) == 0 or (stratify is not None and min(len(p[1]) for p in parts) == 0):
        raise ValueError(
            f"validation_fraction={fraction} of {count} samples leaves no "
            f"{'validation' if len(held) == 0 else 'training'} sample"
            + ("" if stratify is None else " of some class")
        )
    return held.sort().values, kept.sort().values


class _EarlyStopping:
    """Tracks the validation loss after each round; without validation data it never stops."""

    def __init__(self, model: TableModel, located, target, weights, loss, patience: int):
        self.model, self.located, self.target, self.weights, self.loss = model, located, target, weights, loss
        self.patience, self.best, self.best_state, self.waited = int(patience), math.inf, None, 0
        self.curve: List[float] = []

    def should_stop(self) -> bool:
        if self.located is None:
            return False
        with torch.no_grad():
            losses = self.loss(self.model.evaluate(self.located), self.target)
            current = ((losses * self.weights).sum() / self.weights.sum()).item()
        self.curve.append(current)
        if current < self.best:
            self.best, self.best_state, self.waited = current, copy.deepcopy(self.model.state_dict()), 0
            return False
        self.waited += 1
        return self.waited >= self.patience

    def restore_best(self) -> None:
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)


# L-BFGS stops once this many iterations together improved the loss by less than ``tol``.
_TOL_WINDOW = 5
# L-BFGS evaluates the loss over chunks of this many rows.
CHUNK_ROWS = 65536
# Past this many training rows, L-BFGS first trains on a sample of this many, then runs at most
# POLISH_ITER iterations over all of them.
SUBSAMPLE_ROWS, POLISH_ITER = 32768, 3


def _lbfgs(
    model, located, target, weights, loss, max_iter: int, tol: float, stopping: _EarlyStopping, penalty
) -> List[float]:
    params = [p for p in model.parameters() if p.requires_grad]

    # One iteration per step() (max_eval: its line search's budget; the default, 1.25 max_iter,
    # would leave it none), so the stopping rules below run after each.
    def fresh() -> torch.optim.LBFGS:
        return torch.optim.LBFGS(
            params, lr=1.0, max_iter=1, max_eval=25, history_size=20, line_search_fn="strong_wolfe",
            tolerance_grad=0.0, tolerance_change=0.0,
        )  # fmt: skip

    optimizer = fresh()
    evaluations: List[Tuple[torch.Tensor, float, List[torch.Tensor]]] = []
    # Rows in chunks: each chunk's temporaries stay in cache (3x faster at 1M rows than one pass).
    rows = [slice(start, start + CHUNK_ROWS) for start in range(0, len(target), CHUNK_ROWS)]
    chunks = [([at.take(part) for at in located], target[part], weights[part]) for part in rows]
    total = weights.sum()

    def point() -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in params])

    def closure() -> torch.Tensor:
        # step() starts by evaluating where the last line search ended: that point is cached.
        here = point()
        for seen, value, grads in evaluations:
            if torch.equal(seen, here):
                for p, g in zip(params, grads):
                    p.grad = g.clone()
                return torch.tensor(value)
        optimizer.zero_grad()
        value = 0.0
        for part, part_target, part_weights in chunks:  # each chunk adds its share of the mean
            share = (loss(model.evaluate(part), part_target) * part_weights).sum() / total
            share.backward()
            value += share.item()
        if penalty is not None:
            extra = penalty()
            if extra.requires_grad:  # a penalty over no parameter (a one-input lattice's torsion) is 0
                extra.backward()
            value += extra.item()
        evaluations.append((here, value, [p.grad.clone() for p in params]))
        return torch.tensor(value)

    curve = [closure().item()]
    restarted, since = False, 0
    for _ in range(max_iter):
        optimizer.step(closure)
        curve.append(closure().item())
        here = point()
        evaluations[:] = [e for e in evaluations if torch.equal(e[0], here)]
        if not math.isfinite(curve[-1]) or stopping.should_stop():
            break
        if (
            len(curve) > since + _TOL_WINDOW
            and curve[-1 - _TOL_WINDOW] - curve[-1] <= tol * curve[-1 - _TOL_WINDOW]
        ):
            if restarted:
                break
            # A stall can be the curvature memory's, not the optimum: once, start it afresh.
            optimizer, restarted, since = fresh(), True, len(curve) - 1
        elif len(curve) > since + _TOL_WINDOW:
            restarted = False
    return curve[1:]


def _adam(
    model, located, target, weights, loss, max_iter, learning_rate, batch, generator, stopping, penalty
) -> List[float]:
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    curve: List[float] = []
    count = len(target)
    for _ in range(max_iter):
        order = torch.randperm(count, generator=generator) if batch < count else None
        total = 0.0
        for start in range(0, count, batch):
            rows = slice(None) if order is None else order[start : start + batch]
            batch_weights = weights[rows]
            losses = loss(model.evaluate([at.take(rows) for at in located]), target[rows]) * batch_weights
            step_loss = losses.sum() / batch_weights.sum()
            if penalty is not None:
                step_loss = step_loss + penalty()
            optimizer.zero_grad()
            step_loss.backward()
            optimizer.step()
            total += losses.sum().item()
        curve.append(total / weights.sum().item())
        if stopping.should_stop():
            break
    return curve


def monotone_violations(
    model: nn.Module,
    x: torch.Tensor,
    features: Sequence[Feature],
    categories: Sequence[Optional[Sequence[Any]]],
    num_steps: int,
    threads: int,
) -> Dict[str, float]:
    """Largest decrease of each declared monotone feature's output (model units) as it sweeps in
    its direction over ``num_steps`` values (numbers: the range in the encoded ``x`` widened by
    half its span each side; categories: each one in order) while every row keeps its other
    values; :func:`~fastload.monotonic.check_monotone` measures it, on ``threads`` torch threads."""
    worst = {}
    for j, feature in enumerate(features):
        if not feature.monotonicity:
            continue
        sign, values = feature.monotonicity, x[:, j : j + 1]
        sweep_range: Optional[Tuple[float, float]] = None
        steps = num_steps
        if feature.categorical:
            last = float(len(categories[j]) - 1)
            sweep_range, steps = ((0.0, last) if sign > 0 else (-last, 0.0)), max(int(last) + 1, 2)
        present = values[~torch.isnan(values)]
        values = values.nan_to_num(present.min().item() if len(present) else 0.0)
        sweep = _Sweep(model, j, sign).eval()  # check_monotone restores this mode after
        with torch_threads(threads):
            worst[feature.name] = check_monotone(sweep, x, sign * values, steps, sweep_range)
    return worst
