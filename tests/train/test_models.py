"""The image models (fastload.train.models): the monotone MonotonicRegressor, built of
fastload.monotonic's layers, monotone for any parameters and under adversarial training,
exact with one monotone input, monotone inputs kept out of the backbone, state round trips;
the CUDA layout (channels_last convolutions only); a torchvision backbone without torchvision."""

from __future__ import annotations

import io
import sys

import pytest
import torch
import train_helpers
from hypothesis import given, settings
from hypothesis import strategies as st
from monotone_helpers import (
    SCALES,
    make_optimizer,
    one_thread,  # noqa: F401 (an autouse fixture)
    randomize,
    tolerance,
)
from torch import nn
from train_helpers import FAST, SIDE

import fastload
from fastload.monotonic import Lattice, LatticeEnsemble, MonotoneLinear, check_monotone
from fastload.train import fit
from fastload.train.models import MonotonicClassifier, MonotonicRegressor, channels_last_convolutions

store_path = train_helpers.store_path  # the 200-record store of tests/train_helpers.py, as a module fixture


@settings(max_examples=10, deadline=None)
@given(monotone=st.integers(1, 2), bounded=st.booleans(), scale=SCALES, seed=st.integers(0, 2**16))
def test_regressor_is_monotone_for_any_parameters(monotone, bounded, scale, seed):
    """Exactly monotone with one monotone input, up to rounding with more."""
    torch.manual_seed(seed)
    bounds = (-1.0, 4.0) if bounded else (None, None)
    model = MonotonicRegressor(
        num_features=3, monotone_inputs=monotone, output_min=bounds[0], output_max=bounds[1]
    )
    randomize(model, seed, scale)
    images, extra = torch.randn(4, 3, 16, 16), torch.rand(4, monotone)
    with torch.no_grad():
        y = model.eval()(images, extra)
    worst = check_monotone(model, images, extra, num_steps=64)
    assert worst == 0.0 if monotone == 1 else worst <= tolerance(y)
    if bounded:
        assert y.min() >= bounds[0] and y.max() <= bounds[1]


@settings(max_examples=10, deadline=None)
@given(scale=SCALES, seed=st.integers(0, 2**16))
def test_bounded_regressor_with_one_monotone_input_is_exact(scale, seed):
    torch.manual_seed(seed)
    model = MonotonicRegressor(num_features=3, monotone_inputs=1, output_min=-1.0, output_max=7.0)
    randomize(model, seed, scale)
    images, extra = torch.randn(8, 3, 8, 8), torch.rand(8, 1)
    assert check_monotone(model, images, extra, num_steps=200) == 0.0


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("num_features", [2, 5])  # a single lattice, then an ensemble
def test_adversarial_training_cannot_break_regressor(optimizer, num_features):
    torch.manual_seed(0)
    model = MonotonicRegressor(num_features=num_features, monotone_inputs=2, lattice_size=3)
    assert isinstance(model.lattice, Lattice if num_features == 2 else LatticeEnsemble)
    opt = make_optimizer(optimizer, model.parameters())
    images = torch.randn(8, 3, 16, 16)
    for _ in range(30):
        extra = 1.4 * torch.rand(8, 2) - 0.2
        loss = sum(
            (
                model(images, extra + 0.2 * nn.functional.one_hot(torch.tensor(j), 2)) - model(images, extra)
            ).mean()
            for j in range(2)
        )
        assert loss.item() >= -1e-5  # mean increase along monotone inputs: never negative
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            y = model.eval()(images, extra)
        model.train()
        assert torch.isfinite(y).all()
        assert check_monotone(model, images, extra, num_steps=12) <= tolerance(y)


def test_regressor_with_one_monotone_input_is_exactly_monotone():
    torch.manual_seed(0)
    model = MonotonicRegressor(num_features=6, monotone_inputs=1, output_min=-1.0, output_max=7.0)
    randomize(model, seed=0, scale=1.0)
    images, extra = torch.randn(16, 3, 16, 16), torch.rand(16, 1)
    assert check_monotone(model, images, extra, num_steps=1000) == 0.0


def test_bfloat16_regressor_is_monotone():
    torch.manual_seed(0)
    model = MonotonicRegressor(num_features=4, monotone_inputs=2, output_min=0.0, output_max=10.0)
    model.bfloat16().eval()
    images, extra = torch.randn(4, 3, 16, 16).bfloat16(), torch.rand(4, 2).bfloat16()
    with torch.no_grad():
        y = model(images, extra)
    assert y.dtype == torch.bfloat16 and y.shape == (4,)
    assert check_monotone(model, images, extra, num_steps=16) <= tolerance(y.float(), 1e-2)


class _Recorder(nn.Module):
    """Backbone that remembers what it was given."""

    def __init__(self, num_features: int):
        super().__init__()
        self.head = nn.Sequential(nn.Flatten(), nn.LazyLinear(num_features))
        self.seen = []

    def forward(self, images):
        self.seen.append(images)
        return self.head(images)


def test_regressor_keeps_monotone_inputs_out_of_the_backbone():
    backbone = _Recorder(num_features=3)
    model = MonotonicRegressor(backbone, num_features=3, monotone_inputs=2)
    images = torch.randn(5, 1, 8, 8)
    y = model(images, torch.rand(5, 2))
    assert y.shape == (5,)
    assert len(backbone.seen) == 1 and backbone.seen[0] is images
    assert isinstance(model.lattice, LatticeEnsemble)
    covered = set(model.lattice.input_index.flatten().tolist())
    assert {3, 4} <= covered


def test_regressor_without_monotone_inputs():
    model = MonotonicRegressor(num_features=2, in_channels=1, output_min=5.0, output_max=6.0)
    y = model(torch.randn(3, 1, 16, 16))
    assert y.shape == (3,) and ((y > 5.0) & (y < 6.0)).all()


def test_regressor_monotone_input_ranges_per_input():
    model = MonotonicRegressor(
        num_features=2, monotone_inputs=2, monotone_input_range=[(0.0, 1.0), (-50.0, 50.0)]
    )
    assert [c.input_max for c in model.input_calibrators] == [1.0, 50.0]


def test_monotone_input_keypoints_replace_the_even_ones_in_every_head():
    points = [[0.0, 0.36, 0.38, 1.0], [-50.0, 0.0, 50.0]]
    regressor = MonotonicRegressor(num_features=2, monotone_inputs=2, monotone_input_keypoints=points)
    classifier = MonotonicClassifier(3, num_features=2, monotone_inputs=2, monotone_input_keypoints=points)
    for model in [regressor, *classifier.heads]:
        assert [c.keypoints.tolist() for c in model.input_calibrators] == points
    images, inputs = torch.randn(4, 3, 16, 16), torch.rand(4, 2)
    assert check_monotone(regressor, images, inputs) <= 1e-5
    assert check_monotone(classifier, images, inputs) <= 1e-5


@pytest.mark.parametrize(
    "points, message",
    [
        ([[0.0, 1.0]], r"monotone_input_keypoints has 1 keypoint list\(s\) for 2 monotone inputs"),
        (
            [[0.0, 1.0], [0.5, 0.2]],
            r"monotone_input_keypoints\[1\]: input_keypoints must be strictly increasing",
        ),
        ([[0.5], [0.0, 1.0]], r"monotone_input_keypoints\[0\]: input_keypoints must be >= 2 finite values"),
    ],
)
def test_wrong_monotone_input_keypoints_name_the_input(points, message):
    for model in (MonotonicRegressor, lambda **kw: MonotonicClassifier(2, **kw)):
        with pytest.raises(ValueError, match=message):
            model(num_features=2, monotone_inputs=2, monotone_input_keypoints=points)


def test_state_round_trips_keep_the_model():
    torch.manual_seed(0)
    model = MonotonicRegressor(
        num_features=4, monotone_inputs=2, lattice_rank=3, output_min=0.0, output_max=5.0
    )
    randomize(model, seed=0, scale=1.0)
    assert isinstance(model.lattice, LatticeEnsemble)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    torch.manual_seed(1)  # other initial parameters, same declaration
    copy = MonotonicRegressor(
        num_features=4, monotone_inputs=2, lattice_rank=3, output_min=0.0, output_max=5.0
    )
    copy.load_state_dict(torch.load(buffer))
    images, extra = torch.randn(3, 3, 16, 16), torch.rand(3, 2)
    torch.testing.assert_close(copy.eval()(images, extra), model.eval()(images, extra))
    layer = MonotoneLinear(3, 2, [1, -1, 0]).double()
    MonotoneLinear(3, 2, [1, -1, 0]).load_state_dict(layer.state_dict())  # dtype is not a constraint
    MonotoneLinear(3, 2, [1, -1, 0]).load_state_dict({}, strict=False)


def test_regressor_wrong_inputs_raise_value_error():
    model = MonotonicRegressor(num_features=2, monotone_inputs=2)
    images = torch.randn(4, 3, 16, 16)
    with pytest.raises(ValueError, match="monotone_inputs"):
        model(images)
    with pytest.raises(ValueError, match="monotone_inputs"):
        model(images, torch.rand(4, 3))
    with pytest.raises(ValueError, match="rows"):
        model(images, torch.rand(3, 2))
    with pytest.raises(ValueError, match="backbone output"):
        MonotonicRegressor(nn.Flatten(), num_features=2)(images)
    with pytest.raises(ValueError, match="monotone_inputs"):
        check_monotone(model, images, torch.rand(4))


@pytest.mark.parametrize(
    "model", [MonotonicRegressor(), MonotonicClassifier(3)], ids=["regressor", "classifier"]
)
def test_the_cuda_layout_reorders_the_convolutions_only(model):
    # On CUDA the trainer stores its model channels_last. model.to(memory_format=channels_last)
    # refused the default model's 5-d lattice vertices (4 x 3 x 3 x 3 x 3), so every CUDA run,
    # `fastload train --runs 4 --device cuda` included, failed before its first step (#25).
    model.eval()
    x = torch.rand(4, 3, SIDE, SIDE)
    before = model(x)
    assert channels_last_convolutions(model) is model
    convolutions = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convolutions and all(w.is_contiguous(memory_format=torch.channels_last) for w in convolutions)
    others = [p for p in model.parameters() if all(p is not w for w in convolutions)]
    assert any(p.dim() == 5 for p in others) and all(p.is_contiguous() for p in others)
    torch.testing.assert_close(model(x), before)


def test_resnet18_without_torchvision_says_how_to_get_it(store_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    with pytest.raises(fastload.MissingDependencyError, match="needs torchvision.*pip install torchvision"):
        fit(store_path, backbone="resnet18", **FAST)
