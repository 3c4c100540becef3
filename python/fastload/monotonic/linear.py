"""``MonotoneLinear``: a linear layer with a declared sign per input (the calibrated linear
model of :class:`~fastload.monotonic.LatticeRegressor` with ``kind="linear"``). The weight map
and its guarantee are :mod:`fastload.monotonic.constraints`'."""

from __future__ import annotations

from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from fastload.monotonic.constraints import check_declared_buffer, check_monotonicities, inverse_softplus

__all__ = ["MonotoneLinear"]


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
        signs = check_monotonicities(monotonicities, (-1, 0, 1), in_features, "monotonicities")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("signs", torch.tensor(signs, dtype=torch.float32))
        init = nn.Linear(in_features, out_features)
        constrained = self.signs != 0
        raw = init.weight.detach().clone()
        raw[:, constrained] = inverse_softplus(raw[:, constrained].abs().clamp(min=1e-3))
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
