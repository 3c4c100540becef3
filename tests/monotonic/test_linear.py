"""Tests for fastload.monotonic.linear: MonotoneLinear keeps its declared signs for any parameters."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from monotone_helpers import (
    PROPERTY,
    SCALES,
    assert_nondecreasing,
    one_thread,  # noqa: F401 (an autouse fixture)
    randomize,
    sweep,
)
from torch import nn

from fastload.monotonic import MonotoneLinear


@PROPERTY
@given(
    in_features=st.integers(1, 5),
    out_features=st.integers(1, 3),
    data=st.data(),
    scale=SCALES,
    seed=st.integers(0, 2**16),
)
def test_monotone_linear_is_monotone_for_any_parameters(in_features, out_features, data, scale, seed):
    mono = data.draw(st.lists(st.integers(-1, 1), min_size=in_features, max_size=in_features))
    layer = MonotoneLinear(in_features, out_features, mono)
    randomize(layer, seed, scale)
    generator = torch.Generator().manual_seed(seed)
    base = 20 * torch.rand(8, in_features, generator=generator) - 10
    values = (20 * torch.rand(16, generator=generator) - 10).sort().values
    with torch.no_grad():
        for d in (d for d, m in enumerate(mono) if m):
            assert_nondecreasing(mono[d] * sweep(layer, base, d, values))
        assert ((layer.weight * torch.tensor(mono, dtype=torch.float32)) >= 0).all()


def test_monotone_linear_starts_as_a_linear_layer_with_the_declared_signs():
    torch.manual_seed(0)
    reference = nn.Linear(4, 3)
    torch.manual_seed(0)
    layer = MonotoneLinear(4, 3, [1, -1, 0, 1])
    signs = torch.tensor([1.0, -1.0, 0.0, 1.0])
    expected = torch.where(signs != 0, signs * reference.weight.abs().clamp(min=1e-3), reference.weight)
    torch.testing.assert_close(layer.weight, expected)
    x = torch.randn(5, 4)
    torch.testing.assert_close(layer(x), x @ expected.T + reference.bias)


@pytest.mark.parametrize("direction, sign", [(1, 1.0), ("decreasing", -1.0), (None, 0.0)])
def test_one_monotonicity_applies_to_every_input(direction, sign):
    assert MonotoneLinear(3, 2, direction).signs.tolist() == [sign] * 3


def test_sizes_below_one_are_refused_word_for_word():
    with pytest.raises(ValueError) as err:
        MonotoneLinear(2, 0, 1)
    assert str(err.value) == "in_features and out_features must be >= 1"
