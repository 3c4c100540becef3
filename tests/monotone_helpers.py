"""Helpers shared by the tests of fastload.monotonic: random parameters at any scale, sweeps of
one input, the inputs where a layer promises exact monotonicity and the rounding bound in the
others, the calibrator piece a step falls in, and a fixture that runs these tiny models on one
torch thread."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from torch import nn

from fastload.monotonic import Lattice, LatticeEnsemble, PWLCalibrator

PROPERTY = settings(max_examples=50, deadline=None)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These tiny models gain nothing from intra-op threads, which cost a lot on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Raw parameter scales, up to values that saturate softplus and sigmoid.
SCALES = st.sampled_from([0.01, 1.0, 30.0, 1e4])


def tolerance(y: torch.Tensor, eps: float = 1e-5) -> float:
    """Rounding allowance where the guarantee is exact in real arithmetic only."""
    return eps * (1.0 + y.detach().abs().max().item())


def exact_columns(module: nn.Module) -> list:
    """Inputs in which the module promises monotonicity under floating-point rounding too."""
    if isinstance(module, PWLCalibrator):
        return [0]
    if isinstance(module, Lattice):
        return [d for d, m in enumerate(module.monotonicities) if m][:1]
    if isinstance(module, LatticeEnsemble):
        rows = module.input_index.tolist()
        monotone = [d for d, m in enumerate(module.monotonicities) if m]
        return [d for d in monotone if all(row[0] == d for row in rows if d in row)]
    return []


def unit_roundoff(dtype: torch.dtype) -> float:
    return 2.0**-53 if dtype == torch.float64 else 2.0**-24


def rounding_bound(module: nn.Module, dtype: torch.dtype = torch.float32) -> float:
    """The constraints module docstring's bound on a decrease along a later monotone input."""
    values = module.bank.vertex_values(dtype)
    rank = len(module.bank.sizes)
    terms = 6 * rank + 4 + (2 * values.shape[0] if isinstance(module, LatticeEnsemble) else 0)
    return terms * unit_roundoff(dtype) * values.abs().max().item()


def exact_features(estimator) -> set:
    """Features of a fitted lattice estimator whose lattice dimension the layers keep exactly
    monotone under rounding."""
    return {j for lattice in estimator.model_.lattices for j in exact_columns(lattice)}


def assert_monotone_up_to_rounding(estimator, X) -> None:
    """``estimator.check_monotone(X)``: 0.0 in the features the layers keep exactly monotone,
    within the stated rounding bound of its lattices (in the units check_monotone reports) in
    the others; how far below it a CPU's rounding lands differs (AVX-512 or not)."""
    exact = {estimator.features_[j].name for j in exact_features(estimator)}
    units = getattr(estimator, "y_scale_", 1.0)
    bound = units * max(rounding_bound(lattice) for lattice in estimator.model_.lattices)
    for name, violation in estimator.check_monotone(X).items():
        assert violation == 0.0 if name in exact else 0.0 <= violation <= bound, (name, violation, bound)


def step_piece(keypoints, step: float) -> float:
    """The width of the calibrator piece holding ``step``: the ramp a step in the target becomes."""
    points = np.asarray(keypoints)
    return points[points > step].min() - points[points <= step].max()


def randomize(module: nn.Module, seed: int, scale: float) -> None:
    """Overwrites every parameter with random values, a fifth of them at +-scale extremes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            values = torch.randn(p.shape, generator=generator) * scale
            extreme = torch.rand(p.shape, generator=generator) < 0.2
            signs = torch.randint(0, 2, p.shape, generator=generator) * 2 - 1
            p.copy_(torch.where(extreme, signs * scale, values))


def sweep(fn, base: torch.Tensor, dim: int, values: torch.Tensor) -> torch.Tensor:
    """Outputs, shape (len(values), -1), of fn at each base point with column dim set to values."""
    x = base.unsqueeze(0).repeat(len(values), 1, 1)
    x[:, :, dim] = values[:, None].to(x.dtype)
    return fn(x.flatten(0, 1)).reshape(len(values), -1)


def assert_nondecreasing(y: torch.Tensor, eps: float = 1e-5) -> None:
    """y of shape (steps, ...) must not decrease along its first dimension."""
    assert torch.isfinite(y).all()
    worst = (y[:-1].float() - y[1:].float()).max().item()
    assert worst <= tolerance(y.float(), eps), f"output decreased by {worst}"


def sweep_values(low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """Sorted probe values: every integer in [low, high] (vertices, cell faces) and random points,
    each with its neighbouring floats, where a rounding error would show as a decrease."""
    integers = torch.arange(math.ceil(low), math.floor(high) + 1, dtype=torch.float32)
    points = torch.cat([integers, low + (high - low) * torch.rand(16, generator=generator)])
    below = torch.nextafter(points, torch.tensor(-math.inf))
    above = torch.nextafter(points, torch.tensor(math.inf))
    return torch.cat([below, points, above]).sort().values


def base_points(sizes, count: int, generator: torch.Generator) -> torch.Tensor:
    """Points inside and outside the lattice domain, half of the coordinates on integers."""
    upper = torch.as_tensor(sizes, dtype=torch.float32)
    x = -1 + (upper + 1) * torch.rand(count, len(sizes), generator=generator)
    on_face = torch.rand(count, len(sizes), generator=generator) < 0.5
    return torch.where(on_face, x.round(), x)


def make_optimizer(name: str, params):
    return torch.optim.SGD(params, lr=1.0) if name == "sgd" else torch.optim.Adam(params, lr=1.0)


def three_feature_table(n: int = 300, seed: int = 0):
    """Three features; y rises with x0, falls with x1 (concavely), wiggles with x2."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, 3))
    y = 2 * X[:, 0] - X[:, 1] ** 2 + 0.3 * np.sin(6 * X[:, 2]) + 0.05 * rng.normal(size=n)
    return X, y


def table_with_categories_and_gaps(n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    size = rng.choice(["small", "medium", "large"], n)
    income = rng.uniform(0, 10, n)
    y = {"small": 0.0, "medium": 1.0, "large": 3.0}
    target = np.array([y[s] for s in size]) + 0.2 * income
    income[:40] = np.nan  # missing, where the target is high
    target[:40] = 6.0
    code = rng.uniform(0, 1, n)
    code[40:60] = -1.0  # a declared missing value
    X = np.empty((n, 3), dtype=object)
    X[:, 0], X[:, 1], X[:, 2] = size, income, code
    return X, target
