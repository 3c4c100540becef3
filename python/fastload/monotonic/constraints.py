"""How the monotone layers stay monotone: the maps from free parameters to constrained values
that :mod:`~fastload.monotonic.calibrators`, :mod:`~fastload.monotonic.linear` and
:mod:`~fastload.monotonic.lattice` build on, the guarantees they give (rounding included), and
the checks ``check_monotone`` and ``check_finite_parameters``.

Shape-constrained models let a user state "the prediction never goes down when this input goes
up" and have it hold for every input, not just on the training data. Every layer of
:mod:`fastload.monotonic` is plain PyTorch and works on any device and in float32, float64 or bfloat16.

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
push past ``b`` into the next cell (see :func:`monotone_lerp`). A lattice reduces its cell
corners one dimension at a time: its first monotone dimension first, in that same form, then every other one
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
from typing import List, Optional, Tuple

import torch
from torch import nn

__all__ = [
    "CURVATURES",
    "DIRECTIONS",
    "as_direction",
    "cell_index",
    "check_bounds",
    "check_declared_buffer",
    "check_finite_parameters",
    "check_inputs",
    "check_monotone",
    "check_monotonicities",
    "initial_raw",
    "into_bounds",
    "inverse_softplus",
    "monotone_lerp",
    "output_and_compute_dtypes",
]

# Bounded modules start with outputs covering this central part of (output_min, output_max),
# away from the flat tails of the sigmoid.
_INIT_LOW, _INIT_HIGH = 0.1, 0.9


def check_bounds(output_min: Optional[float], output_max: Optional[float]) -> None:
    if (output_min is None) != (output_max is None):
        raise ValueError("output_min and output_max must be given together")
    if output_min is not None and not output_min < output_max:
        raise ValueError(f"output_min ({output_min}) must be < output_max ({output_max})")


def into_bounds(raw: torch.Tensor, output_min: Optional[float], output_max: Optional[float]) -> torch.Tensor:
    """Increasing map from free values into (output_min, output_max), or the identity."""
    if output_min is None:
        return raw
    return output_min + (output_max - output_min) * torch.sigmoid(raw)


def initial_raw(fraction: torch.Tensor, bounded: bool, low: float, high: float) -> torch.Tensor:
    """Free values whose image under into_bounds is the ramp ``fraction`` (in [0, 1]) placed in the
    middle of the bounds, or spread over [low, high] when unbounded."""
    if bounded:
        return torch.logit(_INIT_LOW + (_INIT_HIGH - _INIT_LOW) * fraction)
    return low + (high - low) * fraction


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def output_and_compute_dtypes(x: torch.Tensor, param: torch.Tensor) -> Tuple[torch.dtype, torch.dtype]:
    """(output dtype, compute dtype): usual type promotion, computed in at least float32."""
    out = torch.promote_types(x.dtype, param.dtype)
    return out, torch.promote_types(out, torch.float32)


def monotone_lerp(a: torch.Tensor, b: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
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


DIRECTIONS = {"increasing": 1, "decreasing": -1, "none": 0, None: 0}
CURVATURES = {"convex": 1, "concave": -1, "none": 0, None: 0}


def as_direction(value, words=DIRECTIONS):
    """-1, 0 or 1 from the number itself or its name ("increasing", "decreasing", None; "convex",
    "concave" for ``words=CURVATURES``), else ``value`` unchanged for the caller's error."""
    if isinstance(value, str) or value is None:
        return words.get(value.lower() if isinstance(value, str) else value, value)
    return int(value) if isinstance(value, (int, float)) and int(value) == value else value


def check_monotonicities(values, allowed: Tuple[int, ...], length: int, name: str) -> List[int]:
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


def cell_index(cell: torch.Tensor) -> torch.Tensor:
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
