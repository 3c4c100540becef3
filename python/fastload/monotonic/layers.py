"""Monotone neural building blocks: calibrators, sign-constrained linear layers and lattices.

Shape-constrained models let a user state "the prediction never goes down when this input goes
up" and have it hold for every input, not just on the training data. Every module here is plain
PyTorch and works on any device and in float32, float64 or bfloat16.

Monotonicity holds *by construction*: each module stores free (unconstrained) parameters and maps
them to constrained values in ``forward``, so any optimizer can take any step and the model stays
monotone; there is no projection step to forget. The maps used:

* ``PWLCalibrator``: keypoint outputs are a free first value plus a cumulative sum of softplus
  increments. Smooth and onto all strictly monotone keypoint sequences; exactly flat pieces are
  only approached (increment -> 0), which costs little in practice. ``CategoricalCalibrator``
  uses the same map over its categories in declared order.
* Convex (concave) ``PWLCalibrator``: the slopes of the pieces are an anchor slope plus a
  cumulative sum of softplus moves up (down), so they are non-decreasing (non-increasing) by
  construction, and keep the declared sign when also monotone (``PWLCalibrator.slopes``).
  The slope sequence is exact under rounding; the keypoint outputs, a running sum of slope
  times width, are not: a piece's increment rounds once in the product and once in the running
  sum, so its computed slope can differ from the declared one by ``u (V / w + |s|)`` (V the
  largest keypoint output magnitude, w the piece's width in the compute dtype, s its slope),
  and ties between neighbouring slopes can tip either way by that much
  (``test_convex_calibrator_for_any_parameters`` checks this bound). Monotonicity stays exact
  (same-signed increments). A bounded one is rescaled onto its bounds, ``(v - min) / (max -
  min)``, an increasing affine map: monotone under rounding, convex up to its own roundings.
* A decreasing lattice input is flipped, ``size - 1 - x``, onto an increasing lattice
  dimension: rounding is monotone, so every statement below about increasing inputs holds for
  decreasing ones, exactness included.
* ``MonotoneLinear``: weight = softplus(free) times the declared sign. Gradients never vanish at
  zero the way they do with clamping, at the price of never reaching exactly zero.
* ``Lattice`` / ``LatticeEnsemble``: vertex values are the free values fitted isotonically
  (least squares, what pool-adjacent-violators computes) along each monotone dimension in turn;
  the fit preserves order, so a later dimension's fit keeps the earlier ones monotone. The map is
  the identity on lattices that are already monotone, so every monotone lattice is reachable, and
  each vertex is the mean of a block containing its own free value, so every free value gets
  gradient. (The lower/upper envelopes, running max and min, used before passed gradient only to
  running records: 31-65% of a trained lattice's values got none, and training depended on the
  learning rate.) A running max along each monotone dimension follows, the identity in real
  arithmetic, to make the result exactly monotone under rounding. Cumulative sums of
  non-negative increments, the usual alternative, only work for one monotone dimension: chained
  over several they restrict the lattice to supermodular functions (no ``max(a, b)``).
* Output bounds apply an increasing sigmoid, which keeps monotonicity and pins outputs inside
  ``(output_min, output_max)``. ``torch.sigmoid`` is not one function under rounding: its
  vectorised body and its scalar tail can round the same value 1 ulp apart, which would break
  the exact ties the maps above create. So a lattice bounds its free values *before* its
  monotone fit, and a bounded calibrator follows the sigmoid by a running max (min for -1), the
  identity in real arithmetic; both are selections, exact under rounding.

Floating point: interpolation runs in at least float32 (bfloat16 inputs are upcast and the result
cast back; casting is monotone), because bfloat16 cell fractions are too coarse. The calibrators
are monotone under rounding too, not only in real arithmetic: a cell interpolates its end values
as ``a + f * (b - a)``, which rounding can neither reverse inside the cell (``f`` enters once) nor
push past ``b`` into the next cell (see ``_lerp``). A lattice reduces its cell corners one
dimension at a time: its first monotone dimension first, in that same form, then every other one
as ``(1 - f) * a + f * b``, which is monotone in ``a`` and ``b`` under rounding; so a lattice is
exactly monotone in its first monotone input, and in any further one up to rounding. A
:class:`~fastload.train.MonotonicRegressor` with one monotone input is therefore exactly monotone;
:func:`check_monotone` measures the rest.

The rounding bound for the further monotone inputs of a lattice with D dimensions, in a compute
dtype of unit roundoff u (2^-24 for float32 and bfloat16, 2^-53 for float64), to first order in
u: along them the output can decrease by at most ``(6 D + 4) u V``, V the largest vertex
magnitude (``vertex_values().abs().max()``). Derivation: the vertex values are exactly monotone
and the cell fractions exact (``x - floor(x)`` is exact by Sterbenz), so the multilinear
interpolant g is monotone and a computed decrease is at most twice the computed value's error E.
The first reduction, ``a + f (b - a)``, errs by at most ``u |result| + 2u |f (b - a)| <= 5 u V``
(the clamp only moves it towards the exact value); each further one, ``(1 - f) a + f b``, adds at
most ``3 u V`` to its inputs' error (three roundings, weights summing to 1). So E <= (3 D + 2) u
V. Outputs near 8e6 with V of that size stay within about 28 ulp for D = 4. A
:class:`LatticeEnsemble` of L lattices of rank r adds its mean's rounding: ``(6 r + 4 + 2 L) u
V``. The bound is relative to V, not to the output: cancellation can make an output far smaller
than the vertices it interpolates. A bfloat16 result is the float32 one cast, which can turn any
difference into one bfloat16 ulp.

Non-finite values: a NaN input gives a NaN output for that sample (as in ``nn.Linear``), never an
index error; infinite inputs clamp to the domain's ends. A calibrator told that its input may be
missing (``impute_missing``, ``missing_input_value``) gives such inputs a learned output instead.
Non-finite *parameters* (a diverged optimizer step) make outputs NaN silently, so training
should call :func:`check_finite_parameters`, and :func:`check_monotone` refuses NaN outputs.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "CategoricalCalibrator",
    "Lattice",
    "LatticeEnsemble",
    "MonotoneLinear",
    "PWLCalibrator",
    "MAX_LATTICE_ENTRIES",
    "check_finite_parameters",
    "check_lattice_size",
    "check_monotone",
]

# The most entries a lattice layer may build in one table: every vertex's coordinates while it
# is initialised (num_lattices x prod(sizes) x D) or the index of each cell's 2^D corners
# (prod(sizes) x 2^D, int64). At the limit that is a 128 MB index, or at most 4M float32 vertex
# values (64 MB with their gradient and AdamW's moments): far beyond any lattice that trains,
# and refused before anything is allocated.
MAX_LATTICE_ENTRIES = 2**24

# Bounded modules start with outputs covering this central part of (output_min, output_max),
# away from the flat tails of the sigmoid.
_INIT_LOW, _INIT_HIGH = 0.1, 0.9


def _check_bounds(output_min: Optional[float], output_max: Optional[float]) -> None:
    if (output_min is None) != (output_max is None):
        raise ValueError("output_min and output_max must be given together")
    if output_min is not None and not output_min < output_max:
        raise ValueError(f"output_min ({output_min}) must be < output_max ({output_max})")


def _bound(raw: torch.Tensor, output_min: Optional[float], output_max: Optional[float]) -> torch.Tensor:
    """Increasing map from free values into (output_min, output_max), or the identity."""
    if output_min is None:
        return raw
    return output_min + (output_max - output_min) * torch.sigmoid(raw)


def _initial_raw(fraction: torch.Tensor, bounded: bool, low: float, high: float) -> torch.Tensor:
    """Free values whose image under _bound is the ramp ``fraction`` (in [0, 1]) placed in the
    middle of the bounds, or spread over [low, high] when unbounded."""
    if bounded:
        return torch.logit(_INIT_LOW + (_INIT_HIGH - _INIT_LOW) * fraction)
    return low + (high - low) * fraction


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def _dtypes(x: torch.Tensor, param: torch.Tensor) -> Tuple[torch.dtype, torch.dtype]:
    """(output dtype, compute dtype): usual type promotion, computed in at least float32."""
    out = torch.promote_types(x.dtype, param.dtype)
    return out, torch.promote_types(out, torch.float32)


def _lerp(a: torch.Tensor, b: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Interpolation monotone in ``f`` under rounding, kept between ``a`` and ``b``: the position
    ``f`` in the last cell can round past 1 (and ``fl(b - a)`` past ``b - a``), so ``a + f * (b -
    a)`` could overshoot ``b`` and an output bound; the result is clamped to the segment. Clamping
    is monotone, and the next cell starts at exactly its ``a``, so monotonicity holds across cells.
    The clamp is added as a detached correction, so the backward pass is the unclamped one's: it
    moves the value by rounding only, and ``y + (c - y)`` is exactly ``c`` (Sterbenz makes ``c -
    y`` exact, and ``y - y`` is 0 when the clamp hits a zero end)."""
    y = a + f * (b - a)
    with torch.no_grad():
        correction = y.clamp(torch.minimum(a, b), torch.maximum(a, b)) - y
    return y + correction


def _isotonic(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Least-squares non-decreasing fit of ``values`` along ``dim`` (what pool-adjacent-violators
    computes), by the max-min formula ``fit[i] = max_{j <= i} min_{k >= i} mean(values[j..k])``.

    Why this map: it is the identity on monotone sequences, and each output is the mean of a block
    containing its own input, so every free value gets gradient (a running max reaches only the
    running records: a third to two thirds of a trained lattice's values got none). It preserves
    order (``a <= b`` elementwise gives ``fit(a) <= fit(b)``), so fitting along a later dimension
    keeps an earlier one monotone. Sizes are lattice sizes, so the O(size^2) block means are cheap."""
    y = values.movedim(dim, -1)
    size = y.shape[-1]
    sums = torch.cat([torch.zeros_like(y[..., :1]), y.cumsum(-1)], -1)
    start = torch.arange(size, device=y.device)[:, None]
    end = torch.arange(size, device=y.device)[None, :]
    means = (sums[..., None, 1:] - sums[..., :-1, None]) / (end - start + 1).clamp(min=1).to(y.dtype)
    # suffix_min[..., j, i] = min over k >= i of means[..., j, k]; blocks need j <= i.
    suffix_min = means.flip(-1).cummin(-1).values.flip(-1)
    fit = suffix_min.masked_fill(start > end, -math.inf).amax(-2)
    return fit.movedim(-1, dim)


_DIRECTIONS = {"increasing": 1, "decreasing": -1, "none": 0, None: 0}
CURVATURES = {"convex": 1, "concave": -1, "none": 0, None: 0}


def as_direction(value, words=_DIRECTIONS):
    """-1, 0 or 1 from the number itself or its name ("increasing", "decreasing", None; "convex",
    "concave" for ``words=CURVATURES``), else ``value`` unchanged for the caller's error."""
    if isinstance(value, str) or value is None:
        return words.get(value.lower() if isinstance(value, str) else value, value)
    return int(value) if isinstance(value, (int, float)) and int(value) == value else value


def _check_monotonicities(values, allowed: Tuple[int, ...], length: int, name: str) -> List[int]:
    values = [as_direction(m) for m in values]
    if len(values) != length:
        raise ValueError(f"{name} has {len(values)} entries, expected {length}")
    bad = [m for m in values if m not in allowed]
    if bad:
        raise ValueError(
            f"{name} must contain only {allowed} (or 'increasing', 'decreasing', None), got {bad}"
        )
    return values


def check_inputs(x: torch.Tensor, num_inputs: int, what: str) -> None:
    if x.dim() != 2 or x.shape[1] != num_inputs:
        raise ValueError(f"{what} must have shape (N, {num_inputs}), got {tuple(x.shape)}")


def _cell_index(cell: torch.Tensor) -> torch.Tensor:
    """Integer cell of each input; a NaN input's cell is 0, its fraction stays NaN, so the
    interpolation propagates the NaN instead of indexing with the integer NaN casts to."""
    return cell.nan_to_num(0.0).long()


def check_declared_buffer(module: nn.Module, state_dict: dict, prefix: str, name: str, what: str) -> None:
    """Refuses a state whose constraint buffer ``name`` differs from the module's own: a loaded
    state must not silently replace the monotonicity the module was declared with."""
    loaded, own = state_dict.get(prefix + name), getattr(module, name)
    if not isinstance(loaded, torch.Tensor):
        return  # missing keys are load_state_dict's own error (or allowed with strict=False)
    if loaded.shape != own.shape or not torch.equal(loaded.detach().to("cpu", own.dtype), own.cpu()):
        where = f" {prefix[:-1]!r}" if prefix else ""
        raise ValueError(
            f"{type(module).__name__}{where} was declared with {what} {own.long().tolist()}, but the "
            f"state to load has {loaded.tolist()}; constraints are part of the model's declaration: "
            "build the model with the same arguments as the saved one"
        )


def _monotone_sequence(
    raw: torch.Tensor, monotonicity: int, output_min: Optional[float], output_max: Optional[float]
) -> torch.Tensor:
    """Values from free ``raw``: a first value plus signed softplus increments when monotone,
    passed through the output bounds."""
    if not monotonicity:
        return _bound(raw, output_min, output_max)
    values = _bound(
        torch.cat([raw[:1], monotonicity * F.softplus(raw[1:])]).cumsum(0), output_min, output_max
    )
    if output_min is None:
        return values  # a running sum of same-signed increments is monotone under rounding
    # The sigmoid can split ties 1 ulp the wrong way (module docstring): a running max (min)
    # restores them exactly and is the identity on what the sigmoid should have given.
    return values.cummax(0).values if monotonicity > 0 else values.cummin(0).values


def _raw_for_sequence(target: torch.Tensor, monotonicity: int) -> torch.Tensor:
    """Free values whose :func:`_monotone_sequence` is ``target`` (already in raw, pre-bound
    space); ties of a monotone target become increments of 1e-6."""
    if not monotonicity:
        return target
    steps = _inverse_softplus(target.diff().abs().clamp(min=1e-6))
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
        return _bound(self.raw.to(dtype), self.output_min, self.output_max)


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
    ``initial_range``.
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
        _check_bounds(output_min, output_max)
        self.num_keypoints = int(num_keypoints)
        self.input_min, self.input_max = float(input_min), float(input_max)
        self.monotonicity, self.convexity = monotonicity, convexity
        self.output_min, self.output_max = output_min, output_max

        fraction = torch.linspace(0.0, 1.0, self.num_keypoints)
        positions = self._keypoints(torch.device("cpu")).float()
        if self.convexity:  # a straight line in x
            fraction = (positions - self.input_min) / (self.input_max - self.input_min)
        if self.monotonicity < 0:
            fraction = 1 - fraction if self.convexity else fraction.flip(0)
        low, high = initial_range if initial_range is not None else (self.input_min, self.input_max)
        target = _initial_raw(fraction, output_min is not None, low, high)
        if self.convexity:
            if output_min is not None:  # rescaled, not squashed: a line across the bounds
                target = output_min + (output_max - output_min) * fraction
            slope = (target.diff() / positions.diff()).mean()
            anchor = _inverse_softplus(slope.abs().clamp(min=1e-6)) if self.monotonicity else slope
            moves = _inverse_softplus(torch.full((self.num_keypoints - 2,), 1e-6))
            self.raw = nn.Parameter(torch.cat([target[:1], anchor[None], moves]))
        else:
            self.raw = nn.Parameter(_raw_for_sequence(target, self.monotonicity))
        self.missing = None
        if _check_missing(impute_missing, missing_input_value):
            initial = _initial_raw(torch.tensor(0.5), output_min is not None, low, high)
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
        out_dtype, dtype = _dtypes(x, self.raw)
        values = self.keypoint_outputs(dtype)
        x = x.to(dtype)
        missing = None
        if self.missing is not None:
            missing = self.missing.mask(x)
            x = x.masked_fill(missing, self.input_min)
        if self._input_keypoints is None:
            scale = (self.num_keypoints - 1) / (self.input_max - self.input_min)
            t = (x.clamp(self.input_min, self.input_max) - self.input_min) * scale
            cell = t.floor().clamp(max=self.num_keypoints - 2)
            index, fraction = _cell_index(cell), t - cell
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
        # One lookup of each cell's (start, end) pair: indexing's backward is the costly part.
        ends = torch.stack([values[:-1], values[1:]], 1)[index]
        y = _lerp(ends[..., 0], ends[..., 1], fraction)
        if missing is not None:
            y = torch.where(missing, self.missing.value(dtype), y)
        return y.to(out_dtype)

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
        _check_bounds(output_min, output_max)
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
        target = _initial_raw(fraction, output_min is not None, *initial_range)
        self.raw = nn.Parameter(_raw_for_sequence(target, monotonicity))
        self.missing = None
        if impute_missing:
            initial = _initial_raw(torch.tensor(0.5), output_min is not None, *initial_range)
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
        out_dtype = torch.promote_types(x.dtype, self.raw.dtype) if x.is_floating_point() else self.raw.dtype
        dtype = torch.promote_types(out_dtype, torch.float32)
        codes = x.to(torch.float64)
        missing = torch.isnan(codes)
        present = codes[~missing]
        if ((present < 0) | (present >= self.num_categories) | (present != present.round())).any():
            raise ValueError(
                f"category codes must be integers in [0, {self.num_categories - 1}] (or NaN: missing)"
            )
        y = self.category_outputs(dtype)[codes.nan_to_num(0.0).long()]
        fill = self.missing.value(dtype) if self.missing is not None else torch.tensor(math.nan, dtype=dtype)
        return torch.where(missing, fill.to(x.device), y).to(out_dtype)

    def extra_repr(self) -> str:
        return (
            f"num_categories={self.num_categories}, monotonicity={self.monotonicity}, "
            f"output_range=({self.output_min}, {self.output_max})"
        )


class MonotoneLinear(nn.Module):
    """Linear layer whose weights have a fixed sign per input: +1 non-negative, -1 non-positive,
    0 free. Constrained weights are softplus of a free parameter times the sign. Monotone up to
    the rounding of the matrix product."""

    def __init__(self, in_features: int, out_features: int, monotonicities: Union[int, Sequence[int]]):
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError("in_features and out_features must be >= 1")
        if isinstance(monotonicities, (int, str)) or monotonicities is None:
            monotonicities = [monotonicities] * in_features
        signs = _check_monotonicities(monotonicities, (-1, 0, 1), in_features, "monotonicities")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("signs", torch.tensor(signs, dtype=torch.float32))
        init = nn.Linear(in_features, out_features)
        constrained = self.signs != 0
        raw = init.weight.detach().clone()
        raw[:, constrained] = _inverse_softplus(raw[:, constrained].abs().clamp(min=1e-3))
        self.raw_weight = nn.Parameter(raw)
        self.bias = nn.Parameter(init.bias.detach().clone())

    @property
    def weight(self) -> torch.Tensor:
        signs = self.signs.to(self.raw_weight.dtype)
        return torch.where(signs != 0, signs * F.softplus(self.raw_weight), self.raw_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        check_declared_buffer(self, state_dict, prefix, "signs", "monotonicities")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def check_lattice_size(sizes: Sequence[int], num_lattices: int = 1, what: str = "lattice") -> None:
    """Refuses (ValueError) ``num_lattices`` lattices of ``sizes`` whose tables would pass
    ``MAX_LATTICE_ENTRIES``, counted from the sizes before anything is allocated."""
    dims = len(sizes)
    # Each size is at least 2, so past 64 dimensions the count is not worth computing exactly.
    vertices = math.prod(sizes) if dims <= 64 else None
    entries = None if vertices is None else max(num_lattices * vertices * dims, vertices * 2**dims)
    if entries is None or entries > MAX_LATTICE_ENTRIES:
        shape = (
            f"{dims} dimensions of size {sizes[0]}" if len(set(sizes)) == 1 else f"sizes {list(sizes)[:16]}"
        )
        count = f"{num_lattices:,} lattices" if num_lattices != 1 else "a lattice"
        if entries is None:
            amount = f"over 2^{2 * dims}"
        elif entries < 10**15:
            amount = f"{entries:,}"
        else:
            amount = f"about 10^{len(str(entries)) - 1}"
        raise ValueError(
            f"{what}: {count} of {shape} would build tables of {amount} entries (every vertex's "
            f"coordinates, or each cell's 2^dimensions corners), more than the {MAX_LATTICE_ENTRIES:,} a lattice layer may "
            "build (MAX_LATTICE_ENTRIES); use a smaller lattice size, fewer inputs per lattice or fewer lattices"
        )


class _LatticeBank(nn.Module):
    """``len(monotone)`` lattices of equal sizes, interpolated together in one vectorised pass.

    ``monotone[l][d]`` says whether lattice ``l`` is non-decreasing along dimension ``d``.
    """

    def __init__(self, sizes: Sequence[int], monotone: Sequence[Sequence[bool]], output_min, output_max):
        super().__init__()
        _check_bounds(output_min, output_max)
        self.sizes = tuple(sizes)
        self.output_min, self.output_max = output_min, output_max
        dims = len(self.sizes)
        # Reduce dimensions monotone in some lattice first (see the module docstring).
        self.order = sorted(range(dims), key=lambda d: not any(m[d] for m in monotone))
        # Per dimension, whether some / every lattice is monotone along it (skips selections).
        self._monotone_in_some = [any(m[d] for m in monotone) for d in range(dims)]
        self._monotone_in_all = [all(m[d] for m in monotone) for d in range(dims)]
        strides = [math.prod(self.sizes[d + 1 :]) for d in range(dims)]
        # Flat offsets of the 2^D cell corners; bit D - 1 - k of a corner's position selects the
        # upper side of dimension order[k], so the two halves of the corners differ along order[0].
        offsets = [0]
        for d in reversed(self.order):
            offsets = offsets + [o + strides[d] for o in offsets]
        # Row p of _corner_index lists the corners of the cell whose lowest vertex is p; rows of
        # vertices that start no cell would never be selected and are dropped from the end.
        corner_index = torch.arange(math.prod(self.sizes))[:, None] + torch.tensor(offsets)
        corner_index = corner_index[: math.prod(self.sizes) - offsets[-1]]
        self.register_buffer("_strides", torch.tensor(strides), persistent=False)
        self.register_buffer("_corner_index", corner_index, persistent=False)
        self.register_buffer("_last", torch.tensor(self.sizes) - 1, persistent=False)
        self.register_buffer("_monotone", torch.tensor(monotone, dtype=torch.bool), persistent=False)

        # Start monotone (a ramp over the monotone dimensions, which the monotone fit leaves
        # unchanged) plus small noise along free dimensions only, so the inputs feeding
        # free dimensions get a gradient from the first step.
        coords = torch.stack(
            torch.meshgrid(*[torch.linspace(0.0, 1.0, s) for s in self.sizes], indexing="ij")
        )
        mono = self._monotone.view(-1, dims, *[1] * dims).float()
        count = mono.sum(1)
        ramp = torch.where(count > 0, (mono * coords).sum(1) / count.clamp(min=1), 0.5)
        noise = 0.1 * torch.randn(ramp.shape)
        for d in range(dims):
            first = noise.narrow(d + 1, 0, 1).expand_as(noise)
            noise = torch.where(self._monotone[:, d].view_as(count), first, noise)
        self.raw = nn.Parameter(_initial_raw(ramp, output_min is not None, 0.0, 1.0) + noise)

    def vertex_values(self, dtype: torch.dtype) -> torch.Tensor:
        """Constrained vertex values, shape (num_lattices, *sizes): the bounded free values fitted
        isotonically along each monotone dimension in turn, then a running max along each, the
        identity in real arithmetic that makes monotonicity exact under rounding (module
        docstring). The bounds are an interval, which means, minima and maxima of its points stay in."""
        values = _bound(self.raw.to(dtype), self.output_min, self.output_max)
        for step in (_isotonic, lambda v, d: v.cummax(d).values):
            for d in range(len(self.sizes)):
                if not self._monotone_in_some[d]:
                    continue
                fitted = step(values, d + 1)
                if self._monotone_in_all[d]:
                    values = fitted
                else:
                    values = torch.where(
                        self._monotone[:, d].view(-1, *[1] * len(self.sizes)), fitted, values
                    )
        return values

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Interpolates x of shape (N, num_lattices, D) into (N, num_lattices), compute dtype.

        On the CPU each sample's 2^D cell corners are selected by a product with a one-hot matrix
        rather than by indexing, whose backward (an accumulating index_put) is slow there: the
        product has a single non-zero term, so it returns the vertex values exactly, whatever the
        summation order."""
        dtype = _dtypes(x, self.raw)[1]
        x = x.to(dtype).transpose(0, 1)  # (num_lattices, N, D): one matrix product per lattice
        if len(set(self.sizes)) == 1:  # scalar bounds: one operation each
            x = x.clamp(0, self.sizes[0] - 1)
            cell = x.floor().clamp(max=self.sizes[0] - 2)
        else:
            last = self._last.to(dtype)
            x = torch.minimum(x.clamp(min=0), last)
            cell = torch.minimum(x.floor(), last - 1)
        frac = x - cell
        values = self.vertex_values(dtype).flatten(1)[:, self._corner_index]  # (L, cells, 2^D)
        if values.shape[1] == 1:  # a single cell (all sizes 2): its corners are all vertices
            corners = values  # broadcast against the fractions
        else:
            base = (_cell_index(cell) * self._strides).sum(-1, keepdim=True)
            if x.device.type == "cpu":
                # A comparison, not scatter_: vmap (fit_many's stacked runs) has no batching rule
                # for scatter_ with a scalar and would loop over the runs.
                cells = torch.arange(values.shape[1], device=x.device)
                one_hot = (base == cells).to(values.dtype)
                corners = torch.bmm(one_hot, values)  # (L, N, 2^D)
            else:  # GPU matrix products may round to TF32; indexing is exact and fast there
                lattice = torch.arange(values.shape[0], device=x.device)[:, None]
                corners = values[lattice, base[..., 0]]
        complement = 1 - frac
        for k, d in enumerate(self.order):
            half = corners.shape[-1] // 2
            low, high, f = corners[..., :half], corners[..., half:], frac[..., d : d + 1]
            # First: monotone in f under rounding, exact in each lattice's first monotone
            # dimension. Then monotone in low and high under rounding, keeping that exactness.
            corners = _lerp(low, high, f) if k == 0 else complement[..., d : d + 1] * low + f * high
        # Contiguous: a mean over a transposed layout sums some rows in another order, which
        # could round a monotone ensemble's average down by an ulp (found by a property test).
        return corners[..., 0].T.contiguous()


class _InputFlip(nn.Module):
    """``size - 1 - x`` on the decreasing inputs, in the compute dtype; the identity (and no
    work) when none is decreasing. NaN stays NaN and an infinity changes sign, to be clamped."""

    def __init__(self, sizes: Sequence[int], monotonicities: Sequence[int]):
        super().__init__()
        self.active = any(m < 0 for m in monotonicities)
        self.register_buffer("_decreasing", torch.tensor([m < 0 for m in monotonicities]), persistent=False)
        self.register_buffer("_last", torch.tensor(sizes) - 1, persistent=False)

    def forward(self, x: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return x
        x = x.to(_dtypes(x, param)[1])
        return torch.where(self._decreasing, self._last.to(x.dtype) - x, x)


class Lattice(nn.Module):
    """Multilinear interpolation over a grid of learned vertex values.

    Input (N, D) with dimension d in [0, lattice_sizes[d] - 1] (clamped outside); output (N,).
    ``monotonicities[d]`` is 1 ("increasing") for non-decreasing along d, -1 ("decreasing") for
    non-increasing, 0 (None) for free. A decreasing input is flipped, ``lattice_sizes[d] - 1 -
    x``, into an increasing dimension (rounding is monotone, so the flip is non-increasing under
    rounding and every guarantee below carries over). With ``output_min`` and
    ``output_max`` the vertex values, hence the outputs, stay inside the bounds. Monotone under
    rounding in the first monotone dimension, up to a stated rounding bound in the others (module
    docstring). Each sample costs 2^D
    corners and parameters grow as prod(lattice_sizes): for more than a handful of inputs use
    :class:`LatticeEnsemble`.
    """

    def __init__(
        self,
        lattice_sizes: Sequence[int],
        monotonicities: Sequence[int],
        output_min: Optional[float] = None,
        output_max: Optional[float] = None,
    ):
        super().__init__()
        sizes = [int(s) for s in lattice_sizes]
        if not sizes or min(sizes) < 2:
            raise ValueError(f"lattice_sizes must be a non-empty list of ints >= 2, got {sizes}")
        check_lattice_size(sizes, 1, "Lattice")
        mono = _check_monotonicities(monotonicities, (-1, 0, 1), len(sizes), "monotonicities")
        self.lattice_sizes, self.monotonicities = tuple(sizes), tuple(mono)
        self.bank = _LatticeBank(sizes, [[m != 0 for m in mono]], output_min, output_max)
        self.flip = _InputFlip(sizes, mono)

    def vertex_values(self) -> torch.Tensor:
        """Constrained vertex values, shape lattice_sizes, indexed by the inputs as given (a
        decreasing dimension's flip undone)."""
        values = self.bank.vertex_values(torch.promote_types(self.bank.raw.dtype, torch.float32))[0]
        decreasing = [d for d, m in enumerate(self.monotonicities) if m < 0]
        return values.flip(decreasing) if decreasing else values

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_inputs(x, len(self.lattice_sizes), "Lattice input")
        return self.bank(self.flip(x, self.bank.raw)[:, None, :])[:, 0].to(_dtypes(x, self.bank.raw)[0])


def _draw_subsets(
    num_inputs: int, rank: int, count: int, mono: Sequence[int], seed: int, distinct: bool = True
) -> torch.Tensor:
    """``count`` subsets of ``rank`` inputs, shape (count, rank), monotone inputs first in each.

    Each subset takes the least-used inputs, ties broken at random from ``seed``, so uses stay
    balanced and every input is used once ``count * rank >= num_inputs``. When those inputs form
    a subset drawn before, the next combination of inputs in that order that is new replaces it
    (the most-used input swapped for the next least-used, as pytorch-lattice's RTL swaps), which
    only happens once every input is used, so coverage holds. ``distinct=False`` gives the draws
    made before this rule, with repeats, which states saved then hold.
    """
    generator = torch.Generator().manual_seed(seed)
    uses = torch.zeros(num_inputs)
    drawn: set = set()
    subsets = []
    for _ in range(count):
        order = (uses + torch.rand(num_inputs, generator=generator)).argsort().tolist()
        candidates = (
            tuple(sorted(order[p] for p in positions))
            for positions in itertools.combinations(range(num_inputs), rank)
        )
        # At most len(drawn) + 1 candidates are looked at; none is new only when every subset is drawn.
        new = next((c for c in candidates if c not in drawn), None) if distinct else None
        chosen = new or tuple(sorted(order[:rank]))
        drawn.add(chosen)
        uses[list(chosen)] += 1
        subsets.append(sorted(chosen, key=lambda i: (-abs(mono[i]), i)))
    return torch.tensor(subsets)


class LatticeEnsemble(nn.Module):
    """Average of ``num_lattices`` lattices of rank ``lattice_rank`` over subsets of the inputs.

    Subsets come from ``seed`` (deterministic, independent of the global RNG), balance how often
    each input is used, so every input appears in at least one lattice, and are distinct whenever
    ``num_lattices`` distinct subsets exist (a repeated subset would only repeat a lattice); a
    state saved when subsets could repeat still loads, with its own subsets. A monotone input (1 or
    -1, as for :class:`Lattice`) is monotone-declared in every lattice that sees it, and an
    average of functions that are each monotone (or constant) in an input is monotone in it.
    Each subset lists its monotone inputs first: that is the dimension each lattice keeps
    exactly monotone under rounding.
    """

    def __init__(
        self,
        num_inputs: int,
        lattice_rank: int,
        num_lattices: int,
        lattice_size: int,
        monotonicities: Sequence[int],
        seed: int = 0,
        output_min: Optional[float] = None,
        output_max: Optional[float] = None,
    ):
        super().__init__()
        if lattice_size < 2:
            raise ValueError(f"lattice_size must be >= 2, got {lattice_size}")
        if not 1 <= lattice_rank <= num_inputs:
            raise ValueError(f"lattice_rank must be in [1, num_inputs={num_inputs}], got {lattice_rank}")
        if num_lattices * lattice_rank < num_inputs:
            raise ValueError(
                f"num_lattices * lattice_rank = {num_lattices * lattice_rank} cannot cover {num_inputs} inputs"
            )
        check_lattice_size([lattice_size] * lattice_rank, num_lattices, "LatticeEnsemble")
        mono = _check_monotonicities(monotonicities, (-1, 0, 1), num_inputs, "monotonicities")
        self.num_inputs, self.monotonicities = num_inputs, tuple(mono)
        self._draw = functools.partial(_draw_subsets, num_inputs, lattice_rank, num_lattices, mono, seed)
        self.register_buffer("input_index", self._draw())
        self.bank = _LatticeBank(
            [lattice_size] * lattice_rank, self._monotone_dimensions(), output_min, output_max
        )
        self.flip = _InputFlip([lattice_size] * num_inputs, mono)

    def _monotone_dimensions(self) -> List[List[bool]]:
        return [[self.monotonicities[i] != 0 for i in subset] for subset in self.input_index.tolist()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_inputs(x, self.num_inputs, "LatticeEnsemble input")
        inputs = self.flip(x, self.bank.raw)
        return self.bank(inputs[:, self.input_index]).mean(1).to(_dtypes(x, self.bank.raw)[0])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The lattices' monotone dimensions follow from input_index at construction.
        loaded = state_dict.get(prefix + "input_index")
        if isinstance(loaded, torch.Tensor) and not torch.equal(loaded.cpu(), self.input_index.cpu()):
            legacy = self._draw(distinct=False)
            if torch.equal(loaded.cpu(), legacy):
                # Saved before subsets were made distinct, from the same arguments: keep its
                # subsets (and this bank's parameter, which an optimizer may already hold).
                self.input_index = legacy.to(self.input_index.device)
                raw, bank = self.bank.raw, self.bank
                with torch.random.fork_rng(devices=[]):  # loading must not move the global RNG
                    self.bank = _LatticeBank(
                        bank.sizes, self._monotone_dimensions(), bank.output_min, bank.output_max
                    )
                self.bank.to(raw.device)
                self.bank.raw = raw
        check_declared_buffer(self, state_dict, prefix, "input_index", "input subsets")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


@torch.no_grad()
def check_monotone(
    model: nn.Module,
    images: torch.Tensor,
    monotone_inputs: torch.Tensor,
    num_steps: int = 32,
    sweep_range: Optional[Tuple[float, float]] = None,
) -> float:
    """Largest decrease of ``model(images, monotone_inputs)`` as one monotone input sweeps upward.

    Each column in turn takes ``num_steps`` increasing values over ``sweep_range`` (default: the
    column's observed range widened by half its span on each side, to cover the clamped regions)
    while the other columns keep theirs, for every image. Runs in eval mode, restoring the mode
    after. A :class:`~fastload.train.MonotonicRegressor` computes its image features once, so the sweep costs one
    backbone pass and backbone nondeterminism cannot pose as a violation. Returns 0.0 for a
    monotone model; see the module docstring for when rounding may give a tiny positive value.
    Raises ValueError if any swept output is NaN or infinite: such outputs compare as neither
    larger nor smaller, so they would otherwise pass as monotone.
    """
    if monotone_inputs.dim() != 2 or monotone_inputs.shape[0] != images.shape[0]:
        raise ValueError(
            f"monotone_inputs must have shape (N={images.shape[0]}, M), got {tuple(monotone_inputs.shape)}"
        )
    if num_steps < 2:
        raise ValueError(f"num_steps must be >= 2, got {num_steps}")
    was_training = model.training
    model.eval()
    try:
        # A model split into image features and a monotone head (fastload.train's
        # MonotonicRegressor) computes the features once for the whole sweep.
        if hasattr(model, "image_features") and hasattr(model, "head"):
            predict = functools.partial(model.head, model.image_features(images))
        else:
            predict = functools.partial(model, images)
        worst = 0.0
        for j in range(monotone_inputs.shape[1]):
            if sweep_range is None:
                low, high = monotone_inputs[:, j].min().item(), monotone_inputs[:, j].max().item()
                pad = max(high - low, 1.0) / 2
                low, high = low - pad, high + pad
            else:
                low, high = sweep_range
            outputs = []
            for value in torch.linspace(low, high, num_steps).tolist():
                swept = monotone_inputs.clone()
                swept[:, j] = value
                outputs.append(predict(swept).float())
            outputs = torch.stack(outputs)
            bad = (~torch.isfinite(outputs)).sum().item()
            if bad:
                raise ValueError(
                    f"check_monotone: {bad} of {outputs.numel()} outputs are NaN or infinite while "
                    f"sweeping monotone input {j} over [{low:g}, {high:g}]; monotonicity cannot be "
                    "checked (non-finite parameters? see check_finite_parameters)"
                )
            worst = max(worst, (outputs[:-1] - outputs[1:]).max().clamp(min=0).item())
        return worst
    finally:
        model.train(was_training)


def check_finite_parameters(module: nn.Module) -> None:
    """Raises ValueError naming every parameter of ``module`` holding NaN or infinite values.

    A diverged optimizer step leaves such values without any error, and from then on the model
    predicts NaN; a training loop calls this after its steps (it waits for the device) so a run
    stops there instead of training and checkpointing a broken model.
    """
    params = [(name, p) for name, p in module.named_parameters() if p.is_floating_point()]
    if not params:
        return
    counts = torch.stack([(~torch.isfinite(p.detach())).sum() for _, p in params]).tolist()
    bad = [f"{name} ({count} of {p.numel()})" for (name, p), count in zip(params, counts) if count]
    if bad:
        raise ValueError(
            f"non-finite parameters (NaN or infinite values) in {', '.join(bad)}: training diverged; "
            "lower the learning rate or resume from an earlier checkpoint"
        )
