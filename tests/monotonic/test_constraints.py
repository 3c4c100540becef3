"""Tests of what every monotone layer guarantees (fastload.monotonic.constraints states it):
adversarial training cannot break monotonicity, bfloat16 stays monotone, NaN inputs give NaN,
states with other constraints are refused, bad arguments and shapes are ValueErrors; and of the
checks check_monotone and check_finite_parameters."""

from __future__ import annotations

import math

import pytest
import torch
from monotone_helpers import (
    assert_nondecreasing,
    base_points,
    exact_columns,
    make_optimizer,
    one_thread,  # noqa: F401 (an autouse fixture)
    randomize,
    sweep,
    sweep_values,
)
from torch import nn

from fastload.monotonic import (
    CategoricalCalibrator,
    Lattice,
    LatticeEnsemble,
    MonotoneLinear,
    PWLCalibrator,
    check_finite_parameters,
    check_monotone,
)
from fastload.monotonic.constraints import CURVATURES, as_direction, check_bounds, into_bounds, monotone_lerp
from fastload.train.models import MonotonicRegressor

MODULES = {
    # name: (factory, upper end of each input column's range, {monotone column: direction})
    "calibrator": (lambda: PWLCalibrator(8, 0.0, 1.0, 1), [1.0], {0: 1}),
    "calibrator_keypoints": (
        lambda: PWLCalibrator(input_keypoints=[0.0, 0.05, 0.1, 0.5, 0.9, 1.0], monotonicity=-1),
        [1.0],
        {0: -1},
    ),
    "calibrator_concave": (lambda: PWLCalibrator(8, 0.0, 1.0, 1, convexity="concave"), [1.0], {0: 1}),
    "lattice": (lambda: Lattice([3, 2, 4], [1, 0, 1]), [2.0, 1.0, 3.0], {0: 1, 2: 1}),
    "lattice_decreasing": (
        lambda: Lattice([3, 2, 4], ["decreasing", None, "increasing"]),
        [2.0, 1.0, 3.0],
        {0: -1, 2: 1},
    ),
    "ensemble": (
        lambda: LatticeEnsemble(5, 2, 4, 3, [1, 0, -1, 0, 1], seed=3),
        [2.0] * 5,
        {0: 1, 2: -1, 4: 1},
    ),
    "linear": (lambda: MonotoneLinear(3, 2, [1, 0, -1]), [1.0] * 3, {0: 1, 2: -1}),
}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_adversarial_training_cannot_break_monotonicity(kind, optimizer):
    """Minimise f(x + step) - f(x) along monotone columns: the best it can do is flatten f."""
    torch.manual_seed(0)
    factory, upper, monotone_columns = MODULES[kind]
    module, upper = factory(), torch.tensor(upper)
    opt = make_optimizer(optimizer, module.parameters())
    generator = torch.Generator().manual_seed(1)
    probe = base_points(upper.long() + 1, 8, generator)
    for _ in range(30):
        x = (upper + 1) * torch.rand(64, len(upper)) - 0.5
        loss = sum(
            sign * (module(x + 0.3 * nn.functional.one_hot(torch.tensor(d), len(upper))) - module(x)).mean()
            for d, sign in monotone_columns.items()
        )
        assert loss.item() >= -1e-5  # mean increase along monotone inputs: never negative
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for d, sign in monotone_columns.items():
                values = sweep_values(-1.0, upper[d].item() + 1, generator)
                eps = 0.0 if d in exact_columns(module) else 1e-5
                assert_nondecreasing(sign * sweep(module, probe, d, values), eps)


@pytest.mark.parametrize("kind", sorted(MODULES))
def test_bfloat16_forward_is_monotone(kind):
    """Interpolation runs in float32, so a bfloat16 module gives the float32 result rounded."""
    torch.manual_seed(0)
    factory, upper, monotone_columns = MODULES[kind]
    module = factory().bfloat16()
    randomize(module, seed=0, scale=1.0)
    generator = torch.Generator().manual_seed(0)
    base = base_points(torch.tensor(upper).long() + 1, 8, generator).bfloat16()
    with torch.no_grad():
        for d, sign in monotone_columns.items():
            values = sweep_values(-1.0, upper[d] + 1, generator).bfloat16()
            y = sweep(module, base, d, values)
            assert y.dtype == torch.bfloat16
            assert_nondecreasing(sign * y, eps=0.0 if d in exact_columns(module) else 1e-2)
            reference = sweep(module.float(), base.float(), d, values.float())
            module.bfloat16()
            torch.testing.assert_close(y.float(), reference, rtol=1e-2, atol=1e-2)


@pytest.mark.safety
@pytest.mark.parametrize(
    ("module", "x"),
    [
        (PWLCalibrator(4, 0.0, 1.0, 1, 0.0, 1.0), torch.tensor([0.5, math.nan, math.inf, -math.inf])),
        (
            Lattice([3, 3], [1, 0]),
            torch.tensor([[0.5, 1.0], [math.nan, 1.0], [1.0, math.inf], [0.0, -math.inf]]),
        ),
        (
            LatticeEnsemble(3, 2, 3, 3, [1, 0, 1]),
            torch.tensor(
                [[0.5, 1.0, 2.0], [1.0, math.nan, 0.0], [math.inf, 1.0, 0.0], [0.0, -math.inf, 1.0]]
            ),
        ),
    ],
)
def test_nan_inputs_give_nan_outputs_and_infinite_ones_clamp(module, x):
    """A NaN input once raised IndexError: index -9223372036854775808."""
    randomize(module, seed=0, scale=1.0)
    with torch.no_grad():
        y = module(x)
        clamped = module(x.nan_to_num(0.0, posinf=1e9, neginf=-1e9))
    assert torch.isnan(y[1]) and torch.isfinite(y[[0, 2, 3]]).all()
    torch.testing.assert_close(y[[0, 2, 3]], clamped[[0, 2, 3]])


def _ensemble_model(seed: int) -> nn.Module:
    return nn.Sequential(LatticeEnsemble(5, 2, 4, 3, [1, 0, 1, 0, 1], seed=seed))


@pytest.mark.safety
@pytest.mark.parametrize(
    ("declared", "saved", "message"),
    [
        (
            lambda: MonotoneLinear(3, 1, [1, 1, 1]),
            lambda: MonotoneLinear(3, 1, [0, 0, 0]),
            r"MonotoneLinear was declared with monotonicities \[1, 1, 1\].*\[0.0, 0.0, 0.0\]",
        ),
        (
            lambda: MonotoneLinear(3, 1, [1, -1, 0]),
            lambda: MonotoneLinear(2, 1, [1, 1]),
            "monotonicities",
        ),
        (lambda: _ensemble_model(0), lambda: _ensemble_model(1), "LatticeEnsemble '0' .*input subsets"),
    ],
)
def test_loading_a_state_with_other_constraints_is_refused(declared, saved, message):
    """A model declared monotone once loaded a non-monotone layer without a word."""
    model = declared()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        model.load_state_dict(saved().state_dict())
    if isinstance(model, MonotoneLinear):
        x = torch.zeros(2, 3)
        x[1, 0] = 1.0
        y = model(x).detach()
        assert y[0] <= y[1]  # still the declared constraint
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.safety
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_check_monotone_refuses_non_finite_outputs(bad):
    """A decreasing model with one NaN output once measured 0.0: NaN compares as nothing."""

    class DecreasingWithHole(nn.Module):
        def forward(self, images, extra):
            out = -extra[:, 0]
            out[0] = bad
            return out

    with pytest.raises(ValueError, match=r"5 of 15 outputs are NaN or infinite .* monotone input 0"):
        check_monotone(DecreasingWithHole(), torch.zeros(3, 1), torch.zeros(3, 1), num_steps=5)


def test_check_monotone_detects_a_decreasing_model():
    class Decreasing(nn.Module):
        def forward(self, images, extra):
            return images.flatten(1).sum(1) - 2.0 * extra[:, 1]

    model = Decreasing().train()
    worst = check_monotone(
        model, torch.zeros(3, 1, 2, 2), torch.zeros(3, 2), num_steps=5, sweep_range=(0.0, 1.0)
    )
    assert worst == pytest.approx(0.5)
    assert model.training


def test_check_finite_parameters_names_what_diverged():
    torch.manual_seed(0)
    model = MonotonicRegressor(num_features=2, monotone_inputs=1)
    check_finite_parameters(model)
    images, extra = torch.randn(2, 3, 16, 16), torch.rand(2, 1)
    with torch.no_grad():
        model.lattice.bank.raw[0, 0, 0, 0] = math.inf
        model.output_calibrator.raw[3] = math.nan
        assert torch.isnan(model(images, extra)).any()  # silently, before the check
    with pytest.raises(
        ValueError, match=r"lattice\.bank\.raw \(1 of 27\), output_calibrator\.raw \(1 of 10\)"
    ):
        check_finite_parameters(model)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: PWLCalibrator(1, 0.0, 1.0), "num_keypoints"),
        (lambda: PWLCalibrator(5, 1.0, 1.0), "input_min"),
        (lambda: PWLCalibrator(5, 2.0, 1.0), "input_min"),
        (lambda: PWLCalibrator(5, 0.0, 1.0, 2), "monotonicity"),
        (lambda: PWLCalibrator(5, 0.0, 1.0, 1, 0.0), "together"),
        (lambda: PWLCalibrator(5, 0.0, 1.0, 1, 1.0, 1.0), "output_min"),
        (lambda: PWLCalibrator(5, 0.0, 1.0, convexity=2), "convexity"),
        (lambda: PWLCalibrator(input_keypoints=[0.0, 1.0, 1.0]), "strictly increasing"),
        (lambda: PWLCalibrator(input_keypoints=[0.0, 1.0, 1.0 + 1e-12]), "float32"),
        (lambda: PWLCalibrator(input_keypoints=[0.0, math.inf]), "finite"),
        (lambda: PWLCalibrator(3, input_keypoints=[0.0, 1.0]), "either"),
        (lambda: PWLCalibrator(3, 0.0), "either"),
        (lambda: PWLCalibrator(3, 0.0, 1.0, missing_input_value=math.nan), "missing_input_value"),
        (lambda: CategoricalCalibrator(0), "num_categories"),
        (lambda: CategoricalCalibrator(3, "upward"), "monotonicity"),
        (lambda: MonotoneLinear(3, 2, [1, 2, 0]), "monotonicities"),
        (lambda: MonotoneLinear(3, 2, [1, 0]), "3"),
        (lambda: MonotoneLinear(0, 2, 1), "in_features"),
        (lambda: Lattice([3, 1], [1, 0]), "lattice_sizes"),
        (lambda: Lattice([], []), "lattice_sizes"),
        (lambda: Lattice([3, 3], [1]), "monotonicities"),
        (lambda: Lattice([3, 3], [1, 2]), "monotonicities"),
        (lambda: Lattice([3, 3], [1, "up"]), "monotonicities"),
        (lambda: Lattice([3, 3], [1, 0], 1.0, None), "together"),
        (lambda: LatticeEnsemble(6, 2, 2, 3, [0] * 6), "cover"),
        (lambda: LatticeEnsemble(3, 4, 2, 3, [0] * 3), "lattice_rank"),
        (lambda: LatticeEnsemble(3, 2, 2, 1, [0] * 3), "lattice_size"),
        (lambda: LatticeEnsemble(3, 2, 2, 3, [0, 2, 1]), "monotonicities"),
        (lambda: MonotonicRegressor(num_features=0), "num_features"),
        (lambda: MonotonicRegressor(lattice_size=1), "lattice_size"),
        (lambda: MonotonicRegressor(monotone_inputs=-1), "monotone_inputs"),
        (
            lambda: MonotonicRegressor(monotone_inputs=2, monotone_input_range=[(0.0, 1.0)]),
            "monotone_input_range",
        ),
    ],
)
def test_bad_arguments_raise_value_error(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    ("module", "x"),
    [
        (PWLCalibrator(4, 0.0, 1.0), torch.rand(5, 2)),
        (PWLCalibrator(4, 0.0, 1.0), torch.rand(5, 1, 1)),
        (Lattice([3, 3], [1, 0]), torch.rand(5, 3)),
        (Lattice([3, 3], [1, 0]), torch.rand(5)),
        (LatticeEnsemble(4, 2, 2, 3, [1, 0, 0, 1]), torch.rand(5, 3)),
    ],
)
def test_wrong_input_shapes_raise_value_error(module, x):
    with pytest.raises(ValueError, match="shape"):
        module(x)


# The maps and checks of fastload.monotonic.constraints on their own


def test_into_bounds_maps_onto_any_interval():
    raw = torch.tensor([-100.0, 0.0, 100.0])
    assert into_bounds(raw, -3.0, 5.0).tolist() == [-3.0, 1.0, 5.0]
    assert torch.equal(into_bounds(raw, None, None), raw)
    layer = PWLCalibrator(8, 0.0, 1.0, 1, output_min=-2.0, output_max=-1.0)
    out = layer(torch.linspace(-1.0, 2.0, 50))
    assert ((out > -2.0) & (out < -1.0)).all()


def test_monotone_lerp_stays_between_its_ends_when_the_fraction_rounds_past_them():
    a, b = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 0.0, 2.0])
    past = torch.tensor([1.0000001, 1.0000001, 1.0000001])
    assert monotone_lerp(a, b, past).tolist() == [1.0, 0.0, 2.0]
    assert monotone_lerp(a, b, -past + 1 - 1e-7).tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("value", "direction"),
    [("Increasing", 1), ("DECREASING", -1), ("None", 0), (None, 0), (1.0, 1), (-1.0, -1), (0, 0), (True, 1)],
)
def test_as_direction_reads_names_in_any_case_and_whole_numbers(value, direction):
    got = as_direction(value)
    assert got == direction and type(got) is int
    assert as_direction("Convex", CURVATURES) == 1 and as_direction("concave", CURVATURES) == -1


@pytest.mark.parametrize("value", ["up", 1.5, [1], "increasingly"])
def test_as_direction_leaves_what_it_cannot_read_for_the_callers_error(value):
    assert as_direction(value) == value
    with pytest.raises(ValueError) as err:
        MonotoneLinear(2, 1, [1, value])
    assert str(err.value) == (
        f"monotonicities must contain only (-1, 0, 1) (or 'increasing', 'decreasing', None), got {[value]!r}"
    )


def test_a_monotonicity_given_as_a_float_is_stored_as_an_int():
    calibrator = PWLCalibrator(4, 0.0, 1.0, monotonicity=-1.0)
    assert calibrator.monotonicity == -1 and "monotonicity=-1," in repr(calibrator)
    with pytest.raises(ValueError, match=r"^monotonicity must be -1, 0 or 1, got 0\.5$"):
        PWLCalibrator(4, 0.0, 1.0, monotonicity=0.5)


@pytest.mark.parametrize(
    "module", [PWLCalibrator(2, 0.0, 1.0), Lattice([2, 2], [1, 0]), Lattice([2], [1])], ids=repr
)
def test_a_nan_input_of_the_smallest_layers_gives_nan_not_an_index_error(module):
    x = (
        torch.tensor([math.nan])
        if isinstance(module, PWLCalibrator)
        else torch.full((1, len(module.lattice_sizes)), math.nan)
    )
    assert torch.isnan(module(x)).all()


def test_bounds_must_come_together_word_for_word():
    with pytest.raises(ValueError) as err:
        check_bounds(0.0, None)
    assert str(err.value) == "output_min and output_max must be given together"


def test_a_state_saved_in_float64_loads_into_a_float32_layer():
    torch.manual_seed(0)
    saved = MonotoneLinear(3, 2, [1, 0, -1]).double()
    layer = MonotoneLinear(3, 2, [1, 0, -1])
    layer.load_state_dict(saved.state_dict())
    torch.testing.assert_close(layer.weight, saved.weight.float())  # softplus rounds in either dtype


def test_a_refused_state_names_the_submodule_and_what_to_do():
    class Model(nn.Module):
        def __init__(self, signs):
            super().__init__()
            self.head = MonotoneLinear(2, 1, signs)

    with pytest.raises(ValueError) as err:
        Model([1, 1]).load_state_dict(Model([1, -1]).state_dict())
    assert str(err.value) == (
        "MonotoneLinear 'head' was declared with monotonicities [1, 1], but the state to load has "
        "[1.0, -1.0]; constraints are part of the model's declaration: build the model with the same "
        "arguments as the saved one"
    )


def test_check_finite_parameters_says_what_to_do():
    layer = MonotoneLinear(2, 1, [1, 1])
    with torch.no_grad():
        layer.bias.fill_(math.nan)
    with pytest.raises(ValueError) as err:
        check_finite_parameters(layer)
    assert str(err.value) == (
        "non-finite parameters (NaN or infinite values) in bias (1 of 1): training diverged; "
        "lower the learning rate or resume from an earlier checkpoint"
    )
