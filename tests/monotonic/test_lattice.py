"""Tests for fastload.monotonic.lattice: Lattice and LatticeEnsemble are monotone for any
parameters (exactly in the first monotone input, within the stated rounding bound in the
others), interpolate their vertices, give every parameter a gradient, draw distinct subsets,
and refuse tables past the size limit before building them."""

from __future__ import annotations

import functools
import itertools
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from monotone_helpers import (
    PROPERTY,
    SCALES,
    assert_nondecreasing,
    base_points,
    exact_columns,
    one_thread,  # noqa: F401 (an autouse fixture)
    randomize,
    rounding_bound,
    sweep,
    sweep_values,
)
from sklearn.isotonic import IsotonicRegression
from torch import nn

import fastload.monotonic.lattice as lattice_module
from fastload.monotonic import Lattice, LatticeEnsemble
from fastload.monotonic.lattice import check_lattice_size, isotonic_fit
from fastload.train.models import MonotonicRegressor


@PROPERTY
@given(
    sizes=st.lists(st.integers(2, 4), min_size=1, max_size=3),
    data=st.data(),
    bounded=st.booleans(),
    scale=SCALES,
    seed=st.integers(0, 2**16),
)
def test_lattice_is_monotone_for_any_parameters(sizes, data, bounded, scale, seed):
    mono = data.draw(st.lists(st.integers(-1, 1), min_size=len(sizes), max_size=len(sizes)))
    lattice = Lattice(sizes, mono, *((0.0, 1.0) if bounded else (None, None)))
    randomize(lattice, seed, scale)
    generator = torch.Generator().manual_seed(seed)
    base = base_points(sizes, 8, generator)
    with torch.no_grad():
        for d in (d for d, m in enumerate(mono) if m):
            y = sweep(lattice, base, d, sweep_values(-1, sizes[d], generator))
            assert_nondecreasing(mono[d] * y, eps=0.0 if d in exact_columns(lattice) else 1e-5)


@PROPERTY
@given(
    num_inputs=st.integers(2, 6),
    data=st.data(),
    lattice_size=st.integers(2, 3),
    scale=SCALES,
    seed=st.integers(0, 2**16),
)
def test_ensemble_is_monotone_for_any_parameters(num_inputs, data, lattice_size, scale, seed):
    rank = data.draw(st.integers(1, min(3, num_inputs)))
    count = math.ceil(num_inputs / rank) + data.draw(st.integers(0, 2))
    mono = data.draw(st.lists(st.integers(-1, 1), min_size=num_inputs, max_size=num_inputs))
    ensemble = LatticeEnsemble(num_inputs, rank, count, lattice_size, mono, seed=seed)
    randomize(ensemble, seed, scale)
    generator = torch.Generator().manual_seed(seed)
    base = base_points([lattice_size] * num_inputs, 8, generator)
    values = sweep_values(-1, lattice_size, generator)
    with torch.no_grad():
        for d in (d for d, m in enumerate(mono) if m):
            y = sweep(ensemble, base, d, values)
            assert_nondecreasing(mono[d] * y, eps=0.0 if d in exact_columns(ensemble) else 1e-5)


def test_bounded_lattice_first_monotone_input_is_exact_for_200_seeds():
    """torch.sigmoid rounds its vectorised body and its tail differently; applied after the
    monotone fit it split their exact ties and 29 of these 200 lattices decreased by up to 6e-8."""
    values = torch.linspace(-0.1, 2.1, 301)
    worst = 0.0
    for seed in range(200):
        torch.manual_seed(seed)
        lattice = Lattice([3, 3, 3, 3], [1, 0, 0, 0], 0.0, 1.0)
        generator = torch.Generator().manual_seed(seed)
        base = base_points([3] * 4, 64, generator)
        with torch.no_grad():
            lattice.bank.raw.copy_(3 * torch.randn(lattice.bank.raw.shape, generator=generator))
            y = sweep(lattice, base, 0, values)
        worst = max(worst, (y[:-1] - y[1:]).max().item())
    assert worst <= 0.0


def _worst_decrease(module: nn.Module, sizes, columns, dtype, generator) -> float:
    base = base_points(sizes, 16, generator).to(dtype)
    worst = 0.0
    with torch.no_grad():
        for d in columns:
            y = sweep(module, base, d, sweep_values(-1, sizes[d], generator).to(dtype))
            worst = max(worst, (y[:-1] - y[1:]).max().item())
    return worst


@PROPERTY
@given(
    rank=st.integers(2, 4),
    size=st.integers(2, 3),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    scale=st.sampled_from([1.0, 1e4, 8e6, 1e30]),
    seed=st.integers(0, 2**16),
)
def test_later_monotone_inputs_stay_within_the_rounding_bound(rank, size, dtype, scale, seed):
    """All inputs monotone, vertex values huge and of both signs, so outputs cancel."""
    lattice = Lattice([size] * rank, [1] * rank).to(dtype)
    randomize(lattice, seed, scale)
    worst = _worst_decrease(
        lattice, [size] * rank, range(1, rank), dtype, torch.Generator().manual_seed(seed)
    )
    assert worst <= rounding_bound(lattice, dtype)


@PROPERTY
@given(
    num_inputs=st.integers(3, 6),
    scale=st.sampled_from([1.0, 8e6, 1e30]),
    seed=st.integers(0, 2**16),
    parameter_scale=st.sampled_from([1.0, 6.0]),
)
def test_ensemble_later_monotone_inputs_stay_within_the_rounding_bound(
    num_inputs, scale, seed, parameter_scale
):
    ensemble = LatticeEnsemble(
        num_inputs, 3, num_inputs, 3, [1] * num_inputs, seed=seed, parameter_scale=parameter_scale
    )
    randomize(ensemble, seed, scale)
    generator = torch.Generator().manual_seed(seed)
    worst = _worst_decrease(ensemble, [3] * num_inputs, range(num_inputs), torch.float32, generator)
    assert worst <= rounding_bound(ensemble)


@pytest.mark.parametrize("bounds", [(None, None), (0.0, 1.0)])
def test_a_parameter_scale_keeps_the_initial_function_and_scales_the_parameters(bounds):
    """The table estimators' ensembles scale their vertex parameters by the lattice count: the
    same function to start from, the parameters that much smaller, so each step moves the
    vertices that much more."""
    torch.manual_seed(0)  # the initial noise comes from the global RNG
    plain = LatticeEnsemble(6, 3, 4, 2, [1, -1, 0, 1, 0, 0], 7, *bounds)
    torch.manual_seed(0)
    scaled = LatticeEnsemble(6, 3, 4, 2, [1, -1, 0, 1, 0, 0], 7, *bounds, parameter_scale=4.0)
    x = torch.rand(200, 6)
    torch.testing.assert_close(scaled(x), plain(x))
    torch.testing.assert_close(scaled.bank.raw * 4.0, plain.bank.raw)
    # The same parameters mean four times the free values (inside the squashing when bounded).
    with torch.no_grad():
        scaled.bank.raw.copy_(plain.bank.raw)
        plain.bank.raw.mul_(4.0)
    torch.testing.assert_close(
        scaled.bank.vertex_values(torch.float32), plain.bank.vertex_values(torch.float32)
    )
    with pytest.raises(ValueError, match="parameter_scale must be > 0"):
        LatticeEnsemble(6, 3, 4, 2, [1] * 6, parameter_scale=0.0)


def test_rounding_bound_holds_after_large_step_training():
    """Adam at lr=1e6 drives vertex values to ~1e7, where a later input once lost 16 ulp."""
    torch.manual_seed(0)
    lattice = Lattice([3, 3, 3, 3], [1, 1, 1, 1])
    opt = torch.optim.Adam(lattice.parameters(), lr=1e6)
    for _ in range(20):
        x = 2 * torch.rand(256, 4)
        loss = -(lattice(x) * torch.randn(256)).mean()  # pushes vertices every which way
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert lattice.vertex_values().abs().max() > 1e6
    worst = _worst_decrease(lattice, [3] * 4, range(1, 4), torch.float32, torch.Generator().manual_seed(0))
    assert worst <= rounding_bound(lattice)


@pytest.mark.parametrize("bounds", [(None, None), (0.0, 1.0)])
def test_lattice_passes_through_vertices(bounds):
    sizes = [3, 2, 4]
    lattice = Lattice(sizes, [1, 0, 1], *bounds)
    randomize(lattice, seed=0, scale=1.0)
    vertices = torch.tensor(list(itertools.product(*map(range, sizes))), dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(lattice(vertices), lattice.vertex_values().flatten())


def test_lattice_matches_bilinear_formula():
    lattice = Lattice([3, 4], [1, 1])
    randomize(lattice, seed=1, scale=1.0)
    x = torch.tensor([[0.3, 2.6], [1.5, 0.2], [2.0, 1.9]])
    with torch.no_grad():
        v = lattice.vertex_values()
        expected = []
        for a, b in x.tolist():
            i, j = min(int(a), 1), min(int(b), 2)
            fa, fb = a - i, b - j
            expected.append(
                (1 - fa) * (1 - fb) * v[i, j]
                + fa * (1 - fb) * v[i + 1, j]
                + (1 - fa) * fb * v[i, j + 1]
                + fa * fb * v[i + 1, j + 1]
            )
        torch.testing.assert_close(lattice(x), torch.stack(expected))


def test_lattice_parametrization_is_identity_on_monotone_lattices():
    """Any monotone lattice is reachable: the monotone fit leaves an already monotone one unchanged."""
    lattice = Lattice([3, 4, 2], [1, 0, 1])
    values = torch.randn(3, 4, 2).cummax(0).values.cummax(2).values
    with torch.no_grad():
        lattice.bank.raw.copy_(values[None])
    torch.testing.assert_close(lattice.vertex_values().detach(), values)


@PROPERTY
@given(
    values=st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=12),
)
def test_isotonic_fit_matches_sklearn(values):
    """The lattice's monotone fit is the least-squares isotonic regression, non-decreasing."""
    y = torch.tensor(values, dtype=torch.float64)
    fit = isotonic_fit(y[None], 1)[0]
    expected = IsotonicRegression().fit_transform(np.arange(len(values)), np.array(values))
    np.testing.assert_allclose(fit.numpy(), expected, rtol=1e-9, atol=1e-9)
    assert (fit.diff() >= 0).all()


@pytest.mark.parametrize(
    "module",
    [
        Lattice([3, 4, 3], [1, 0, 1]),
        Lattice([3, 3], [1, 1], 0.0, 1.0),
        LatticeEnsemble(5, 3, 4, 3, [1, 1, 0, 1, 0]),
    ],
    ids=["lattice", "bounded", "ensemble"],
)
def test_every_lattice_parameter_gets_gradient(module):
    """Random (far from monotone) free values: the running max and min used before passed gradient
    only to their records (36% of the first lattice's values got none); the isotonic fit reaches
    each one."""
    randomize(module, seed=5, scale=3.0)
    generator = torch.Generator().manual_seed(5)
    bank = module.bank
    weights = torch.randn(bank.raw.shape, generator=generator)
    (bank.vertex_values(torch.float32) * weights).sum().backward()
    assert (bank.raw.grad != 0).all(), f"{(bank.raw.grad == 0).sum().item()} values got no gradient"


def test_lattice_can_represent_max():
    """max(a, b) is monotone but submodular, out of reach of chained cumulative sums."""
    lattice = Lattice([2, 2], [1, 1])
    with torch.no_grad():
        lattice.bank.raw.copy_(torch.tensor([[[0.0, 1.0], [1.0, 1.0]]]))
        corners = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
        torch.testing.assert_close(lattice(corners), torch.tensor([0.0, 1.0, 1.0, 1.0]))


def test_lattice_clamps_outside_the_domain():
    lattice = Lattice([3, 3], [1, 0])
    randomize(lattice, seed=2, scale=1.0)
    with torch.no_grad():
        inside = lattice(torch.tensor([[0.0, 2.0], [2.0, 0.0], [1.0, 1.5]]))
        outside = lattice(torch.tensor([[-5.0, 9.0], [7.0, -0.5], [1.0, 1.5]]))
    torch.testing.assert_close(outside, inside)


def test_lattice_is_exactly_monotone_on_a_dense_sweep():
    """Its first monotone input never lowers the output, even by a rounding error."""
    lattice = Lattice([3, 3, 3, 3], [0, 0, 1, 1], 0.0, 1.0)
    randomize(lattice, seed=3, scale=1.0)
    generator = torch.Generator().manual_seed(3)
    base = base_points([3] * 4, 32, generator)
    values = torch.linspace(-0.1, 2.1, 2001)
    with torch.no_grad():
        assert_nondecreasing(sweep(lattice, base, 2, values), eps=0.0)
        assert_nondecreasing(sweep(lattice, base, 3, values), eps=1e-5)


def test_ensemble_uses_every_input_and_is_deterministic():
    mono = [1, 0, 0, 1, 0, 1, 0]
    ensemble = LatticeEnsemble(7, 3, 5, 3, mono, seed=4)
    index = ensemble.input_index
    assert sorted(set(index.flatten().tolist())) == list(range(7))
    assert all(len(set(row)) == 3 for row in index.tolist())
    assert torch.equal(index, LatticeEnsemble(7, 3, 5, 3, mono, seed=4).input_index)
    assert torch.equal(ensemble.bank._monotone, torch.tensor(mono, dtype=torch.bool)[index])
    # Monotone inputs come first in each lattice: that one is exactly monotone under rounding.
    assert all(row == sorted(row, key=lambda i: (-abs(mono[i]), i)) for row in index.tolist())


def test_ensemble_of_the_issue_draws_four_distinct_subsets():
    """LatticeEnsemble(8, 4, 4, ...) with seed 0 drew [2, 3, 4, 6] and [0, 1, 5, 7] twice each."""
    rows = LatticeEnsemble(8, 4, 4, 3, [1, 1, 1, -1, 0, 0, 0, 0], seed=0).input_index.tolist()
    assert len({frozenset(row) for row in rows}) == 4, rows


@PROPERTY
@given(num_inputs=st.integers(1, 8), data=st.data(), seed=st.integers(0, 2**16))
def test_ensemble_subsets_are_distinct_when_they_can_be(num_inputs, data, seed):
    """A repeated subset only repeats a lattice; it must not happen while a new one exists."""
    rank = data.draw(st.integers(1, num_inputs))
    count = data.draw(st.integers(math.ceil(num_inputs / rank), math.ceil(num_inputs / rank) + 6))
    mono = data.draw(st.lists(st.integers(-1, 1), min_size=num_inputs, max_size=num_inputs))
    rows = LatticeEnsemble(num_inputs, rank, count, 2, mono, seed=seed).input_index.tolist()
    subsets = [frozenset(row) for row in rows]
    assert len(set(subsets)) == min(count, math.comb(num_inputs, rank)), rows
    assert set().union(*subsets) == set(range(num_inputs))
    assert all(len(row) == rank for row in subsets)
    assert all(row == sorted(row, key=lambda i: (-abs(mono[i]), i)) for row in rows)
    assert rows == LatticeEnsemble(num_inputs, rank, count, 2, mono, seed=seed).input_index.tolist()


def test_ensemble_loads_a_state_saved_with_repeated_subsets(monkeypatch):
    """States saved before subsets were made distinct hold the old draw; they load as they were
    saved, into the parameter an optimizer may already hold, and stay monotone."""
    mono = [1, 1, 1, -1, 0, 0, 0, 0]
    with monkeypatch.context() as patch:  # what older versions built
        patch.setattr(
            lattice_module, "_draw_subsets", functools.partial(lattice_module._draw_subsets, distinct=False)
        )
        saved = LatticeEnsemble(8, 4, 4, 3, mono, seed=0)
    legacy = saved.input_index
    assert len({frozenset(row) for row in legacy.tolist()}) == 2
    randomize(saved, seed=1, scale=1.0)
    model = LatticeEnsemble(8, 4, 4, 3, mono, seed=0).double()
    assert not torch.equal(model.input_index, legacy)
    raw = model.bank.raw
    model.load_state_dict(saved.state_dict())
    assert model.bank.raw is raw and raw.dtype == torch.float64
    assert torch.equal(model.input_index, legacy)
    assert torch.equal(model.bank._monotone, saved.bank._monotone)
    x = 2 * torch.rand(64, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), saved.double()(x))
    with pytest.raises(ValueError, match="input subsets"):  # another seed's draw is still refused
        LatticeEnsemble(8, 4, 4, 3, mono, seed=1).load_state_dict(saved.state_dict())


def test_ensemble_averages_its_lattices():
    ensemble = LatticeEnsemble(5, 2, 4, 3, [1, 0, 1, 0, 0], seed=1)
    randomize(ensemble, seed=0, scale=1.0)
    x = 2 * torch.rand(6, 5)
    with torch.no_grad():
        vertex_values = ensemble.bank.vertex_values(torch.float32)
        expected = []
        for values, index in zip(vertex_values, ensemble.input_index.tolist()):
            # An all-free lattice keeps its raw values as vertex values.
            single = Lattice([3, 3], [0, 0])
            single.bank.raw.copy_(values[None])
            expected.append(single(x[:, index]))
        torch.testing.assert_close(ensemble(x), torch.stack(expected).mean(0))


def test_decreasing_lattice_input_is_the_flipped_increasing_one():
    increasing, decreasing = Lattice([3, 4], [1, 0]), Lattice([3, 4], ["decreasing", 0])
    randomize(increasing, seed=0, scale=1.0)
    decreasing.load_state_dict(increasing.state_dict())
    x = torch.tensor([[0.3, 2.6], [1.5, 0.2], [2.0, 1.9], [-4.0, 1.0], [9.0, 3.0]])
    flipped = x.clone()
    flipped[:, 0] = 2 - x[:, 0]
    with torch.no_grad():
        torch.testing.assert_close(decreasing(x), increasing(flipped))
        # vertex_values is indexed by the input: the vertex at input 0 is the flipped lattice's last.
        torch.testing.assert_close(decreasing.vertex_values(), increasing.vertex_values().flip(0))
        vertices = torch.tensor(list(itertools.product(range(3), range(4))), dtype=torch.float32)
        torch.testing.assert_close(decreasing(vertices), decreasing.vertex_values().flatten())


@pytest.mark.parametrize("module", ["lattice", "ensemble"])
def test_lattice_gradcheck(module):
    torch.manual_seed(0)
    if module == "lattice":
        model, num_inputs, size = Lattice([3, 2, 4], [1, 0, 1]).double(), 3, 4
    else:
        model, num_inputs, size = LatticeEnsemble(4, 2, 3, 3, [1, 0, 1, 0]).double(), 4, 3
    sizes = model.bank.sizes if module == "lattice" else [size] * num_inputs
    upper = torch.tensor(sizes, dtype=torch.float64) - 1
    # Away from cell faces, where the interpolant has kinks.
    cell = (torch.rand(5, num_inputs, dtype=torch.float64) * upper).floor()
    x = cell + 0.1 + 0.8 * torch.rand(5, num_inputs, dtype=torch.float64)
    raw = torch.randn(model.bank.raw.shape, dtype=torch.float64)

    def fn(x, raw):
        return torch.func.functional_call(model, {"bank.raw": raw}, (x,))

    assert torch.autograd.gradcheck(fn, (x.requires_grad_(), raw.requires_grad_()))


@pytest.mark.safety
@pytest.mark.parametrize(
    "build",
    [
        lambda: Lattice([1000] * 4, [0] * 4),
        lambda: Lattice([2] * 40, [0] * 40),
        lambda: LatticeEnsemble(8, 4, 4, 100, [0] * 8),
        lambda: MonotonicRegressor(num_features=10**8),
        lambda: MonotonicRegressor(lattice_size=1000),
    ],
    ids=["lattice-size-1000", "40-dimensions", "ensemble-size-100", "10**8-features", "regressor-size-1000"],
)
def test_a_lattice_past_the_size_limit_is_refused_before_it_is_built(build):
    # Each would allocate from gigabytes to terabytes; the count is made from the sizes first.
    with pytest.raises(ValueError, match=r"would build tables of .* entries .* \(MAX_LATTICE_ENTRIES\)"):
        build()


def test_ensemble_subsets_of_a_seed_never_change():
    """A saved state holds its subsets and loads only into an ensemble that draws the same ones:
    the draw for given arguments is part of the format (seed 0 by default)."""
    rows = LatticeEnsemble(6, 2, 4, 3, [1, 0, -1, 0, 0, 1]).input_index.tolist()
    assert rows == [[2, 3], [5, 4], [0, 1], [0, 4]]


def test_a_bounded_ensemble_stays_in_its_bounds_and_loads_a_legacy_state(monkeypatch):
    mono = [1, 1, 1, -1, 0, 0, 0, 0]
    with monkeypatch.context() as patch:
        patch.setattr(
            lattice_module, "_draw_subsets", functools.partial(lattice_module._draw_subsets, distinct=False)
        )
        saved = LatticeEnsemble(8, 4, 4, 3, mono, seed=0, output_min=-1.0, output_max=-0.5)
    randomize(saved, seed=2, scale=5.0)
    model = LatticeEnsemble(8, 4, 4, 3, mono, seed=0, output_min=-1.0, output_max=-0.5)
    model.load_state_dict(saved.state_dict())
    x = 2 * torch.rand(64, 8)
    with torch.no_grad():
        out = model(x)
        assert ((out >= -1.0) & (out <= -0.5)).all()
        torch.testing.assert_close(out, saved(x))


def test_an_ensemble_state_without_subsets_loads_when_not_strict():
    model = LatticeEnsemble(4, 2, 2, 3, [1, 0, 0, 1])
    state = {k: v for k, v in model.state_dict().items() if k != "input_index"}
    assert model.load_state_dict(state, strict=False).missing_keys == ["input_index"]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: LatticeEnsemble(9, 2, 4, 3, [0] * 9),
            "num_lattices * lattice_rank = 8 cannot cover 9 inputs",
        ),
        (
            lambda: LatticeEnsemble(3, 2, 2, 3, [0, 2, 1]),
            "monotonicities must contain only (-1, 0, 1) (or 'increasing', 'decreasing', None), got [2]",
        ),
    ],
)
def test_ensemble_arguments_are_refused_word_for_word(build, message):
    with pytest.raises(ValueError) as err:
        build()
    assert str(err.value) == message


def test_ensemble_size_limit_and_input_shape_name_the_ensemble():
    with pytest.raises(ValueError, match=r"^LatticeEnsemble: 100,000 lattices of 8 dimensions of size 4 "):
        LatticeEnsemble(8, 8, 100_000, 4, [0] * 8)
    with pytest.raises(ValueError) as err:
        LatticeEnsemble(4, 2, 2, 3, [1, 0, 0, 1])(torch.zeros(5, 3))
    assert str(err.value) == "LatticeEnsemble input must have shape (N, 4), got (5, 3)"


def test_a_refused_ensemble_state_names_its_input_subsets():
    saved = LatticeEnsemble(4, 2, 2, 3, [1, 0, 0, 1], seed=1)
    with pytest.raises(ValueError) as err:
        LatticeEnsemble(4, 2, 2, 3, [1, 0, 0, 1], seed=0).load_state_dict(saved.state_dict())
    assert str(err.value).startswith(
        f"LatticeEnsemble was declared with input subsets {LatticeEnsemble(4, 2, 2, 3, [1, 0, 0, 1]).input_index.tolist()}"
    )


def test_a_bfloat16_lattice_gives_its_vertex_values_in_float32():
    lattice = Lattice([3, 2], [1, 0]).to(torch.bfloat16)
    assert lattice.vertex_values().dtype == torch.float32


def test_lattice_arguments_are_refused_naming_the_lattice():
    with pytest.raises(
        ValueError, match=r"^Lattice: a lattice of 12 dimensions of size 4 would build tables of "
    ):
        Lattice([4] * 12, [0] * 12)
    with pytest.raises(ValueError) as err:
        Lattice([3, 3], [1, 2])
    assert str(err.value) == (
        "monotonicities must contain only (-1, 0, 1) (or 'increasing', 'decreasing', None), got [2]"
    )


def test_a_lattice_state_holds_only_its_parameters_and_subsets():
    """What a saved state holds is its format: the tables the layers rebuild from their
    arguments (strides, corners, flips) stay out of it, so states load across versions."""
    assert list(Lattice([3, 2, 4], [1, 0, -1]).state_dict()) == ["bank.raw"]
    assert list(LatticeEnsemble(5, 2, 4, 3, [1, 0, -1, 0, 1]).state_dict()) == ["input_index", "bank.raw"]


@pytest.mark.parametrize(
    ("build", "head"),
    [
        (
            lambda: check_lattice_size([4] * 12),
            "lattice: a lattice of 12 dimensions of size 4 would build tables of 68,719,476,736 entries",
        ),
        (
            lambda: LatticeEnsemble(8, 8, 100_000, 4, [0] * 8),
            "LatticeEnsemble: 100,000 lattices of 8 dimensions of size 4 would build tables of 52,428,800,000 entries",
        ),
        (
            lambda: check_lattice_size([2] * 64),
            "lattice: a lattice of 64 dimensions of size 2 would build tables of about 10^38 entries",
        ),
        (
            lambda: check_lattice_size([2] * 65),
            "lattice: a lattice of 65 dimensions of size 2 would build tables of over 2^130 entries",
        ),
    ],
)
def test_the_size_limit_counts_the_tables_entries(build, head):
    with pytest.raises(ValueError) as err:
        build()
    assert str(err.value).startswith(
        head + " (every vertex's coordinates, or each cell's 2^dimensions corners)"
    )


def test_the_size_limit_is_inclusive_and_names_uneven_sizes_and_counts():
    check_lattice_size([32] * 4)  # 2^20 vertices x 2^4 corners: exactly MAX_LATTICE_ENTRIES, allowed
    with pytest.raises(ValueError, match=r"^lattice: 2 lattices of 12 dimensions of size 4 would"):
        check_lattice_size([4] * 12, 2)
    sizes = [4] * 10 + [5] * 10
    with pytest.raises(ValueError, match=rf"^lattice: a lattice of sizes {re.escape(str(sizes[:16]))} would"):
        check_lattice_size(sizes)


def test_a_lattice_starts_as_a_ramp_over_its_monotone_inputs():
    torch.manual_seed(0)
    values = Lattice([3, 2], [1, 1]).vertex_values().detach()
    torch.testing.assert_close(values - values[0, 0], torch.tensor([[0.0, 0.5], [0.25, 0.75], [0.5, 1.0]]))
    one = Lattice([3, 2], [1, 0]).vertex_values().detach()  # the free input adds a little noise
    torch.testing.assert_close(one[:, 0] - one[0, 0], torch.tensor([0.0, 0.5, 1.0]))
    free = Lattice([4, 4], [0, 0]).vertex_values().detach()
    assert abs(free.mean().item() - 0.5) < 0.1 and free.std().item() < 0.3
    bounded = Lattice([5], [1], 0.0, 10.0).vertex_values().detach()
    assert bounded.max() - bounded.min() > 6  # across the middle of the bounds (1 to 9 before noise)


@pytest.mark.parametrize(
    ("sizes", "amount"), [([5] * 15, "about 10^15"), ([4] * 17, "about 10^15"), ([4] * 12, "68,719,476,736")]
)
def test_the_size_limit_writes_huge_counts_as_powers_of_ten(sizes, amount):
    with pytest.raises(ValueError) as err:
        check_lattice_size(sizes)
    message = str(err.value)
    assert f"would build tables of {amount} entries" in message
    assert message.endswith(
        "more than the 16,777,216 a lattice layer may build (MAX_LATTICE_ENTRIES); use a smaller lattice size, "
        "fewer inputs per lattice or fewer lattices"
    )
