"""Calibrators: learned one-dimensional transforms of a single input, monotone (and convex or
concave) by construction. :class:`PWLCalibrator` is piecewise linear over keypoints,
:class:`CategoricalCalibrator` has one output per category; either can give missing inputs a
learned output of their own. The maps and their guarantees, rounding included, are
:mod:`fastload.monotonic.constraints`'."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from fastload.monotonic.constraints import (
    CURVATURES,
    as_direction,
    cell_index,
    check_bounds,
    initial_raw,
    into_bounds,
    inverse_softplus,
    monotone_lerp,
    output_and_compute_dtypes,
)

__all__ = ["CategoricalCalibrator", "Located", "PWLCalibrator"]


class Located(NamedTuple):
    """Where a calibrator's inputs fall: piece (or category) index, position in the piece (0 for
    a category), missing mask (None: none can be missing) and the output dtype."""

    index: torch.Tensor
    fraction: torch.Tensor
    missing: Optional[torch.Tensor]
    out_dtype: torch.dtype

    def take(self, rows) -> Located:
        """These inputs' ``rows`` (a minibatch)."""
        fraction = self.fraction if self.fraction.dim() == 0 else self.fraction[rows]
        missing = None if self.missing is None else self.missing[rows]
        return Located(self.index[rows], fraction, missing, self.out_dtype)


def _monotone_sequence(
    raw: torch.Tensor, monotonicity: int, output_min: Optional[float], output_max: Optional[float]
) -> torch.Tensor:
    """Values from free ``raw``: a first value plus signed softplus increments when monotone,
    passed through the output bounds."""
    if not monotonicity:
        return into_bounds(raw, output_min, output_max)
    values = into_bounds(
        torch.cat([raw[:1], monotonicity * F.softplus(raw[1:])]).cumsum(0), output_min, output_max
    )
    if output_min is None:
        return values  # a running sum of same-signed increments is monotone under rounding
    # The sigmoid can split ties 1 ulp the wrong way (fastload.monotonic.constraints): a running max (min)
    # restores them exactly and is the identity on what the sigmoid should have given.
    return values.cummax(0).values if monotonicity > 0 else values.cummin(0).values


def _raw_for_sequence(target: torch.Tensor, monotonicity: int) -> torch.Tensor:
    """Free values whose :func:`_monotone_sequence` is ``target`` (already in raw, pre-bound
    space); ties of a monotone target become increments of 1e-6."""
    if not monotonicity:
        return target
    steps = inverse_softplus(target.diff().abs().clamp(min=1e-6))
    return torch.cat([target[:1], steps])


def _check_missing(impute_missing: bool, missing_input_value: Optional[float]) -> bool:
    if missing_input_value is not None and not math.isfinite(missing_input_value):
        raise ValueError(
            f"missing_input_value must be finite (NaN is always missing), got {missing_input_value}"
        )
    return bool(impute_missing) or missing_input_value is not None


class _MissingOutput(nn.Module):
    """A learned output for missing inputs (NaN, or ``missing_input_value``): a missing value is
    no point on the input axis, so it gets its own output instead of a NaN. Inside the output
    bounds when the calibrator has them; monotonicity concerns present inputs only."""

    def __init__(self, initial: float, missing_input_value: Optional[float], output_min, output_max):
        super().__init__()
        self.missing_input_value = None if missing_input_value is None else float(missing_input_value)
        self.output_min, self.output_max = output_min, output_max
        self.raw = nn.Parameter(torch.tensor(float(initial)))

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        missing = torch.isnan(x)
        if self.missing_input_value is not None:
            missing |= x == self.missing_input_value
        return missing

    def value(self, dtype: torch.dtype) -> torch.Tensor:
        return into_bounds(self.raw.to(dtype), self.output_min, self.output_max)


class PWLCalibrator(nn.Module):
    """Piecewise-linear 1-D function through keypoints.

    Keypoints are ``num_keypoints`` evenly spaced over ``[input_min, input_max]``, or the sorted
    ``input_keypoints`` (for example quantiles of the data, so each piece sees as many samples).
    Constant outside the keypoints. ``monotonicity`` is +1 (non-decreasing), -1
    (non-increasing) or 0 (free), or its name ("increasing", "decreasing", None). With
    ``output_min`` and ``output_max`` (both or neither) the outputs stay strictly inside the
    bounds. ``convexity`` is +1 ("convex": slopes non-decreasing from piece to piece), -1
    ("concave") or 0, between the first and the last keypoint (the constant extensions outside
    keep monotonicity, not convexity); a bounded convex or concave calibrator spans ``[output_min, output_max]``
    (up to rounding) instead (an increasing affine rescaling of its keypoint outputs, which keeps
    convexity where a sigmoid would bend the pieces). With ``impute_missing`` (or a ``missing_input_value``) NaN inputs (and that value) take a
    learned output instead of giving NaN. Accepts shape (N,) or (N, 1), returns the same shape.

    Starts as a ramp over the keypoints, reversed for -1, so an untrained calibrator passes
    information through: the identity on evenly spaced keypoints, equal steps between given
    ones (a straight line when convex or concave, the only ramp that is both), across the middle
    of the bounds when bounded (all of them when also convex or concave), or from
    ``initial_range``. With ``straight_start`` every calibrator starts as the straight line in
    its input: what a model stopped early on a small table stays near (the estimators'
    ``kind="auto"``, :mod:`fastload.monotonic.capacity`).
    """

    def __init__(
        self,
        num_keypoints: Optional[int] = None,
        input_min: Optional[float] = None,
        input_max: Optional[float] = None,
        monotonicity: Union[int, str, None] = 1,
        output_min: Optional[float] = None,
        output_max: Optional[float] = None,
        *,
        convexity: Union[int, str, None] = 0,
        input_keypoints: Optional[Sequence[float]] = None,
        initial_range: Optional[Tuple[float, float]] = None,
        impute_missing: bool = False,
        missing_input_value: Optional[float] = None,
        straight_start: bool = False,
    ):
        super().__init__()
        if input_keypoints is not None:
            if num_keypoints is not None or input_min is not None or input_max is not None:
                raise ValueError("give either num_keypoints, input_min and input_max, or input_keypoints")
            keypoints = torch.as_tensor(input_keypoints, dtype=torch.float64).flatten()
            if len(keypoints) < 2 or not torch.isfinite(keypoints).all():
                raise ValueError(f"input_keypoints must be >= 2 finite values, got {keypoints.tolist()}")
            # Distinct in float32, the narrowest compute dtype, so no piece has zero width.
            if not (keypoints.float().diff() > 0).all():
                raise ValueError("input_keypoints must be strictly increasing, also when rounded to float32")
            self._input_keypoints: Optional[Tuple[float, ...]] = tuple(keypoints.tolist())
            num_keypoints, input_min, input_max = len(keypoints), keypoints[0].item(), keypoints[-1].item()
        else:
            if num_keypoints is None or input_min is None or input_max is None:
                raise ValueError("give either num_keypoints, input_min and input_max, or input_keypoints")
            self._input_keypoints = None
        if int(num_keypoints) < 2:
            raise ValueError(f"num_keypoints must be >= 2, got {num_keypoints}")
        if not float(input_min) < float(input_max):
            raise ValueError(f"input_min ({input_min}) must be < input_max ({input_max})")
        monotonicity, convexity = as_direction(monotonicity), as_direction(convexity, CURVATURES)
        if monotonicity not in (-1, 0, 1):
            raise ValueError(f"monotonicity must be -1, 0 or 1, got {monotonicity!r}")
        if convexity not in (-1, 0, 1):
            raise ValueError(
                f"convexity must be -1, 0 or 1 (or 'convex', 'concave', None), got {convexity!r}"
            )
        check_bounds(output_min, output_max)
        self.num_keypoints = int(num_keypoints)
        self.input_min, self.input_max = float(input_min), float(input_max)
        self.monotonicity, self.convexity = monotonicity, convexity
        self.output_min, self.output_max = output_min, output_max

        fraction = torch.linspace(0.0, 1.0, self.num_keypoints)
        positions = self._keypoints(torch.device("cpu")).float()
        straight = bool(self.convexity) or straight_start
        if straight:  # a straight line in x
            fraction = (positions - self.input_min) / (self.input_max - self.input_min)
        if self.monotonicity < 0:
            fraction = 1 - fraction if straight else fraction.flip(0)
        low, high = initial_range if initial_range is not None else (self.input_min, self.input_max)
        target = initial_raw(fraction, output_min is not None, low, high)
        if self.convexity:
            if output_min is not None:  # rescaled, not squashed: a line across the bounds
                target = output_min + (output_max - output_min) * fraction
            slope = (target.diff() / positions.diff()).mean()
            anchor = inverse_softplus(slope.abs().clamp(min=1e-6)) if self.monotonicity else slope
            moves = inverse_softplus(torch.full((self.num_keypoints - 2,), 1e-6))
            self.raw = nn.Parameter(torch.cat([target[:1], anchor[None], moves]))
        else:
            self.raw = nn.Parameter(_raw_for_sequence(target, self.monotonicity))
        self.missing = None
        if _check_missing(impute_missing, missing_input_value):
            initial = initial_raw(torch.tensor(0.5), output_min is not None, low, high)
            self.missing = _MissingOutput(initial.item(), missing_input_value, output_min, output_max)

    @property
    def keypoints(self) -> torch.Tensor:
        """Input positions of the keypoints (float64 when given, else float32)."""
        return self._keypoints(self.raw.device)

    def _keypoints(self, device: torch.device) -> torch.Tensor:
        if self._input_keypoints is not None:
            return torch.tensor(self._input_keypoints, dtype=torch.float64, device=device)
        return torch.linspace(self.input_min, self.input_max, self.num_keypoints, device=device)

    def _widths(self, dtype: torch.dtype) -> torch.Tensor:
        return self.keypoints.to(dtype).diff()

    def slopes(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """Slope of each piece of a convex or concave calibrator, shape (num_keypoints - 1,): an
        anchor slope (signed softplus when monotone) plus a running sum of softplus moves, so the
        sequence is monotone in the declared direction under rounding too. The anchor is the
        piece nearest zero slope for a monotone calibrator (the last one when convex and
        decreasing or concave and increasing), so every slope keeps the declared sign."""
        if not self.convexity:
            raise ValueError("slopes are parameters of convex or concave calibrators only")
        raw = self.raw.to(dtype or torch.promote_types(self.raw.dtype, torch.float32))
        anchor = raw[1:2] if not self.monotonicity else self.monotonicity * F.softplus(raw[1:2])
        moves = torch.cat([raw.new_zeros(1), F.softplus(raw[2:])])
        if self.convexity * self.monotonicity < 0:
            return (anchor - self.convexity * moves.cumsum(0)).flip(0)
        return anchor + self.convexity * moves.cumsum(0)

    def keypoint_outputs(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """Output values at the keypoints: a first value plus signed increments, softplus ones
        for a monotone calibrator, slope times width for a convex or concave one."""
        dtype = dtype or torch.promote_types(self.raw.dtype, torch.float32)
        if not self.convexity:
            return _monotone_sequence(self.raw.to(dtype), self.monotonicity, self.output_min, self.output_max)
        raw = self.raw.to(dtype)
        values = torch.cat([raw[:1], self.slopes(dtype) * self._widths(dtype)]).cumsum(0)
        if self.output_min is None:
            return values
        # (v - min) / range in [0, 1] (a flat calibrator's 0 / tiny is 0), then onto the bounds:
        # each step monotone in v under rounding; the clamp catches the last ulp of the sum.
        low, high = values.min(), values.max()
        fraction = (values - low) / (high - low).clamp(min=torch.finfo(dtype).tiny)
        scaled = self.output_min + fraction * (self.output_max - self.output_min)
        return scaled.clamp(self.output_min, self.output_max)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (x.dim() == 1 or (x.dim() == 2 and x.shape[1] == 1)):
            raise ValueError(f"PWLCalibrator input must have shape (N,) or (N, 1), got {tuple(x.shape)}")
        return self.interpolate(self.locate(x))

    def locate(self, x: torch.Tensor) -> Located:
        """Each input's piece and its position in it: the part of :meth:`forward` that does not
        depend on the parameters, which training computes once for all its steps."""
        out_dtype, dtype = output_and_compute_dtypes(x, self.raw)
        x = x.to(dtype)
        missing = None
        if self.missing is not None:
            missing = self.missing.mask(x)
            x = x.masked_fill(missing, self.input_min)
        if self._input_keypoints is None:
            scale = (self.num_keypoints - 1) / (self.input_max - self.input_min)
            t = (x.clamp(self.input_min, self.input_max) - self.input_min) * scale
            cell = t.floor().clamp(max=self.num_keypoints - 2)
            index, fraction = cell_index(cell), t - cell
        else:
            # fl(x - k[i]) <= fl(k[i + 1] - k[i]) for x <= k[i + 1], so the fraction stays in
            # [0, 1] and grows with x: monotone under rounding as in the even case. A NaN sorts
            # last and keeps its NaN fraction.
            keypoints = self.keypoints.to(dtype)
            x = torch.minimum(torch.maximum(x, keypoints[0]), keypoints[-1])
            index = (torch.searchsorted(keypoints, x.contiguous(), right=True) - 1).clamp(
                0, len(keypoints) - 2
            )
            fraction = (x - keypoints[index]) / (keypoints[index + 1] - keypoints[index])
        return Located(index, fraction, missing, out_dtype)

    def interpolate(self, located: Located) -> torch.Tensor:
        """The outputs at inputs :meth:`locate` placed: each piece's ends interpolated."""
        dtype = located.fraction.dtype
        values = self.keypoint_outputs(dtype)
        # One lookup of each cell's (start, end) pair: the lookup's backward is the costly part,
        # and index_select's (a sum into each row) is much cheaper than indexing's.
        pairs = torch.stack([values[:-1], values[1:]], 1)
        ends = pairs.index_select(0, located.index.flatten()).view(*located.index.shape, 2)
        y = monotone_lerp(ends[..., 0], ends[..., 1], located.fraction)
        if located.missing is not None:
            y = torch.where(located.missing, self.missing.value(dtype), y)
        return y.to(located.out_dtype)

    def extra_repr(self) -> str:
        return (
            f"num_keypoints={self.num_keypoints}, input_range=({self.input_min}, {self.input_max}), "
            f"monotonicity={self.monotonicity}, convexity={self.convexity}, "
            f"output_range=({self.output_min}, {self.output_max})"
        )


class CategoricalCalibrator(nn.Module):
    """One learned output per category, for inputs holding category codes 0 .. num_categories - 1.

    ``monotonicity`` +1 ("increasing") makes the outputs non-decreasing in code order (declare
    the categories in their natural order: "low", "mid", "high"), -1 non-increasing, 0 free;
    exact under rounding, by the same map as :class:`PWLCalibrator`'s keypoint outputs. With
    ``output_min`` and ``output_max`` the outputs stay inside the bounds. A NaN code is a missing
    value: NaN out, or a learned output with ``impute_missing``. Other codes that are not one of
    the categories raise ValueError. Accepts shape (N,) or (N, 1), returns the same shape.
    """

    def __init__(
        self,
        num_categories: int,
        monotonicity: Union[int, str, None] = 0,
        output_min: Optional[float] = None,
        output_max: Optional[float] = None,
        *,
        initial_range: Tuple[float, float] = (0.0, 1.0),
        impute_missing: bool = False,
    ):
        super().__init__()
        if int(num_categories) < 1:
            raise ValueError(f"num_categories must be >= 1, got {num_categories}")
        monotonicity = as_direction(monotonicity)
        if monotonicity not in (-1, 0, 1):
            raise ValueError(f"monotonicity must be -1, 0 or 1, got {monotonicity!r}")
        check_bounds(output_min, output_max)
        self.num_categories, self.monotonicity = int(num_categories), monotonicity
        self.output_min, self.output_max = output_min, output_max
        # Monotone: a ramp in code order (reversed for -1); free: every category in the middle.
        fraction = (
            torch.linspace(0.0, 1.0, self.num_categories)
            if monotonicity
            else torch.full((self.num_categories,), 0.5)
        )
        if monotonicity < 0:
            fraction = fraction.flip(0)
        target = initial_raw(fraction, output_min is not None, *initial_range)
        self.raw = nn.Parameter(_raw_for_sequence(target, monotonicity))
        self.missing = None
        if impute_missing:
            initial = initial_raw(torch.tensor(0.5), output_min is not None, *initial_range)
            self.missing = _MissingOutput(initial.item(), None, output_min, output_max)

    def category_outputs(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """Output of each category, shape (num_categories,)."""
        raw = self.raw.to(dtype or torch.promote_types(self.raw.dtype, torch.float32))
        return _monotone_sequence(raw, self.monotonicity, self.output_min, self.output_max)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (x.dim() == 1 or (x.dim() == 2 and x.shape[1] == 1)):
            raise ValueError(
                f"CategoricalCalibrator input must have shape (N,) or (N, 1), got {tuple(x.shape)}"
            )
        return self.interpolate(self.locate(x))

    def locate(self, x: torch.Tensor) -> Located:
        """Each input's category code, checked: the part of :meth:`forward` that does not depend
        on the parameters."""
        out_dtype = torch.promote_types(x.dtype, self.raw.dtype) if x.is_floating_point() else self.raw.dtype
        dtype = torch.promote_types(out_dtype, torch.float32)
        codes = x.to(torch.float64)
        missing = torch.isnan(codes)
        present = codes[~missing]
        if ((present < 0) | (present >= self.num_categories) | (present != present.round())).any():
            raise ValueError(
                f"category codes must be integers in [0, {self.num_categories - 1}] (or NaN: missing)"
            )
        return Located(codes.nan_to_num(0.0).long(), torch.zeros((), dtype=dtype), missing, out_dtype)

    def interpolate(self, located: Located) -> torch.Tensor:
        """The outputs of the categories :meth:`locate` read (NaN, or the learned output, where
        missing)."""
        dtype = located.fraction.dtype
        y = self.category_outputs(dtype)[located.index]
        fill = self.missing.value(dtype) if self.missing is not None else torch.tensor(math.nan, dtype=dtype)
        return torch.where(located.missing, fill.to(y.device), y).to(located.out_dtype)

    def extra_repr(self) -> str:
        return (
            f"num_categories={self.num_categories}, monotonicity={self.monotonicity}, "
            f"output_range=({self.output_min}, {self.output_max})"
        )
