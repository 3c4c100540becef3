"""Lattices: multilinear interpolation over a grid of learned vertex values, monotone along the
declared inputs by construction. :class:`Lattice` is one lattice over all its inputs,
:class:`LatticeEnsemble` the average of lattices over subsets of them; both interpolate through
one vectorised bank of lattices. Tables are sized before anything is allocated
(:func:`check_lattice_size`). The vertex map (an isotonic fit, then a running max) and the
rounding bound it gives are stated in :mod:`fastload.monotonic.constraints`."""

from __future__ import annotations

import functools
import itertools
import math
from typing import List, Optional, Sequence

import torch
from torch import nn

from fastload.monotonic.constraints import (
    cell_index,
    check_bounds,
    check_declared_buffer,
    check_inputs,
    check_monotonicities,
    initial_raw,
    into_bounds,
    monotone_lerp,
    output_and_compute_dtypes,
)

__all__ = ["MAX_LATTICE_ENTRIES", "Lattice", "LatticeEnsemble", "check_lattice_size", "isotonic_fit"]

# The most entries a lattice layer may build in one table: every vertex's coordinates while it
# is initialised (num_lattices x prod(sizes) x D) or the index of each cell's 2^D corners
# (prod(sizes) x 2^D, int64). At the limit that is a 128 MB index, or at most 4M float32 vertex
# values (64 MB with their gradient and AdamW's moments): far beyond any lattice that trains,
# and refused before anything is allocated.
MAX_LATTICE_ENTRIES = 2**24


def isotonic_fit(values: torch.Tensor, dim: int) -> torch.Tensor:
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

    def __init__(
        self,
        sizes: Sequence[int],
        monotone: Sequence[Sequence[bool]],
        output_min,
        output_max,
        parameter_scale: float = 1.0,
    ):
        super().__init__()
        check_bounds(output_min, output_max)
        if not parameter_scale > 0:
            raise ValueError(f"parameter_scale must be > 0, got {parameter_scale}")
        self.parameter_scale = float(parameter_scale)
        self.sizes = tuple(sizes)
        self.output_min, self.output_max = output_min, output_max
        dims = len(self.sizes)
        # Reduce dimensions monotone in some lattice first (see fastload.monotonic.constraints).
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
        self.raw = nn.Parameter(
            (initial_raw(ramp, output_min is not None, 0.0, 1.0) + noise) / self.parameter_scale
        )

    def vertex_values(self, dtype: torch.dtype) -> torch.Tensor:
        """Constrained vertex values, shape (num_lattices, *sizes): the bounded free values fitted
        isotonically along each monotone dimension in turn, then a running max along each, the
        identity in real arithmetic that makes monotonicity exact under rounding
        (:mod:`fastload.monotonic.constraints`). The free values are ``parameter_scale`` times
        the parameter ``raw``. The bounds are an interval, which means, minima and maxima of its points stay in."""
        raw = self.raw.to(dtype)
        if self.parameter_scale != 1.0:
            raw = raw * self.parameter_scale
        values = into_bounds(raw, self.output_min, self.output_max)
        for step in (isotonic_fit, lambda v, d: v.cummax(d).values):
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
        dtype = output_and_compute_dtypes(x, self.raw)[1]
        # (num_lattices, D, N): samples last, so every operation below runs along contiguous
        # samples (the same elementwise operations, hence the same values, in any layout).
        x = x.to(dtype).permute(1, 2, 0)
        if len(set(self.sizes)) == 1:  # scalar bounds: one operation each
            x = x.clamp(0, self.sizes[0] - 1)
            cell = x.floor().clamp(max=self.sizes[0] - 2)
        else:
            last = self._last.to(dtype)[:, None]
            x = torch.minimum(x.clamp(min=0), last)
            cell = torch.minimum(x.floor(), last - 1)
        frac = x - cell
        values = self.vertex_values(dtype).flatten(1)[:, self._corner_index]  # (L, cells, 2^D)
        if values.shape[1] == 1:  # a single cell (all sizes 2): its corners are all vertices
            corners = values.transpose(1, 2)  # (L, 2^D, 1), broadcast against the fractions
        else:
            base = (cell_index(cell) * self._strides[:, None]).sum(1, keepdim=True)  # (L, 1, N)
            if x.device.type == "cpu":
                # A comparison, not scatter_: vmap (fit_many's stacked runs) has no batching rule
                # for scatter_ with a scalar and would loop over the runs.
                cells = torch.arange(values.shape[1], device=x.device)[:, None]
                one_hot = (base == cells).to(values.dtype)  # (L, cells, N)
                corners = torch.bmm(values.transpose(1, 2), one_hot)  # (L, 2^D, N)
            else:  # GPU matrix products may round to TF32; indexing is exact and fast there
                lattice = torch.arange(values.shape[0], device=x.device)[:, None]
                corners = values[lattice, base[:, 0]].transpose(1, 2)
        complement = 1 - frac
        for k, d in enumerate(self.order):
            half = corners.shape[1] // 2
            low, high, f = corners[:, :half], corners[:, half:], frac[:, d : d + 1]
            # First: monotone in f under rounding, exact in each lattice's first monotone
            # dimension. Then monotone in low and high under rounding, keeping that exactness.
            corners = monotone_lerp(low, high, f) if k == 0 else complement[:, d : d + 1] * low + f * high
        # Contiguous: a mean over a transposed layout sums some rows in another order, which
        # could round a monotone ensemble's average down by an ulp (found by a property test).
        return corners[:, 0].T.contiguous()


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
        x = x.to(output_and_compute_dtypes(x, param)[1])
        return torch.where(self._decreasing, self._last.to(x.dtype) - x, x)


class Lattice(nn.Module):
    """Multilinear interpolation over a grid of learned vertex values.

    Input (N, D) with dimension d in [0, lattice_sizes[d] - 1] (clamped outside); output (N,).
    ``monotonicities[d]`` is 1 ("increasing") for non-decreasing along d, -1 ("decreasing") for
    non-increasing, 0 (None) for free. A decreasing input is flipped, ``lattice_sizes[d] - 1 -
    x``, into an increasing dimension (rounding is monotone, so the flip is non-increasing under
    rounding and every guarantee below carries over). With ``output_min`` and
    ``output_max`` the vertex values, hence the outputs, stay inside the bounds. Monotone under
    rounding in the first monotone dimension, up to a stated rounding bound in the others
    (:mod:`fastload.monotonic.constraints`). Each sample costs 2^D
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
        mono = check_monotonicities(monotonicities, (-1, 0, 1), len(sizes), "monotonicities")
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
        return self.bank(self.flip(x, self.bank.raw)[:, None, :])[:, 0].to(
            output_and_compute_dtypes(x, self.bank.raw)[0]
        )


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

    ``parameter_scale``: the vertex values are this times the parameters (inside the squashing
    into the bounds, when bounded); the function at initialization is the same, up to rounding. Why: in an
    average of L lattices each vertex gets 1/L of the gradient that an input's calibrator gets,
    and L-BFGS converges slowly on such unequal scales; the table estimators pass L (24 features,
    12 lattices: 23 iterations instead of 63 and a 10x lower test error, benches/RESULTS.md).
    Adam, which the image models train with, adapts each parameter's step itself: they keep 1.
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
        parameter_scale: float = 1.0,
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
        mono = check_monotonicities(monotonicities, (-1, 0, 1), num_inputs, "monotonicities")
        self.num_inputs, self.monotonicities = num_inputs, tuple(mono)
        self._draw = functools.partial(_draw_subsets, num_inputs, lattice_rank, num_lattices, mono, seed)
        self.register_buffer("input_index", self._draw())
        self.bank = _LatticeBank(
            [lattice_size] * lattice_rank,
            self._monotone_dimensions(),
            output_min,
            output_max,
            parameter_scale,
        )
        self.flip = _InputFlip([lattice_size] * num_inputs, mono)

    def _monotone_dimensions(self) -> List[List[bool]]:
        return [[self.monotonicities[i] != 0 for i in subset] for subset in self.input_index.tolist()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_inputs(x, self.num_inputs, "LatticeEnsemble input")
        inputs = self.flip(x, self.bank.raw)
        # index_select, not indexing: the same values, and a much cheaper backward on the CPU.
        subsets = inputs.index_select(1, self.input_index.flatten()).view(len(x), *self.input_index.shape)
        return self.bank(subsets).mean(1).to(output_and_compute_dtypes(x, self.bank.raw)[0])

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
                        bank.sizes,
                        self._monotone_dimensions(),
                        bank.output_min,
                        bank.output_max,
                        bank.parameter_scale,
                    )
                self.bank.to(raw.device)
                self.bank.raw = raw
        check_declared_buffer(self, state_dict, prefix, "input_index", "input subsets")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
