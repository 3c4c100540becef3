"""The native CPU kernel (`_core.augment`, the float32 CPU path of Augment) against the torch
grid_sample path that every other device and dtype runs: each op alone and all together, 1 and
3 channels, odd sizes, empty and single batches, random sizes and parameters; and its refusals.

Tolerance: the paths differ by float32 rounding only. Source positions are rounded
differently (float64 tables in the kernel, a float32 grid in torch), which moves a bilinear
sample by the pixel's gradient (up to 255 on noise) times ~1e-4 pixel; jitter sums in another
order. Largest differences seen, in 0–255 levels, on noise, 384x384 -> 224 with every op
(2026-12-03): kernel vs torch float32 0.026 (0.014 without rotation), kernel vs torch float64
0.012 (9e-5 without rotation), torch float32 vs torch float64 itself 0.018. TOLERANCE is 0.05
levels (2e-4 of the 0-1 range)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload import Augment, _core, to_device

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TOLERANCE = 0.05  # 0-255 levels


def noise(n, h, w, c, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8))


def torch_path(monkeypatch):
    """Makes the float32 CPU path run the torch ops instead of the kernel."""
    monkeypatch.setattr(Augment, "_apply_native", Augment._apply_torch)


def in_levels(x, std):
    """Normalised output back to 0-255 units, so differences read as pixel levels."""
    return x.double() * torch.tensor(std, dtype=torch.float64).view(1, -1, 1, 1) * 255


def compare(aug, images, monkeypatch, keys=None, epoch=3, mean=MEAN, std=STD):
    """Max |kernel - torch path| in 0-255 units, after checking layout and dtype agree."""
    channels = images.shape[3]
    mean, std = mean[:channels], std[:channels]
    keys = torch.arange(len(images)) * 7 + 5 if keys is None else keys
    native = to_device(images, "cpu", mean=mean, std=std, augment=aug, keys=keys, epoch=epoch)
    with monkeypatch.context() as m:
        torch_path(m)
        reference = to_device(images, "cpu", mean=mean, std=std, augment=aug, keys=keys, epoch=epoch)
    wide = to_device(
        images, "cpu", dtype=torch.float64, mean=mean, std=std, augment=aug, keys=keys, epoch=epoch
    )
    assert native.dtype == torch.float32 and native.shape == reference.shape
    assert native.is_contiguous(memory_format=torch.channels_last) or not aug.active
    if native.numel() == 0:
        return 0.0
    assert torch.isfinite(native).all()
    errors = [
        (in_levels(native, std) - in_levels(other, std)).abs().max().item() for other in (reference, wide)
    ]
    assert max(errors) <= TOLERANCE, errors
    return max(errors)


OPS = {
    "crop": dict(size=(13, 9), scale=(0.1, 1.0)),
    "resize": dict(size=(31, 17)),
    "hflip": dict(hflip=1.0),
    "vflip": dict(vflip=1.0),
    "rotate": dict(degrees=40.0),
    "translate": dict(translate=0.3),
    "brightness": dict(brightness=0.6),
    "contrast": dict(contrast=0.6),
    "saturation": dict(saturation=0.9),
    "all": dict(
        size=(15, 21),
        scale=(0.2, 1.0),
        hflip=0.5,
        vflip=0.5,
        degrees=25.0,
        translate=0.2,
        brightness=0.5,
        contrast=0.5,
        saturation=0.5,
    ),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [0, 1, 7])
def test_each_op_matches_the_torch_path_on_rgb(op, n, monkeypatch):
    compare(Augment(seed=n, **OPS[op]), noise(n, 19, 23, 3, seed=n), monkeypatch)


def test_the_benchmarks_sizes_match_the_torch_path(monkeypatch):
    every = Augment(
        size=224, scale=(0.08, 1.0), hflip=0.5, degrees=10, brightness=0.4, contrast=0.4, saturation=0.4
    )
    compare(every, noise(3, 384, 384, 3), monkeypatch)


@pytest.mark.parametrize("op", ["crop", "resize", "hflip", "vflip", "rotate", "translate", "brightness"])
def test_single_channel_matches_the_torch_path(op, monkeypatch):
    compare(Augment(**OPS[op]), noise(5, 17, 11, 1), monkeypatch, mean=(0.5,), std=(0.25,))


def test_jitter_alone_is_exact_where_the_factors_are_one(monkeypatch):
    # no geometry: the kernel converts the pixels themselves, as the torch path does
    images = noise(3, 9, 8, 3)
    aug = Augment(brightness=0.3)
    draws = aug.params(torch.arange(3), 0, 9, 8)
    got = aug(images, torch.arange(3), 0)
    ref = (images.permute(0, 3, 1, 2).double() * draws["brightness"].double().view(-1, 1, 1, 1)).clamp(0, 255)
    torch.testing.assert_close(got.double() * 255, ref, atol=TOLERANCE, rtol=0)


def test_strong_jitter_clamps_like_the_torch_path(monkeypatch):
    # strengths above 1 draw factors below 0 (floored at 0) and far above 1 (clamped at 255)
    aug = Augment(brightness=1.8, contrast=1.5, saturation=1.0)
    compare(aug, noise(16, 10, 12, 3), monkeypatch)
    factors = aug.params(torch.arange(500), 0, 4, 4)
    assert factors["brightness"].min() == 0 and factors["contrast"].min() == 0


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 4),
    height=st.integers(1, 24),
    width=st.integers(1, 24),
    rgb=st.booleans(),
    size=st.none() | st.tuples(st.integers(1, 24), st.integers(1, 24)),
    crop=st.none() | st.floats(0.05, 1.0),
    flips=st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from([0.0, 0.5, 1.0])),
    degrees=st.sampled_from([0.0, 5.0, 90.0, 180.0]),
    translate=st.sampled_from([0.0, 0.25]),
    jitter=st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)),
    seed=st.integers(0, 2**32),
)
def test_random_batches_and_parameters_match_the_torch_path(
    n, height, width, rgb, size, crop, flips, degrees, translate, jitter, seed
):
    channels = 3 if rgb else 1
    brightness, contrast, saturation = jitter if rgb else (jitter[0], 0.0, 0.0)
    aug = Augment(
        size=size,
        scale=None if crop is None else (crop, 1.0),
        hflip=flips[0],
        vflip=flips[1],
        degrees=degrees,
        translate=translate,
        brightness=brightness,
        contrast=contrast,
        saturation=saturation,
        seed=seed % 1000,
    )
    with pytest.MonkeyPatch.context() as monkeypatch:
        compare(aug, noise(n, height, width, channels, seed=seed), monkeypatch, epoch=seed % 5)


def test_other_channel_counts_and_dtypes_take_the_torch_path():
    images = noise(2, 6, 5, 4)
    out = Augment(hflip=1.0)(images, [0, 1], 0)  # 4 channels: no kernel, still augmented
    torch.testing.assert_close(out, images.permute(0, 3, 1, 2).float().flip(3) / 255, atol=1e-6, rtol=0)


def test_non_contiguous_batches_are_copied_not_misread(monkeypatch):
    images = noise(4, 20, 18, 3)[:, ::2, 1::2]
    assert not images.is_contiguous()
    compare(Augment(size=7, scale=(0.3, 1.0), hflip=0.5, contrast=0.4), images, monkeypatch)


def test_the_default_path_gives_the_same_records_whatever_the_batch():
    images = noise(9, 16, 16, 3)
    aug = Augment(
        size=8, scale=(0.2, 1.0), hflip=0.5, degrees=15, brightness=0.4, contrast=0.4, saturation=0.4
    )
    whole = aug(images, torch.arange(9), 2)
    for part in (slice(0, 1), slice(1, 8), slice(8, 9)):
        assert torch.equal(aug(images[part], torch.arange(9)[part], 2), whole[part])


# The binding's refusals: ValueError with the reason, never a crash


def arguments(n=2, h=5, w=4, c=3, oh=3, ow=3):
    return dict(
        images=np.zeros((n, h, w, c), np.uint8),
        theta=np.tile(np.array([[1, 0, 0], [0, 1, 0]], np.float32), (n, 1, 1)),
        colour=np.ones((n, 3), np.float32),
        scale=np.ones(c, np.float32),
        shift=np.zeros(c, np.float32),
        out=np.zeros((n, oh, ow, c), np.float32),
    )


def call(**changes):
    args = {**arguments(), **changes}
    return _core.augment(
        args["images"], args["theta"], args["colour"], args["scale"], args["shift"], args["out"]
    )


def test_the_binding_writes_out():
    args = arguments()
    args["images"][:] = 200
    _core.augment(*args.values())
    assert (args["out"] == 200).all()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(images=np.zeros((2, 5, 4, 3), np.float32)), "images must be a uint8 array"),
        (dict(images=np.zeros((2, 5, 4), np.uint8)), "images must be a uint8 array"),
        (dict(images=np.zeros((2, 5, 8, 3), np.uint8)[:, :, ::2]), "images must be C-contiguous"),
        (dict(images=[[1, 2]]), "images must be a uint8 array"),
        (dict(theta=np.zeros((2, 3, 2), np.float32)), r"theta must be 2×2×3"),
        (dict(theta=np.zeros((2, 2, 3), np.float64)), "theta must be a float32 array"),
        (dict(theta=np.full((2, 2, 3), np.nan, np.float32)), "must be finite"),
        (dict(colour=np.ones((3, 3), np.float32)), r"colour must be 2×3"),
        (dict(scale=np.ones(2, np.float32)), "scale and shift need 3 values"),
        (dict(out=np.zeros((2, 3, 3, 1), np.float32)), "out must have 2 images of 3 channels"),
        (dict(out=np.zeros((2, 3, 3, 3), np.float64)), "out must be a writable float32"),
        (dict(out=np.zeros((2, 3, 6, 3), np.float32)[:, :, ::2]), "out must be C-contiguous"),
        (
            dict(images=np.zeros((2, 5, 4, 4), np.uint8), out=np.zeros((2, 3, 3, 4), np.float32)),
            "1 or 3 channels",
        ),
        (dict(theta=None), "without theta the output must be the input's size"),
        (
            dict(
                images=np.zeros((2, 5, 4, 1), np.uint8),
                out=np.zeros((2, 3, 3, 1), np.float32),
                scale=np.ones(1, np.float32),
                shift=np.zeros(1, np.float32),
                colour=np.array([[1, 0.5, 1], [1, 1, 1]], np.float32),
            ),
            "need RGB",
        ),
    ],
)
def test_the_binding_refuses_bad_arguments_with_the_reason(changes, message):
    with pytest.raises(ValueError, match=message):
        call(**changes)


def test_the_binding_refuses_a_read_only_out():
    out = np.zeros((2, 3, 3, 3), np.float32)
    out.setflags(write=False)
    with pytest.raises(ValueError, match="out must be a writable"):
        call(out=out)


# Recycled output memory: the CPU float32 path writes each batch into memory from a small pool,
# which goes back to the pool only when the batch and every view of it are gone.

RECYCLE_AUG = Augment(size=24, scale=(0.3, 1.0), hflip=0.5, brightness=0.3, saturation=0.3)


def augmented(images, step):
    return to_device(images, "cpu", mean=MEAN, std=STD, augment=RECYCLE_AUG, keys=torch.arange(4) + step)


def test_a_live_batch_and_its_views_are_never_overwritten_by_the_next():
    images = noise(4, 40, 40, 3)
    first = augmented(images, 0)
    kept = first.clone()
    row_view, array_view = first[1, :, 3], first.numpy()  # views hold the memory, not `first`
    del first
    later = [augmented(images, step) for step in range(1, 6)]
    assert torch.equal(row_view, kept[1, :, 3])
    assert np.array_equal(array_view, kept.numpy())
    assert len({x.data_ptr() for x in later}) == len(later), "live batches share no memory"
    assert all(x.data_ptr() != array_view.ctypes.data for x in later)
    assert all(torch.equal(x, augmented(images, step)) for step, x in enumerate(later, start=1))


def test_a_released_batch_is_reused_and_written_whole():
    images = noise(4, 40, 40, 3, seed=1)
    first = augmented(images, 0)
    address = first.data_ptr()
    first.fill_(float("nan"))  # whatever the last user left must not show through
    del first
    second = augmented(images, 9)
    assert second.data_ptr() == address
    assert torch.isfinite(second).all()
    assert torch.equal(second, augmented(images, 9).clone())


def test_the_pool_keeps_a_bounded_number_of_idle_buffers():
    images = noise(4, 40, 40, 3, seed=2)
    batches = [augmented(images, step) for step in range(20)]
    del batches
    count, size = _core.recycled_idle()
    assert 1 <= count <= 4 and size <= 1 << 30


def test_recycled_batches_behave_as_ordinary_tensors():
    images = noise(4, 40, 40, 3, seed=3)
    x = augmented(images, 0)
    assert x.is_contiguous(memory_format=torch.channels_last) and x.dtype == torch.float32
    assert x.requires_grad_().sum().backward() is None and x.grad is not None
    shared = augmented(images, 0).share_memory_()
    assert shared.is_shared() and torch.equal(shared, x.detach())


def test_recycled_float32_refuses_sizes_that_overflow():
    with pytest.raises(ValueError, match="too large"):
        _core.recycled_float32((1 << 40, 1 << 40, 1, 1))
    with pytest.raises(MemoryError, match="cannot allocate"):
        _core.recycled_float32((1 << 20, 1 << 20, 1 << 10, 1))
