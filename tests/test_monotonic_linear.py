"""Tests for fastload.monotonic.linear: MonotoneLinear keeps its declared signs for any parameters."""

from __future__ import annotations

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
