"""How the estimators fit: :class:`TableModel` (a calibrator per feature into a lattice, an
ensemble of lattices or a monotone linear layer per output), built from a seed, trained with
Adam on the CPU (full batch or minibatches, with early stopping on a validation split), on a set
number of torch threads, and swept to measure its largest monotonicity violation per feature."""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from fastload.monotonic.calibrators import CategoricalCalibrator, PWLCalibrator
from fastload.monotonic.constraints import check_declared_buffer, check_monotone
from fastload.monotonic.features import Feature
from fastload.monotonic.lattice import Lattice, LatticeEnsemble
from fastload.monotonic.linear import MonotoneLinear

__all__ = ["TableModel", "monotone_violations", "torch_threads", "train_table_model"]


@contextlib.contextmanager
def torch_threads(count: Optional[int]):
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


class TableModel(nn.Module):
    """Calibrators, one per feature, into ``num_outputs`` lattices (or ensembles), or into a
    monotone linear layer with ``kind="linear"``; initial values drawn from ``seed`` (the global
    RNG is left as it was), a bad size or kind a ValueError naming it. Its
    ``constraints`` buffer, one row (monotonicity, convexity, categorical, missing) per
    feature, is checked against a loaded state, so a state cannot bring other constraints."""

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
                    lattices.append(
                        LatticeEnsemble(count, lattice_rank, number, lattice_size, mono, seed + k)
                    )
            self.lattices = nn.ModuleList(lattices)
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


def train_table_model(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    seed: int,
    max_iter: int,
    learning_rate: float,
    batch_size: Optional[int],
    validation_fraction: Optional[float],
    n_iter_no_change: int,
) -> List[float]:
    """Trains ``model`` in place with Adam, full batch (``batch_size`` None) or minibatches
    shuffled from ``seed``; with ``validation_fraction`` stops after ``n_iter_no_change`` epochs
    without a better validation loss and keeps the best epoch's parameters. Returns each epoch's
    mean training loss."""
    generator = torch.Generator().manual_seed(seed)
    train_x, train_t, val_x, val_t = x, target, None, None
    if validation_fraction is not None:
        if not 0 < validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
        held = round(len(x) * validation_fraction)
        if not 1 <= held < len(x):
            raise ValueError(
                f"validation_fraction={validation_fraction} of {len(x)} samples leaves no "
                "training or no validation sample"
            )
        order = torch.randperm(len(x), generator=generator)
        train_x, train_t = x[order[held:]], target[order[held:]]
        val_x, val_t = x[order[:held]], target[order[:held]]
    batch = len(train_x) if batch_size is None else int(batch_size)
    if batch < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    best, best_state, waited = math.inf, None, 0
    curve: List[float] = []
    for _ in range(int(max_iter)):
        order = torch.randperm(len(train_x), generator=generator) if batch < len(train_x) else None
        total = 0.0
        for start in range(0, len(train_x), batch):
            rows = slice(None) if order is None else order[start : start + batch]
            step_loss = loss(model(train_x[rows]), train_t[rows])
            optimizer.zero_grad()
            step_loss.backward()
            optimizer.step()
            total += step_loss.item() * (len(train_x) if order is None else len(rows))
        curve.append(total / len(train_x))
        if val_x is not None:
            with torch.no_grad():
                current = loss(model(val_x), val_t).item()
            if current < best:
                best, best_state, waited = current, copy.deepcopy(model.state_dict()), 0
            else:
                waited += 1
                if waited >= int(n_iter_no_change):
                    break
    if best_state is not None:
        model.load_state_dict(best_state)
    return curve


def monotone_violations(
    model: nn.Module,
    x: torch.Tensor,
    features: Sequence[Feature],
    categories: Sequence[Optional[Sequence[Any]]],
    num_steps: int,
    threads: Optional[int],
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
