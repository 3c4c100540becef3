"""Tests for fastload.monotonic.calibrators: PWLCalibrator and CategoricalCalibrator are monotone
(convex, concave) for any parameters, interpolate their keypoints, impute missing inputs, fit
what isotonic regression fits, and have exact gradients."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from monotone_helpers import (
    PROPERTY,
    SCALES,
    assert_nondecreasing,
    one_thread,  # noqa: F401 (an autouse fixture)
    randomize,
)
from sklearn.isotonic import IsotonicRegression

from fastload.monotonic import CategoricalCalibrator, PWLCalibrator


@PROPERTY
@example(
    num_keypoints=10,
    monotonicity=-1,
    bounded=True,
    input_min=-52.14664898213355,
    width=3.498656234663863,
    scale=1e4,
    seed=22729,
)  # once gave -3.0000229 < output_min: the position in the last cell rounded past 1
@given(
    num_keypoints=st.integers(2, 12),
    monotonicity=st.sampled_from([-1, 1]),
    bounded=st.booleans(),
    input_min=st.floats(-100, 100),
    width=st.floats(0.01, 100),
    scale=SCALES,
    seed=st.integers(0, 2**16),
)
def test_calibrator_is_monotone_for_any_parameters(
    num_keypoints, monotonicity, bounded, input_min, width, scale, seed
):
    bounds = (-3.0, 5.0) if bounded else (None, None)
    cal = PWLCalibrator(num_keypoints, input_min, input_min + width, monotonicity, *bounds)
    randomize(cal, seed, scale)
    generator = torch.Generator().manual_seed(seed)
    outside = input_min + width * (3 * torch.rand(32, generator=generator) - 1)
    x = torch.cat([cal.keypoints, outside]).sort().values
    with torch.no_grad():
        y = cal(x)
    assert_nondecreasing(monotonicity * y, eps=0.0)
    if bounded:
        assert y.min() >= bounds[0] and y.max() <= bounds[1]


@PROPERTY
# All keypoints tie; sigmoid's scalar tail (elements 32..) rounds these first values 1 ulp below
# (above) its vectorised body, which gave f(31) > f(32) (f(31) < f(32) for the decreasing one).
@example(num_keypoints=40, monotonicity=1, first=-1.173715591430664, tie_fraction=1.0, seed=0)
@example(num_keypoints=40, monotonicity=-1, first=2.2051610946655273, tie_fraction=1.0, seed=0)
@given(
    num_keypoints=st.integers(33, 80),  # longer than one vectorised block of sigmoid
    monotonicity=st.sampled_from([-1, 1]),
    first=st.floats(-8, 8),
    tie_fraction=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_bounded_calibrator_with_ties_is_exactly_monotone(
    num_keypoints, monotonicity, first, tie_fraction, seed
):
    cal = PWLCalibrator(num_keypoints, 0.0, 1.0, monotonicity, 0.0, 1.0)
    generator = torch.Generator().manual_seed(seed)
    steps = torch.randn(num_keypoints - 1, generator=generator) - 12
    ties = torch.rand(num_keypoints - 1, generator=generator) < tie_fraction
    with torch.no_grad():
        cal.raw.copy_(torch.cat([torch.tensor([first]), torch.where(ties, -200.0, steps)]))
        y = cal(torch.cat([cal.keypoints, torch.rand(64, generator=generator)]).sort().values)
    assert_nondecreasing(monotonicity * y, eps=0.0)


@pytest.mark.parametrize("monotonicity", [-1, 0, 1])
@pytest.mark.parametrize("bounds", [(None, None), (-2.0, 3.0)])
def test_calibrator_passes_through_keypoints(monotonicity, bounds):
    cal = PWLCalibrator(7, -2.0, 5.0, monotonicity, *bounds)
    randomize(cal, seed=monotonicity + 5, scale=1.0)
    with torch.no_grad():
        expected = cal.keypoint_outputs()
        torch.testing.assert_close(cal(cal.keypoints), expected)
        torch.testing.assert_close(cal(cal.keypoints[:, None]), expected[:, None])
        # Constant outside the input range.
        outside = cal(torch.tensor([-100.0, -2.5, 5.5, 100.0]))
        torch.testing.assert_close(outside, expected[[0, 0, -1, -1]])


def test_calibrator_starts_as_identity():
    cal = PWLCalibrator(5, -1.0, 3.0, 1)
    x = torch.linspace(-1.0, 3.0, 17)
    torch.testing.assert_close(cal(x).detach(), x)


@PROPERTY
@given(
    monotonicity=st.sampled_from([-1, 0, 1]),
    convexity=st.sampled_from([-1, 1]),
    keypoints=st.one_of(
        st.none(),
        st.lists(st.floats(-100, 100, width=32), min_size=2, max_size=12, unique=True).map(sorted),
    ),
    bounded=st.booleans(),
    scale=SCALES,
    seed=st.integers(0, 2**16),
)
@example(monotonicity=-1, convexity=-1, keypoints=[0.0, 1.0], bounded=True, scale=1e4, seed=0).via(
    "a flat bounded calibrator once gave 0 * inf = NaN"
)
def test_convex_calibrator_for_any_parameters(monotonicity, convexity, keypoints, bounded, scale, seed):
    """Slopes in the declared order and sign exactly; the computed keypoint outputs within the
    rounding the module docstring states (times the rescaling onto the bounds, plus its own
    roundings, when bounded); monotone exactly; inside the bounds."""
    bounds = (-3.0, 5.0) if bounded else (None, None)

    def build(low, high):
        if keypoints is None:
            return PWLCalibrator(9, -3.0, 5.0, monotonicity, low, high, convexity=convexity)
        return PWLCalibrator(
            input_keypoints=keypoints,
            monotonicity=monotonicity,
            output_min=low,
            output_max=high,
            convexity=convexity,
        )

    cal, unbounded = build(*bounds), build(None, None)
    randomize(cal, seed, scale)
    unbounded.load_state_dict(cal.state_dict())
    with torch.no_grad():
        slopes = cal.slopes()
        assert (convexity * slopes.diff() >= 0).all()
        assert (monotonicity * slopes >= 0).all()
        outputs, raw_outputs = cal.keypoint_outputs(), unbounded.keypoint_outputs()
        assert torch.isfinite(outputs).all()
        widths = cal.keypoints.float().diff().double()  # the widths the module multiplies by
        u = 2.0**-24
        allowance = u * (raw_outputs.abs().max().item() / widths.min().item() + slopes.abs().max().item())
        if bounded:
            assert outputs.min() >= bounds[0] and outputs.max() <= bounds[1]
            spread = (raw_outputs.max() - raw_outputs.min()).item()
            allowance = allowance * 8.0 / max(spread, 1e-30) + 3 * u * 5.0 / widths.min().item()
        realized = outputs.double().diff() / widths
        assert (convexity * realized.diff() >= -2 * allowance).all()
        if monotonicity:
            generator = torch.Generator().manual_seed(seed)
            low, high = cal.input_min, cal.input_max
            x = low + (high - low) * (1.5 * torch.rand(64, generator=generator) - 0.25)
            assert_nondecreasing(
                monotonicity * cal(torch.cat([cal.keypoints.float(), x]).sort().values), eps=0.0
            )


def test_bounded_convex_calibrator_spans_its_bounds():
    cal = PWLCalibrator(
        input_keypoints=[0.0, 1.0, 4.0, 9.0], monotonicity=-1, output_min=0.0, output_max=2.0, convexity=1
    )
    torch.testing.assert_close(
        cal.keypoint_outputs().detach(), torch.tensor([2.0, 2 - 2 / 9, 2 - 8 / 9, 0.0]), atol=1e-4, rtol=0
    )
    randomize(cal, seed=3, scale=3.0)
    outputs = cal.keypoint_outputs().detach()
    torch.testing.assert_close(outputs[[0, -1]], torch.tensor([2.0, 0.0]))  # up to rounding


def test_concave_calibrator_learns_a_concave_fit():
    """Fitting sqrt with a concave increasing calibrator: every piece's slope no larger than the
    one before, and close to sqrt at the keypoints."""
    torch.manual_seed(0)
    cal = PWLCalibrator(input_keypoints=[0.0, 0.1, 0.3, 1.0, 2.0, 4.0], monotonicity=1, convexity="concave")
    x = torch.linspace(0, 4, 200)
    opt = torch.optim.Adam(cal.parameters(), lr=0.05)
    for _ in range(800):
        loss = ((cal(x) - x.sqrt()) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 2e-3
    assert (cal.slopes().diff() <= 0).all()


def test_calibrator_with_keypoints_interpolates_between_them():
    cal = PWLCalibrator(input_keypoints=[-1.0, 0.0, 0.5, 3.0], monotonicity=0)
    randomize(cal, seed=1, scale=1.0)
    with torch.no_grad():
        values = cal.keypoint_outputs()
        torch.testing.assert_close(cal(torch.tensor([-1.0, 0.0, 0.5, 3.0])), values)
        torch.testing.assert_close(cal(torch.tensor([-0.5, 1.75])), (values[[0, 2]] + values[[1, 3]]) / 2)
        torch.testing.assert_close(cal(torch.tensor([-50.0, 50.0])), values[[0, 3]])
        assert torch.isnan(cal(torch.tensor([math.nan]))).all()


def test_calibrator_starts_as_a_ramp_from_its_initial_range():
    cal = PWLCalibrator(input_keypoints=[0.0, 1.0, 10.0, 100.0], monotonicity=-1, initial_range=(0.0, 3.0))
    torch.testing.assert_close(cal.keypoint_outputs().detach(), torch.tensor([3.0, 2.0, 1.0, 0.0]))
    convex = PWLCalibrator(input_keypoints=[0.0, 1.0, 10.0, 100.0], convexity=1, initial_range=(0.0, 3.0))
    torch.testing.assert_close(
        convex.keypoint_outputs().detach(), torch.tensor([0.0, 0.03, 0.3, 3.0]), atol=1e-3, rtol=0
    )


@pytest.mark.parametrize("monotonicity", [-1, 0, 1])
def test_a_straight_start_is_a_line_in_the_input_whatever_the_keypoints(monotonicity):
    """What a small table's fit starts from (kind="auto" stops early near it)."""
    points = [0.0, 1.0, 10.0, 100.0]
    cal = PWLCalibrator(
        input_keypoints=points, monotonicity=monotonicity, initial_range=(0.0, 3.0), straight_start=True
    )
    line = torch.tensor([0.0, 0.03, 0.3, 3.0])
    expected = 3.0 - line if monotonicity < 0 else line
    torch.testing.assert_close(cal.keypoint_outputs().detach(), expected, atol=1e-4, rtol=0)
    bounded = PWLCalibrator(
        input_keypoints=points, monotonicity=monotonicity, output_min=0.0, output_max=1.0, straight_start=True
    )
    outputs = bounded.keypoint_outputs().detach()
    steps = outputs.diff() / torch.tensor(points).diff().float()
    assert (steps.diff().abs() < 0.05 * steps.abs().max()).all()


@pytest.mark.parametrize("bounds", [(None, None), (0.0, 2.0)])
def test_missing_inputs_take_a_learned_output(bounds):
    cal = PWLCalibrator(5, 0.0, 1.0, 1, *bounds, missing_input_value=-1.0)
    x = torch.tensor([0.5, math.nan, -1.0, -0.5])
    y = cal(x)
    assert y[1] == y[2] == cal.missing.value(torch.float32) and y[3] == cal(torch.tensor([0.0]))
    y[1].backward()
    assert cal.missing.raw.grad != 0 and (cal.raw.grad == 0).all()
    categories = CategoricalCalibrator(3, 1, *bounds, impute_missing=True)
    out = categories(torch.tensor([2.0, math.nan, 0.0]))
    assert out[1] == categories.missing.value(torch.float32) and out[0] > out[2]
    assert torch.isnan(CategoricalCalibrator(3)(torch.tensor([math.nan]))).all()


@PROPERTY
@given(
    count=st.integers(2, 40),
    monotonicity=st.sampled_from([-1, 0, 1, "increasing"]),
    bounded=st.booleans(),
    scale=SCALES,
    seed=st.integers(0, 2**16),
)
def test_categorical_calibrator_for_any_parameters(count, monotonicity, bounded, scale, seed):
    bounds = (-1.0, 3.0) if bounded else (None, None)
    cal = CategoricalCalibrator(count, monotonicity, *bounds)
    randomize(cal, seed, scale)
    with torch.no_grad():
        y = cal(torch.arange(count, dtype=torch.float32))
        torch.testing.assert_close(y, cal.category_outputs())
        torch.testing.assert_close(cal(torch.arange(count)[:, None]), y[:, None])  # integer codes too
    sign = {"increasing": 1}.get(monotonicity, monotonicity)
    assert_nondecreasing(sign * y, eps=0.0)
    if bounded:
        assert y.min() >= bounds[0] and y.max() <= bounds[1]


@pytest.mark.parametrize("codes", [[0.0, 3.0], [-1.0], [0.5]])
def test_categorical_calibrator_refuses_codes_that_are_no_category(codes):
    with pytest.raises(ValueError, match=r"integers in \[0, 2\]"):
        CategoricalCalibrator(3)(torch.tensor(codes))


@pytest.mark.parametrize("monotonicity", [-1, 0, 1])
@pytest.mark.parametrize("bounds", [(None, None), (-1.0, 2.0)])
def test_calibrator_gradcheck(monotonicity, bounds):
    torch.manual_seed(0)
    cal = PWLCalibrator(6, -1.0, 4.0, monotonicity, *bounds).double()
    spacing = 1.0
    x = torch.cat([cal.keypoints[:-1] + 0.37 * spacing, torch.tensor([-3.0, 6.0], dtype=torch.float64)])
    raw = torch.randn(6, dtype=torch.float64)

    def fn(x, raw):
        return torch.func.functional_call(cal, {"raw": raw}, (x,))

    assert torch.autograd.gradcheck(fn, (x.requires_grad_(), raw.requires_grad_()))


def test_calibrator_fit_matches_isotonic_regression():
    """With one keypoint per distinct x, the calibrator's value at each x is a free monotone
    sequence, so least squares over it is exactly isotonic regression (flat runs are only
    approached, as increments are softplus > 0)."""
    torch.manual_seed(0)
    sigma = 0.1
    cal = PWLCalibrator(30, 0.0, 1.0, 1).double()
    x = cal.keypoints.repeat(4)
    y = torch.where(x < 0.5, x, 1.0 + 0.2 * x) + sigma * torch.randn_like(x)
    opt = torch.optim.LBFGS(
        cal.parameters(),
        max_iter=300,
        history_size=50,
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = ((cal(x) - y) ** 2).mean()
        loss.backward()
        return loss

    opt.step(closure)
    isotonic = IsotonicRegression().fit(x.numpy(), y.numpy()).predict(x.numpy())
    difference = np.abs(cal(x).detach().numpy() - isotonic)
    assert difference.mean() < 0.02 * sigma
    assert difference.max() < 0.2 * sigma


def test_float32_module_promotes_bfloat16_input():
    cal = PWLCalibrator(4, 0.0, 1.0, 1)
    assert cal(torch.rand(5, dtype=torch.bfloat16)).dtype == torch.float32


# Starting values, dtypes and edges, checked exactly


def test_categorical_calibrator_starts_as_a_ramp_or_flat_in_its_range_or_bounds():
    torch.testing.assert_close(
        CategoricalCalibrator(3, 1).category_outputs().detach(), torch.tensor([0.0, 0.5, 1.0])
    )
    torch.testing.assert_close(
        CategoricalCalibrator(3, -1).category_outputs().detach(), torch.tensor([1.0, 0.5, 0.0])
    )
    assert CategoricalCalibrator(3).category_outputs().tolist() == [0.5, 0.5, 0.5]  # free by default
    bounded = CategoricalCalibrator(3, 1, 0.0, 10.0, impute_missing=True)
    torch.testing.assert_close(bounded.category_outputs().detach(), torch.tensor([1.0, 5.0, 9.0]))
    assert bounded(torch.tensor([math.nan])).item() == pytest.approx(5.0)  # missing: the middle of the bounds
    assert CategoricalCalibrator(1)(torch.tensor([0.0, math.nan])).isnan().tolist() == [False, True]


def test_missing_inputs_start_in_the_middle_of_the_bounds():
    cal = PWLCalibrator(5, 0.0, 1.0, 1, 0.0, 2.0, impute_missing=True)
    assert cal(torch.tensor([math.nan])).item() == pytest.approx(1.0)


def test_categorical_calibrator_refuses_a_second_column_word_for_word():
    with pytest.raises(ValueError) as err:
        CategoricalCalibrator(3)(torch.zeros(4, 2))
    assert str(err.value) == "CategoricalCalibrator input must have shape (N,) or (N, 1), got (4, 2)"


def test_slopes_belong_to_convex_or_concave_calibrators_word_for_word():
    with pytest.raises(ValueError) as err:
        PWLCalibrator(5, 0.0, 1.0).slopes()
    assert str(err.value) == "slopes are parameters of convex or concave calibrators only"


@pytest.mark.parametrize("convexity", [1, -1])
def test_a_free_convex_or_concave_calibrator_starts_as_a_line(convexity):
    cal = PWLCalibrator(5, 0.0, 2.0, 0, convexity=convexity)
    torch.testing.assert_close(cal.slopes().detach(), torch.ones(4))
    torch.testing.assert_close(cal(torch.tensor([0.0, 1.0, 2.0])).detach(), torch.tensor([0.0, 1.0, 2.0]))


@pytest.mark.parametrize(("monotonicity", "convexity"), [(1, 1), (1, -1), (-1, 1), (-1, -1)])
def test_large_moves_keep_the_declared_sign_and_curvature(monotonicity, convexity):
    cal = PWLCalibrator(6, 0.0, 1.0, monotonicity, convexity=convexity)
    with torch.no_grad():
        cal.raw.copy_(torch.tensor([0.0, -3.0, 2.0, 3.0, 1.0, 4.0]))
        slopes = cal.slopes()
    assert (monotonicity * slopes >= 0).all() and (convexity * slopes.diff() >= 0).all()
    assert_nondecreasing(monotonicity * cal.keypoint_outputs().detach()[:, None])


def test_a_wider_input_computes_in_its_dtype_exactly_as_a_wider_layer():
    """A float32 layer given float64 inputs computes in float64: what its float64 copy gives."""
    for cal in (
        PWLCalibrator(6, 0.0, 1.0, 1),
        PWLCalibrator(6, 0.0, 1.0, 1, convexity=1),
        PWLCalibrator(input_keypoints=[0.0, 0.1, 0.5, 1.0], monotonicity=-1, output_min=0.0, output_max=1.0),
        CategoricalCalibrator(4, 1, 0.0, 3.0, impute_missing=True),
    ):
        randomize(cal, seed=3, scale=2.0)
        wide = copy.deepcopy(cal).double()
        if isinstance(cal, PWLCalibrator):
            assert cal.keypoint_outputs(torch.float64).dtype == torch.float64
            assert torch.equal(cal.keypoint_outputs(torch.float64), wide.keypoint_outputs())
            if cal.convexity:
                assert torch.equal(cal.slopes(torch.float64), wide.slopes())
            x = torch.linspace(-0.1, 1.1, 29, dtype=torch.float64)
        else:
            x = torch.tensor([0.0, 1.0, 2.0, 3.0, math.nan], dtype=torch.float64)
        out = cal(x)
        assert out.dtype == torch.float64
        assert torch.equal(out.nan_to_num(-7.0), wide(x).nan_to_num(-7.0))


def test_integer_codes_give_the_layers_dtype_and_bfloat16_inputs_compute_in_float32():
    categories = CategoricalCalibrator(3, 1).to(torch.bfloat16)
    assert categories(torch.tensor([0, 2])).dtype == torch.bfloat16
    cal = PWLCalibrator(10, 0.0, 1.0, 1)  # 9 pieces: a cell's position is no exact bfloat16 product
    randomize(cal, seed=5, scale=1.0)
    x = torch.linspace(0.0, 1.0, 101).bfloat16()
    assert torch.equal(cal(x), cal(x.float()))  # a float32 result, computed in float32


def test_a_calibrator_with_keypoints_gives_each_keypoints_output_exactly():
    keypoints = [0.0, 0.1, 0.3, 0.7, 1.0]
    for seed in range(8):
        cal = PWLCalibrator(input_keypoints=keypoints, monotonicity=0)
        randomize(cal, seed=seed, scale=3.0)
        with torch.no_grad():
            assert torch.equal(cal(torch.tensor(keypoints[:-1])), cal.keypoint_outputs()[:-1])


@pytest.mark.parametrize(
    ("build", "outputs"),
    [
        (lambda: PWLCalibrator(5, 0.0, 1.0, 0), [0.0, 0.25, 0.5, 0.75, 1.0]),  # free: the identity too
        (lambda: PWLCalibrator(5, 2.0, 4.0, 1, convexity=1), [2.0, 2.5, 3.0, 3.5, 4.0]),
        (lambda: PWLCalibrator(5, 2.0, 4.0, 0, convexity=-1), [2.0, 2.5, 3.0, 3.5, 4.0]),
        (
            lambda: PWLCalibrator(input_keypoints=[0.0, 1.0, 3.0], monotonicity=-1, convexity=1),
            [3.0, 2.0, 0.0],
        ),
        (
            lambda: PWLCalibrator(5, 0.0, 1.0, 1, 0.0, 10.0),
            [1.0, 3.0, 5.0, 7.0, 9.0],
        ),  # the middle of the bounds
        (lambda: PWLCalibrator(5, 0.0, 1.0, 0, 2.0, 4.0, convexity=1), [2.0, 2.5, 3.0, 3.5, 4.0]),
        (lambda: PWLCalibrator(5, 0.0, 1.0, 1, 2.0, 4.0, convexity=1), [2.0, 2.5, 3.0, 3.5, 4.0]),
    ],
    ids=[
        "free",
        "convex",
        "free-concave",
        "decreasing-convex-keypoints",
        "bounded",
        "bounded-free-convex",
        "bounded-convex",
    ],
)
def test_a_calibrator_starts_as_a_line_through_its_range(build, outputs):
    torch.testing.assert_close(build().keypoint_outputs().detach(), torch.tensor(outputs), atol=1e-4, rtol=0)


def test_given_keypoints_are_kept_in_float64():
    cal = PWLCalibrator(input_keypoints=[0.0, 0.1, 1.0])
    assert cal.keypoints.dtype == torch.float64 and cal.keypoints.tolist() == [0.0, 0.1, 1.0]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: PWLCalibrator(input_min=0.0, input_max=1.0),
            "give either num_keypoints, input_min and input_max, or input_keypoints",
        ),
        (
            lambda: PWLCalibrator(input_min=0.0, input_keypoints=[0.0, 1.0]),
            "give either num_keypoints, input_min and input_max, or input_keypoints",
        ),
        (
            lambda: PWLCalibrator(input_keypoints=[1.0, 0.0]),
            "input_keypoints must be strictly increasing, also when rounded to float32",
        ),
    ],
)
def test_keypoint_arguments_are_refused_word_for_word(build, message):
    with pytest.raises(ValueError) as err:
        build()
    assert str(err.value) == message
