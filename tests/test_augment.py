"""Augment as training sees it: each op's geometry and colour against references (torchvision's
functional transforms where installed, hand-written NumPy ones always), draws that depend only on
(seed, epoch, record) across batch sizes, DataLoader workers, ranks and resumes, the no-op
Augment, the spec parser, bad arguments, and the preview PNG (API and CLI)."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import fastload
from fastload import Augment, FastLoadDataset, StoreWriter, cli, to_device
from fastload.augment import MAX_JITTER, MAX_SIDE, _signed, _splitmix64_int, splitmix64, uniforms
from fastload.preview import save_preview

try:
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as TF
except ImportError:
    TF = None
needs_torchvision = pytest.mark.skipif(TF is None, reason="torchvision is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")

N = 70  # does not divide by the batch sizes used here


def write_store(path, n, shape=(12, 10, 3), seed=0):
    images = np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)
    with StoreWriter(path, shape, label_dtype="int64") as w:
        w.extend(images, np.arange(n))
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("aug") / "s.bin", N)


def smooth_images(n=3, h=24, w=20, seed=0):
    """uint8 images with smooth content plus noise, so bilinear differences show."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([np.sin(xx / 3.0 + k) * np.cos(yy / 4.0 - k) for k in range(3)], axis=-1)
    out = (127.5 + 100 * base[None] + rng.normal(0, 15, (n, h, w, 3))).clip(0, 255)
    return torch.from_numpy(out.astype(np.uint8))


def fixed(aug, **draws):
    """`aug` with its draws replaced by `draws` (one value per image), to compare one op."""
    real = aug.params

    def params(keys, epoch, height, width):
        p = real(keys, epoch, height, width)
        for name, value in draws.items():
            p[name] = torch.as_tensor(value, dtype=p[name].dtype).expand(len(keys)).clone()
        return p

    aug.params = params
    return aug


def bilinear(img, source):
    """Hand reference: H×W×C float image sampled at source(y, x) -> (sy, sx) in continuous pixel
    coordinates (pixel centres at k + 0.5), bilinear, coordinates clamped to the image."""
    h, w = img.shape[:2]
    out_h, out_w = source.shape[:2]
    sy = np.clip(source[..., 0] - 0.5, 0, h - 1)
    sx = np.clip(source[..., 1] - 0.5, 0, w - 1)
    y0, x0 = np.floor(sy).astype(int), np.floor(sx).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (sy - y0)[..., None], (sx - x0)[..., None]
    top = img[y0, x0] * (1 - fx) + img[y0, x1] * fx
    bottom = img[y1, x0] * (1 - fx) + img[y1, x1] * fx
    return top * (1 - fy) + bottom * fy


def centres(out_h, out_w):
    yy, xx = np.mgrid[0:out_h, 0:out_w]
    return yy + 0.5, xx + 0.5


def as_hwc(batch):
    return batch.permute(0, 2, 3, 1).numpy().astype(np.float64)


# The counter-based hash


def test_splitmix64_matches_the_reference_sequence():
    # splitmix64's first outputs from state 0 (Vigna's reference implementation).
    expected = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    states = torch.tensor([_signed(k * 0x9E3779B97F4A7C15) for k in range(3)])
    got = [v % (1 << 64) for v in splitmix64(states).tolist()]
    assert got == expected
    assert [_splitmix64_int(s % (1 << 64)) for s in states.tolist()] == expected


@given(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), min_size=1, max_size=20))
def test_tensor_and_integer_splitmix64_agree(values):
    got = [v % (1 << 64) for v in splitmix64(torch.tensor(values, dtype=torch.int64)).tolist()]
    assert got == [_splitmix64_int(v % (1 << 64)) for v in values]


def test_uniforms_are_uniform_and_depend_on_every_input():
    keys = torch.arange(20000)
    u = uniforms(0, 0, keys)
    assert u.dtype == torch.float32 and u.min() >= 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    assert abs(torch.corrcoef(u[:, :2].T)[0, 1].item()) < 0.03  # slots are independent
    assert abs(torch.corrcoef(torch.stack([u[:-1, 0], u[1:, 0]]))[0, 1].item()) < 0.03  # so are keys
    for other in (uniforms(1, 0, keys), uniforms(0, 1, keys), uniforms(0, 0, keys + 1)):
        assert (other != u).float().mean() > 0.99
    assert torch.equal(uniforms(0, 0, keys[[5, 3, 5]]), u[[5, 3, 5]])
    epochs = [uniforms(0, epoch, keys[:100]) for epoch in range(4)]  # every epoch draws anew
    assert all(not torch.equal(epochs[a], epochs[b]) for a in range(4) for b in range(a))
    assert torch.equal(uniforms(0, 0, keys.to(torch.int32)), u)  # a key is its value, whatever its dtype


# Geometry against references


def test_flips_match_torch_flip_exactly_enough():
    images = smooth_images()
    plain = to_device(images, "cpu")
    h = Augment(hflip=1.0)(images, torch.arange(3), 0)
    v = Augment(vflip=1.0)(images, torch.arange(3), 0)
    torch.testing.assert_close(h, plain.flip(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(v, plain.flip(2), atol=1e-5, rtol=0)
    draws = Augment(hflip=0.5).params(torch.arange(2000), 0, 24, 20)["hflip"]
    assert 0.45 < draws.float().mean() < 0.55


@pytest.mark.parametrize("box", [(0.0, 0.0, 24.0, 20.0), (3.0, 2.0, 12.0, 15.0), (5.25, 1.5, 9.5, 7.75)])
@pytest.mark.parametrize("size", [(16, 16), (30, 11)])
def test_crop_matches_a_hand_bilinear_reference(box, size):
    top, left, box_h, box_w = box
    images = smooth_images()
    aug = fixed(Augment(size=size, scale=(0.5, 1.0)), top=top, left=left, box_h=box_h, box_w=box_w)
    got = as_hwc(aug(images, torch.arange(3), 0))
    yy, xx = centres(*size)
    source = np.stack([top + yy * box_h / size[0], left + xx * box_w / size[1]], axis=-1)
    for i in range(3):
        ref = bilinear(images[i].numpy().astype(np.float64) / 255, source)
        np.testing.assert_allclose(got[i], ref, atol=1e-5)


@needs_torchvision
@pytest.mark.parametrize("box", [(0, 0, 24, 20), (3, 2, 12, 15), (6, 4, 18, 10)])
def test_crop_matches_torchvision_resized_crop(box):
    top, left, box_h, box_w = box
    images = smooth_images()
    aug = fixed(Augment(size=(16, 14), scale=(0.5, 1.0)), top=top, left=left, box_h=box_h, box_w=box_w)
    got = aug(images, torch.arange(3), 0)
    for i in range(3):
        src = images[i].permute(2, 0, 1).float() / 255
        ref = TF.resized_crop(
            src, top, left, box_h, box_w, [16, 14], InterpolationMode.BILINEAR, antialias=False
        )
        # torchvision clamps to the crop, we read the image around it: compare inside.
        torch.testing.assert_close(got[i, :, 1:-1, 1:-1], ref[:, 1:-1, 1:-1], atol=1e-5, rtol=0)
        if box == (0, 0, 24, 20):  # the whole image: same clamping, so equal everywhere
            torch.testing.assert_close(got[i], ref, atol=1e-5, rtol=0)


def test_crop_boxes_follow_random_resized_crop():
    aug = Augment(scale=(0.2, 0.6), ratio=(0.5, 2.0))
    p = aug.params(torch.arange(5000), 3, 40, 30)
    area = p["box_h"] * p["box_w"] / (40 * 30)
    square = aug.params(torch.arange(5000), 3, 40, 40)
    ratio = p["box_w"] / p["box_h"]
    assert area.min() >= 0.2 - 1e-5 and area.max() <= 0.6 + 1e-5
    assert ratio.min() >= 0.5 - 1e-5 and ratio.max() <= 2.0 + 1e-5
    assert (p["box_h"] <= 40).all() and (p["box_w"] <= 30).all()
    assert (p["top"] >= 0).all() and (p["top"] + p["box_h"] <= 40 + 1e-4).all()
    assert (p["left"] >= 0).all() and (p["left"] + p["box_w"] <= 30 + 1e-4).all()
    # log-uniform ratio: on a square image as many boxes wider than tall as taller than wide
    assert 0.45 < (square["box_w"] > square["box_h"]).float().mean() < 0.55


def test_impossible_crops_fall_back_to_torchvisions_centre_crop():
    # No box of the whole area with w/h >= 3 fits a 10x10 image: the image is narrower than
    # the ratios (1 < 3), so the box takes the full width and height W / 3.
    p = Augment(scale=(1.0, 1.0), ratio=(3.0, 4.0)).params(torch.arange(50), 0, 10, 10)
    torch.testing.assert_close(p["box_w"], torch.full((50,), 10.0))
    torch.testing.assert_close(p["box_h"], torch.full((50,), 10 / 3))


def test_crop_areas_span_the_scale_and_a_box_that_never_fits_is_the_fallback():
    """scale=(0.9, 1) on a 40x30 image: a box fits in a few of the 10 tries (about 4% each);
    the others take torchvision's fallback, here the whole image (4/3 lies within the ratios)."""
    p = Augment(scale=(0.9, 1.0), ratio=(0.3, 3.0)).params(torch.arange(2000), 0, 40, 30)
    whole = (p["box_h"] == 40) & (p["box_w"] == 30)
    fitted = ~whole
    assert 0.1 < fitted.float().mean() < 0.9  # both kinds in one batch
    area = p["box_h"][fitted] * p["box_w"][fitted] / (40 * 30)
    assert (p["box_h"][fitted] <= 40).all() and (p["box_w"][fitted] <= 30).all()
    assert area.min() >= 0.9 - 1e-5
    spread = Augment(scale=(0.2, 0.6)).params(torch.arange(2000), 0, 40, 30)
    area = spread["box_h"] * spread["box_w"] / (40 * 30)
    assert area.min() < 0.25 and area.max() > 0.55  # the whole scale range is drawn


def test_impossible_crops_of_a_wide_image_fall_back_to_its_full_height():
    # No box of the whole area with w/h <= 1/3 fits a 10x10 image, wider than the ratios: the
    # box takes the full height and width H * 1/3.
    p = Augment(scale=(1.0, 1.0), ratio=(0.25, 1 / 3)).params(torch.arange(50), 0, 10, 10)
    torch.testing.assert_close(p["box_h"], torch.full((50,), 10.0))
    torch.testing.assert_close(p["box_w"], torch.full((50,), 10 / 3))


def test_angles_and_shifts_are_drawn_over_their_whole_ranges():
    p = Augment(degrees=30.0, translate=0.25).params(torch.arange(4000), 0, 40, 32)
    for name, bound in (("angle", 30.0), ("shift_x", 0.25 * 32), ("shift_y", 0.25 * 40)):
        draws = p[name]
        assert draws.min() >= -bound and draws.max() <= bound, name
        assert draws.min() < -0.98 * bound and draws.max() > 0.98 * bound, name
        assert abs(draws.mean()) < 0.05 * bound, name


def test_a_flip_probability_of_zero_never_flips_even_at_the_draw_zero(monkeypatch):
    monkeypatch.setattr(fastload.augment, "uniforms", lambda seed, epoch, keys: torch.zeros((len(keys), 64)))
    p = Augment(hflip=0.0, vflip=0.0).params(torch.arange(3), 0, 8, 8)
    assert not p["hflip"].any() and not p["vflip"].any()


@pytest.mark.parametrize("height,width", [(20, 10), (10, 20)])
def test_a_crop_box_that_fits_exactly_is_taken(monkeypatch, height, width):
    """Every draw 0.5: half the area of the image, square (the middle of ratios 1/4 to 4), so
    the 10x10 box touches two sides; it fits (torchvision's `w <= width`) and no fallback
    (the whole image) replaces it."""
    monkeypatch.setattr(
        fastload.augment, "uniforms", lambda seed, epoch, keys: torch.full((len(keys), 64), 0.5)
    )
    p = Augment(scale=(0.5, 0.5), ratio=(0.25, 4.0)).params(torch.arange(3), 0, height, width)
    torch.testing.assert_close(p["box_h"], torch.full((3,), 10.0), rtol=0, atol=0)
    torch.testing.assert_close(p["box_w"], torch.full((3,), 10.0), rtol=0, atol=0)


@pytest.mark.parametrize("angle", [90.0, -30.0, 12.5])
def test_rotation_matches_a_hand_reference(angle):
    images = smooth_images(h=20, w=20)
    got = as_hwc(fixed(Augment(degrees=45.0), angle=angle)(images, torch.arange(3), 0))
    yy, xx = centres(20, 20)
    # counter-clockwise on screen (y down): the source of q is R(-angle) q about the centre
    t = math.radians(angle)
    dy, dx = yy - 10, xx - 10
    source = np.stack(
        [10 + math.sin(t) * dx + math.cos(t) * dy, 10 + math.cos(t) * dx - math.sin(t) * dy], axis=-1
    )
    for i in range(3):
        np.testing.assert_allclose(got[i], bilinear(images[i].numpy() / 255.0, source), atol=1e-5)


@needs_torchvision
@pytest.mark.parametrize("angle", [90.0, -30.0, 12.5])
def test_rotation_matches_torchvision_rotate(angle):
    images = smooth_images(h=20, w=20)
    got = fixed(Augment(degrees=45.0), angle=angle)(images, torch.arange(3), 0)
    for i in range(3):
        src = images[i].permute(2, 0, 1).float() / 255
        ref = TF.rotate(src, angle, InterpolationMode.BILINEAR)
        inside = TF.rotate(torch.ones(1, 20, 20), angle, InterpolationMode.BILINEAR) > 1 - 1e-6
        assert inside.sum() > 150
        torch.testing.assert_close(
            got[i][inside.expand(3, -1, -1)], ref[inside.expand(3, -1, -1)], atol=1e-4, rtol=0
        )


@needs_torchvision
def test_translation_and_composition_match_torchvision():
    images = smooth_images(h=24, w=20)
    aug = fixed(
        Augment(size=(16, 16), scale=(0.5, 1.0), hflip=0.5, degrees=30.0, translate=0.2),
        top=4,
        left=2,
        box_h=16,
        box_w=16,
        hflip=True,
        angle=20.0,
        shift_x=3.0,
        shift_y=-2.0,
    )
    got = aug(images, torch.arange(3), 0)
    for i in range(3):
        src = images[i].permute(2, 0, 1).float() / 255
        step = TF.resized_crop(src, 4, 2, 16, 16, [16, 16], InterpolationMode.BILINEAR, antialias=False)
        # TF.affine turns clockwise (TF.rotate and Augment counter-clockwise), then shifts.
        ref = TF.affine(TF.horizontal_flip(step), -20.0, [3, -2], 1.0, [0.0, 0.0], InterpolationMode.BILINEAR)
        ones = TF.affine(torch.ones(1, 16, 16), -20.0, [3, -2], 1.0, [0.0, 0.0], InterpolationMode.BILINEAR)
        inside = (ones > 1 - 1e-6).expand(3, -1, -1).clone()
        inside[:, [0, -1], :] = False  # the crop's edge rows/columns clamp differently
        inside[:, :, [0, -1]] = False
        assert inside.sum() > 300
        torch.testing.assert_close(got[i][inside], ref[inside], atol=1e-4, rtol=0)


def test_translation_moves_the_image_by_the_drawn_pixels():
    images = smooth_images(h=20, w=20)
    got = fixed(Augment(translate=0.3), shift_x=4.0, shift_y=-3.0)(images, torch.arange(3), 0)
    plain = to_device(images, "cpu")
    torch.testing.assert_close(got[:, :, 0:17, 4:20], plain[:, :, 3:20, 0:16], atol=1e-5, rtol=0)


# Colour against references


def hand_jitter(img, brightness, contrast, saturation):
    """ColorJitter's formulas on an H×W×3 float image in [0, 1], in Augment's order."""
    gray = lambda x: x @ np.array([0.2989, 0.587, 0.114])  # noqa: E731
    img = np.clip(img * brightness, 0, 1)
    img = np.clip(contrast * img + (1 - contrast) * gray(img).mean(), 0, 1)
    return np.clip(saturation * img + (1 - saturation) * gray(img)[..., None], 0, 1)


@pytest.mark.parametrize("factors", [(1.3, 1.0, 1.0), (1.0, 0.6, 1.0), (1.0, 1.0, 1.7), (0.7, 1.4, 0.2)])
def test_jitter_matches_colorjitter_formulas(factors):
    images = smooth_images()
    b, c, s = factors
    aug = fixed(Augment(brightness=0.5, contrast=0.5, saturation=0.9), brightness=b, contrast=c, saturation=s)
    got = as_hwc(aug(images, torch.arange(3), 0))
    for i in range(3):
        ref = hand_jitter(images[i].numpy() / 255.0, b, c, s)
        np.testing.assert_allclose(got[i], ref, atol=1e-5)
        if TF is not None:
            src = images[i].permute(2, 0, 1).float() / 255
            tv = TF.adjust_saturation(TF.adjust_contrast(TF.adjust_brightness(src, b), c), s)
            np.testing.assert_allclose(got[i], tv.permute(1, 2, 0).numpy(), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_jitter_matches_colorjitter_formulas_on_the_torch_path(dtype):
    """Every dtype but float32 (and CUDA) runs the torch ops, whose grey is their own: the same
    ITU-R 601 weights as the CPU kernel and torchvision."""
    images = smooth_images()
    aug = fixed(
        Augment(brightness=0.5, contrast=0.5, saturation=0.9), brightness=1.1, contrast=0.6, saturation=1.7
    )
    got = as_hwc(aug(images, torch.arange(3), 0, dtype=dtype).double())
    for i in range(3):
        ref = hand_jitter(images[i].numpy() / 255.0, 1.1, 0.6, 1.7)
        np.testing.assert_allclose(got[i], ref, atol=1e-5 if dtype == torch.float64 else 4e-3)


def test_jitter_factors_span_their_range():
    p = Augment(brightness=0.4, contrast=0.2).params(torch.arange(5000), 0, 8, 8)
    for name, strength in (("brightness", 0.4), ("contrast", 0.2)):
        assert p[name].min() >= 1 - strength and p[name].max() <= 1 + strength
        assert p[name].min() < 1 - 0.9 * strength and p[name].max() > 1 + 0.9 * strength
    assert (p["saturation"] == 1).all()


def test_normalisation_is_fused_and_matches_to_device():
    images = smooth_images()
    aug = Augment(size=16, scale=(0.3, 1.0), hflip=0.5, brightness=0.3)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    got = to_device(images, "cpu", mean=mean, std=std, augment=aug, keys=[4, 5, 6], epoch=2)
    ref = (aug(images, [4, 5, 6], 2) - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1
    )
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert to_device(images, "cpu", augment=aug, keys=[4, 5, 6], epoch=2, channels_last=False).is_contiguous()
    half = to_device(images, "cpu", dtype=torch.bfloat16, augment=aug, keys=[4, 5, 6], epoch=2)
    assert half.dtype == torch.bfloat16 and half.shape == (3, 3, 16, 16)


@pytest.mark.parametrize("channels_last", [True, False])
def test_no_op_augment_returns_exactly_to_devices_output(channels_last):
    images = smooth_images()
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    plain = to_device(images, "cpu", mean=mean, std=std, channels_last=channels_last)
    noop = to_device(
        images, "cpu", mean=mean, std=std, channels_last=channels_last, augment=Augment(), keys=[0, 1, 2]
    )
    assert torch.equal(plain, noop) and plain.stride() == noop.stride()
    assert torch.equal(
        to_device(images, "cpu", augment=Augment()), to_device(images, "cpu")
    )  # keys not needed
    assert not Augment().active and not Augment.from_spec("none").active


# Per-record determinism


def augmented_epoch(ds, aug, epoch, num_workers=None, stop=None):
    """{record: its augmented image} for one epoch of `ds`, through a DataLoader if asked."""
    source = ds if num_workers is None else DataLoader(ds, batch_size=None, num_workers=num_workers)
    seen = {}
    for number, (images, _, keys) in enumerate(source):
        if number == stop:
            break
        out = to_device(images, "cpu", augment=aug, keys=keys, epoch=epoch)
        seen.update(zip(keys.tolist(), out))
    return seen


AUG = Augment(
    size=(8, 8),
    scale=(0.3, 1.0),
    hflip=0.5,
    vflip=0.3,
    degrees=10,
    brightness=0.4,
    contrast=0.4,
    saturation=0.4,
    seed=7,
)


def assert_same_records(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=0)


@pytest.mark.parametrize("batch_size, workers", [(1, None), (7, None), (64, None), (7, 2), (64, 2)])
def test_a_record_gets_the_same_augmentation_whatever_the_batching(store_path, batch_size, workers):
    reference = augmented_epoch(FastLoadDataset(store_path, 5, seed=1, return_indices=True), AUG, epoch=3)
    assert len(reference) == N
    ds = FastLoadDataset(store_path, batch_size, seed=2, return_indices=True)
    assert_same_records(augmented_epoch(ds, AUG, epoch=3, num_workers=workers), reference)


def test_a_record_gets_the_same_augmentation_on_any_rank(store_path):
    reference = augmented_epoch(FastLoadDataset(store_path, 5, return_indices=True), AUG, epoch=1)
    merged = {}
    for rank in range(3):
        ds = FastLoadDataset(store_path, 4, rank=rank, world_size=3, return_indices=True)
        merged.update(augmented_epoch(ds, AUG, epoch=1))
    assert_same_records(merged, reference)


def test_a_mid_epoch_resume_repeats_the_augmentation(store_path):
    whole = augmented_epoch(FastLoadDataset(store_path, 7, seed=3, return_indices=True), AUG, epoch=0)
    first = FastLoadDataset(store_path, 7, seed=3, return_indices=True)
    before = augmented_epoch(first, AUG, epoch=0, stop=4)
    resumed = FastLoadDataset(store_path, 7, seed=3, return_indices=True)
    resumed.load_state_dict({"seed": 3, "epoch": 0, "position": 4})
    after = augmented_epoch(resumed, AUG, epoch=0)
    assert not before.keys() & after.keys()
    assert_same_records({**before, **after}, whole)


def test_epochs_and_seeds_change_the_augmentation():
    images = smooth_images(n=8)
    keys = torch.arange(8)
    base = AUG(images, keys, 0)
    assert not torch.allclose(base, AUG(images, keys, 1))
    other_seed = Augment(**{**vars(AUG), "seed": 8})
    assert not torch.allclose(base, other_seed(images, keys, 0))
    # the same record in one batch twice: the same picture twice
    twice = AUG(images[[2, 2]], torch.tensor([5, 5]), 0)
    assert torch.equal(twice[0], twice[1])


# Arguments


def test_from_spec_builds_the_documented_augmentations():
    aug = Augment.from_spec("crop,flip,jitter", size=224, seed=3)
    assert (aug.size, aug.scale, aug.hflip, aug.vflip, aug.seed) == ((224, 224), (0.08, 1.0), 0.5, 0.0, 3)
    assert aug.brightness == aug.contrast == aug.saturation == 0.4
    aug = Augment.from_spec(" crop=0.3 , vflip , rotate=15, translate, jitter=0.2")
    assert (aug.scale, aug.vflip, aug.degrees, aug.translate, aug.brightness) == (
        (0.3, 1.0),
        0.5,
        15.0,
        0.1,
        0.2,
    )
    with pytest.raises(ValueError, match="unknown augmentation 'blur'.*known: crop, flip"):
        Augment.from_spec("crop,blur")
    with pytest.raises(ValueError, match="'rotate=lots'.*not a number"):
        Augment.from_spec("rotate=lots")
    with pytest.raises(ValueError, match="probability"):
        Augment.from_spec("flip=2")


def test_from_spec_skips_empty_and_none_terms_and_takes_every_amount():
    assert Augment.from_spec("flip").seed == Augment().seed == 0
    aug = Augment.from_spec("none, ,flip,,vflip=0.25,translate=0.2,rotate")
    assert (aug.hflip, aug.vflip, aug.translate, aug.degrees) == (0.5, 0.25, 0.2, 10.0)
    assert Augment.from_spec("rotate=30").degrees == 30.0
    assert not Augment.from_spec("").active and not Augment.from_spec("none").active


def test_repr_shows_only_what_differs_from_the_defaults():
    assert repr(Augment()) == "Augment()"
    assert repr(Augment(size=8, hflip=0.5, seed=3)) == "Augment(size=(8, 8), hflip=0.5, seed=3)"
    parsed = Augment.from_spec("flip,crop=0.5")  # keeps its spec for a checkpoint, not in its repr
    assert parsed.spec == "flip,crop=0.5" and repr(parsed) == "Augment(scale=(0.5, 1.0), hflip=0.5)"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"hflip": 1.5}, "hflip must be a probability"),
        ({"scale": (0.5, 0.2)}, "low <= high"),
        ({"scale": (0.0, 1.0)}, r"scale must lie in \(0, 1\]"),
        ({"ratio": (-1.0, 1.0)}, "ratio must be positive"),
        ({"size": 0}, "size must be a positive int"),
        ({"degrees": -3}, "degrees must be between 0 and 180"),
        ({"saturation": 2}, "saturation must be between 0 and 1"),
        ({"seed": -1}, "seed must be a non-negative int"),
        ({"size": True}, "size must be a positive int"),  # was a 1×1 output
        ({"size": (True, 8)}, "size must be a positive int"),
        ({"size": "ab"}, "size must be a positive int"),
        ({"seed": True}, "seed must be a non-negative int"),
        ({"hflip": True}, "hflip must be a number, not True"),
        ({"hflip": "0.5"}, "hflip must be a number"),
        ({"brightness": None}, "brightness must be a number"),
        ({"brightness": 1e39}, "brightness must be between 0 and 100"),  # inf as a float32 factor
        ({"contrast": 2**2000}, "contrast must be a finite number, not an integer of 2001 bits"),
        ({"scale": 5}, r"scale must be a \(low, high\) range"),
        ({"ratio": (1.0, 2.0, 3.0)}, r"ratio must be a \(low, high\) range"),
        ({"scale": (0.5, 1.5)}, r"scale must lie in \(0, 1\]"),
        ({"ratio": (0.0, 1.0)}, "ratio must be positive"),
        ({"translate": 1.5}, "translate must be between 0 and 1, not 1.5"),
    ],
)
def test_bad_options_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Augment(**kwargs)


# Every number option, with a value put in for it (in one end of a range, `end`).
NUMBER_OPTIONS = (
    "hflip",
    "vflip",
    "degrees",
    "translate",
    "brightness",
    "contrast",
    "saturation",
    "scale",
    "ratio",
)
RANGES = {"scale": (0.5, 1.0), "ratio": (0.75, 1.5)}


def options_with(name, value, end=0):
    if name not in RANGES:
        return {name: value}
    pair = list(RANGES[name])
    pair[end] = value
    return {name: tuple(pair)}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    "name, end", [(name, end) for name in NUMBER_OPTIONS for end in ((0, 1) if name in RANGES else (0,))]
)
def test_non_finite_numbers_are_refused_by_name(name, value, end):
    with pytest.raises(ValueError, match=f"^{name} must be a finite number, not {value}$"):
        Augment(**options_with(name, value, end))


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]  # float32: the CPU kernel


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(NUMBER_OPTIONS),
    value=st.one_of(st.floats(), st.integers(-(2**1100), 2**1100), st.booleans()),
    end=st.integers(0, 1),
    dtype=st.sampled_from(DTYPES),
)
def test_a_number_augment_takes_gives_finite_pixels_and_any_other_is_refused_by_name(name, value, end, dtype):
    """NaN, infinity, numbers beyond a float or beyond what a factor may hold in float32 (or in
    float16 after a product of two), bools: refused up front, by the argument's name. Whatever
    is accepted gives finite pixels in [0, 1] in every dtype, on the kernel's path and torch's."""
    try:
        aug = Augment(size=(6, 5), **options_with(name, value, end))
    except ValueError as error:
        assert str(error).startswith(f"{name} must "), str(error)
        return
    out = aug(smooth_images(2, 12, 10), [3, 4], 0, dtype)
    assert bool(torch.isfinite(out).all()) and float(out.min()) >= 0 and float(out.max()) <= 1


@settings(max_examples=60, deadline=None)
@given(
    strengths=st.tuples(*[st.floats(0.0, MAX_JITTER)] * 2, st.floats(0.0, 1.0)),
    geometry=st.tuples(st.floats(0.0, 180.0), st.floats(0.0, 1.0), st.floats(1e-300, 1.0)),
    dtype=st.sampled_from(DTYPES),
)
def test_every_option_at_once_within_its_bounds_gives_finite_pixels(strengths, geometry, dtype):
    brightness, contrast, saturation = strengths
    degrees, translate, smallest = geometry
    aug = Augment(
        size=(7, 9),
        scale=(smallest, 1.0),
        ratio=(1e-300, 1e300),
        hflip=0.5,
        degrees=degrees,
        translate=translate,
        brightness=brightness,
        contrast=contrast,
        saturation=saturation,
    )
    out = aug(smooth_images(3, 12, 10), [0, 1, 2], 5, dtype)
    assert bool(torch.isfinite(out).all()) and float(out.min()) >= 0 and float(out.max()) <= 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_strongest_jitter_stays_finite_in_every_dtype(dtype):
    aug = Augment(brightness=MAX_JITTER, contrast=MAX_JITTER, saturation=1.0)
    out = aug(smooth_images(64, 4, 4), range(64), 0, dtype)
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scale": torch.full((1, 3, 1, 1), math.inf)},
        {"shift": torch.full((1, 1, 1, 1), math.nan)},
        {"scale": torch.full((1, 3, 1, 1), 300.0, dtype=torch.float16), "dtype": torch.float16},
    ],
    ids=["inf scale", "nan shift", "float16 overflow"],
)
@pytest.mark.parametrize("aug", [Augment(), Augment(hflip=0.5)], ids=["no-op", "flips"])
def test_a_normalisation_that_overflows_is_refused_before_the_kernel(aug, kwargs):
    """The kernel's own check names its internal values (theta, colour, ...): never shown."""
    with pytest.raises(ValueError, match=r"normalised pixels x \* scale - shift .* not finite") as error:
        aug.apply(smooth_images(), [0, 1, 2], 0, **kwargs)
    assert "theta" not in str(error.value)


@pytest.mark.parametrize("augment", [None, Augment(hflip=0.5)], ids=["convert", "augment"])
@pytest.mark.parametrize("std", [1e-41, 1e-39])
def test_to_device_names_a_std_that_overflows_float32(augment, std):
    """1 / (255 std) (or mean / std) beyond float32: not the kernel's message, but the std."""
    with pytest.raises(ValueError, match="std") as error:
        to_device(smooth_images(), "cpu", mean=[0.5], std=[std], augment=augment, keys=[0, 1, 2])
    assert "theta" not in str(error.value)


def test_bad_calls_are_refused_with_the_reason():
    images = smooth_images()
    aug = Augment(hflip=0.5)
    with pytest.raises(ValueError, match="augment needs keys"):
        to_device(images, "cpu", augment=aug)
    with pytest.raises(ValueError, match="2 keys for 3 images"):
        aug(images, [0, 1], 0)
    with pytest.raises(TypeError, match="integer record indices"):
        aug(images, [0.0, 1.0, 2.0], 0)
    with pytest.raises(ValueError, match="epoch must be a non-negative int"):
        aug(images, [0, 1, 2], -1)
    with pytest.raises(ValueError, match="epoch must be a non-negative int, not True"):
        aug(images, [0, 1, 2], True)
    with pytest.raises(TypeError, match="uint8 tensor"):
        aug(images.float(), [0, 1, 2], 0)
    with pytest.raises(TypeError, match="fastload.Augment"):
        to_device(images, "cpu", augment="crop", keys=[0, 1, 2])
    with pytest.raises(ValueError, match="need RGB images, not 1 channels"):
        Augment(saturation=0.3)(images[..., :1], [0, 1, 2], 0)


# Preview


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "fastload", *args], capture_output=True, text=True, timeout=120
    )


def test_preview_png_shows_records_by_epoch(store_path, tmp_path):
    from PIL import Image

    out = tmp_path / "grid.png"
    size = save_preview(store_path, out, Augment(size=(6, 5), hflip=0.5), records=3, epochs=4)
    assert size == (4 * 7 + 2, 3 * 8 + 2)
    picture = np.asarray(Image.open(out))
    assert picture.shape == (26, 30, 3)
    assert (picture[0] == 255).all() and (picture[:, 0] == 255).all()  # the white frame
    # Row 1, column 0 is record 34 of epoch 0 (0, 34, 69 are spread evenly over 70), as Augment makes it.
    from fastload import Store

    store = Store(store_path)
    tile = Augment(size=(6, 5), hflip=0.5)(torch.from_numpy(store.gather([34])[0]), [34], 0)
    expected = (tile[0] * 255).round().permute(1, 2, 0).numpy().astype(np.uint8)
    np.testing.assert_array_equal(picture[10:16, 2:7], expected)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"records": math.nan}, "records must be an int >= 1, not nan"),
        ({"records": 2.5}, "records must be an int >= 1, not 2.5"),
        ({"epochs": True}, "epochs must be an int >= 1, not True"),
        ({"epochs": math.inf}, "epochs must be an int >= 1, not inf"),
        ({"first_epoch": -1}, "first_epoch must be an int >= 0, not -1"),
    ],
)
def test_preview_refuses_counts_that_are_not_whole_numbers(store_path, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        save_preview(store_path, tmp_path / "grid.png", Augment(), **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_preview_defaults_later_epochs_and_the_white_lines_between_tiles(store_path, tmp_path):
    """4 records by 8 epochs unless told; `first_epoch` is the first column; tiles are cut by
    white lines; every pixel value survives, 0 and 255 included."""
    from PIL import Image

    from fastload import Store

    aug = Augment(size=(6, 5), hflip=0.5)
    assert save_preview(store_path, tmp_path / "a.png", aug) == (8 * 7 + 2, 4 * 8 + 2)
    store = Store(store_path)
    first = aug(torch.from_numpy(store.gather([0])[0]), [0], 0)  # record 0 at epoch 0, top left
    expected = (first[0] * 255).round().permute(1, 2, 0).numpy().astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "a.png"))[2:8, 2:7], expected)
    assert save_preview(store, tmp_path / "b.png", aug, records=3, epochs=2, first_epoch=5) == (
        2 * 7 + 2,
        3 * 8 + 2,
    )
    assert not store.closed  # a Store given is the caller's: left open
    picture = np.asarray(Image.open(tmp_path / "b.png"))
    for row, record in enumerate([0, 34, 69]):
        for column, epoch in enumerate([5, 6]):
            tile = aug(torch.from_numpy(store.gather([record])[0]), [record], epoch)
            expected = (tile[0] * 255).round().permute(1, 2, 0).numpy().astype(np.uint8)
            top, left = 2 + row * 8, 2 + column * 7
            np.testing.assert_array_equal(picture[top : top + 6, left : left + 5], expected)
            assert (picture[top + 6 : top + 8, left : left + 5] == 255).all()  # the line below
            assert (picture[top : top + 6, left + 5 : left + 7] == 255).all()  # and right of it
    black = tmp_path / "black.bin"
    with StoreWriter(black, (4, 4, 1)) as w:  # one record, one channel, 0 and 255 pixels
        w.append(np.array([[0, 255] * 2] * 4, np.uint8), 0.0)
    assert save_preview(black, tmp_path / "c.png", Augment(), records=2, epochs=1) == (6 + 2, 6 + 2)
    gray = np.asarray(Image.open(tmp_path / "c.png"))
    assert gray.ndim == 2 and gray[2:6, 2:6].tolist() == [[0, 255] * 2] * 4


def test_preview_refuses_what_it_cannot_draw_by_name(store_path, tmp_path, monkeypatch):
    empty, four = tmp_path / "empty.bin", tmp_path / "rgba.bin"
    StoreWriter(empty, (2, 2, 3)).commit()
    with StoreWriter(four, (2, 2, 4)) as w:
        w.append(np.zeros((2, 2, 4), np.uint8), 0.0)
    out = tmp_path / "out" / "grid.png"
    out.parent.mkdir()
    for store, message in (
        (empty, "empty.bin: the store has no records to preview$"),
        (four, "rgba.bin: a preview needs 1 or 3 channels, not 4$"),
    ):
        with pytest.raises(ValueError, match=message):
            save_preview(store, out, Augment())
    for records, epochs in ((257, 1), (1, 257)):
        with pytest.raises(
            ValueError, match=f"^need records and epochs between 1 and 256 .*, not {records} and {epochs}$"
        ):
            save_preview(store_path, out, Augment(), records=records, epochs=epochs)
    # the bound itself is drawn; the rows are the store's N records at most
    assert save_preview(store_path, out, Augment(size=1), records=256, epochs=256) == (256 * 3 + 2, N * 3 + 2)
    with pytest.raises(TypeError, match="^preview path must be"):
        save_preview(store_path, 42, Augment())
    with pytest.raises(ValueError, match="^preview .*is a directory"):  # before the store is read
        save_preview(tmp_path / "missing.bin", tmp_path, Augment())
    monkeypatch.setitem(sys.modules, "PIL.Image", None)  # Pillow not installed
    with pytest.raises(
        fastload.MissingDependencyError,
        match="^the augmentation preview needs PIL, which is not installed: pip install pillow$",
    ):
        save_preview(store_path, out, Augment())


def test_cli_augment_preview_writes_the_grid(store_path, tmp_path):
    out = tmp_path / "grid.png"
    result = run_cli(
        "augment-preview", str(store_path), "--augment", "crop,flip,jitter", "--size", "8", "-o", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout and out.stat().st_size > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--augment", "crop,wobble"], "unknown augmentation 'wobble'"),
        (["--augment", "flip=3"], "hflip must be a probability"),
    ],
)
def test_cli_augment_preview_refuses_bad_specs(store_path, tmp_path, capsys, args, message):
    out = tmp_path / "grid.png"
    assert cli.main(["augment-preview", str(store_path), *args, "-o", str(out)]) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_cli_augment_preview_names_a_missing_store(tmp_path, capsys):
    assert cli.main(["augment-preview", str(tmp_path / "nope.bin"), "-o", str(tmp_path / "g.png")]) == 1
    assert "nope.bin" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# CUDA


@needs_cuda
def test_cuda_matches_cpu():
    images = smooth_images(n=16)
    keys = torch.arange(100, 116)
    cpu = to_device(images, "cpu", augment=AUG, keys=keys, epoch=5)
    cuda = to_device(images.pin_memory(), "cuda", augment=AUG, keys=keys.cuda(), epoch=5)
    p_cpu, p_cuda = AUG.params(keys, 5, 24, 20), AUG.params(keys.cuda(), 5, 24, 20)
    for name in p_cpu:
        assert torch.equal(p_cpu[name], p_cuda[name].cpu()), name
    torch.testing.assert_close(cuda.cpu(), cpu, atol=1e-4, rtol=0)


@pytest.mark.parametrize("size", [(5, 7), (16, 16)])
def test_the_broadcast_grid_equals_affine_grid(size):
    from fastload.augment import affine_grid

    theta = torch.randn(6, 2, 3, generator=torch.Generator().manual_seed(0))
    expected = torch.nn.functional.affine_grid(theta, [6, 3, *size], align_corners=False)
    torch.testing.assert_close(affine_grid(theta, *size), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("jitter", ["all", "brightness", "brightness,saturation"])  # gains folded differently
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_the_torch_path_cuda_runs_matches_the_cpu_kernel(dtype, jitter):
    """CUDA, and every dtype but float32 on the CPU, augment and normalise with torch ops
    (grid_sample with border padding, the jitter's folded gains, scale and shift), the CPU's
    float32 with the native kernel: both give the same pixels, checked here without a GPU."""
    images = smooth_images(n=16)
    aug = Augment(size=(8, 8), scale=(0.3, 1.0), hflip=0.5, vflip=0.5, degrees=30, translate=0.2,
                  brightness=0.4, contrast=0.4 * (jitter == "all"), saturation=0.4 * (jitter != "brightness"), seed=7)  # fmt: skip
    options = dict(
        mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25), augment=aug, keys=torch.arange(100, 116), epoch=3
    )
    kernel = to_device(images, "cpu", **options)
    torch_ops = to_device(images, "cpu", dtype=dtype, **options)
    tolerance = 2e-4 if dtype == torch.float64 else 0.05
    torch.testing.assert_close(torch_ops.float(), kernel, atol=tolerance, rtol=0)


def test_augment_names_what_it_takes_word_for_word():
    with pytest.raises(TypeError) as error:
        Augment()(torch.zeros((2, 4, 4, 3)), torch.arange(2), 0)
    assert str(error.value) == "images must be a uint8 tensor of shape N×H×W×C"
    with pytest.raises(TypeError) as error:
        Augment(spec=3)
    assert str(error.value) == "spec must be a str or None, not int"
    assert Augment(spec="flip").spec == "flip"
    assert Augment(size=(MAX_SIDE, 8)).size == (MAX_SIDE, 8)


def test_the_finiteness_bound_is_that_of_the_widest_pixel():
    """float16's largest is 65504: 255 x 256 = 65280 passes; a negative mean adds to it."""
    images, keys, half = smooth_images(), torch.arange(3), dict(dtype=torch.float16)
    scale = torch.full((1, 1, 1, 1), 256.0, **half)
    out = Augment().apply(
        images, keys, 0, torch.float16, scale=scale, shift=torch.zeros((1, 1, 1, 1), **half)
    )
    assert bool(torch.isfinite(out).all()) and out.max() == 256 * int(images.max())
    shift = torch.full((1, 1, 1, 1), -1000.0, **half)  # x * 256 + 1000 reaches 66280: inf
    with pytest.raises(ValueError, match=r"a mean nearer 0, or a wider dtype$"):
        Augment().apply(images, keys, 0, torch.float16, scale=scale, shift=shift)


def test_augment_gives_channels_last_float32_or_the_layout_and_dtype_asked_for():
    images, keys = smooth_images(n=3), torch.arange(3)
    aug = Augment(scale=(0.5, 1.0), hflip=0.5, degrees=20, seed=3)
    default = aug(images, keys, 1)
    assert default.dtype == torch.float32 and default.is_contiguous(memory_format=torch.channels_last)
    plain = aug.apply(images, keys, 1, channels_last=False)
    assert plain.is_contiguous() and torch.equal(plain, default)
    assert aug(images, keys, 1, torch.float64).dtype == torch.float64
    two = images[..., :2].contiguous()  # two channels: the torch path (the kernel takes 1 or 3)
    torch.testing.assert_close(aug(two, keys, 1), default[:, :2], atol=2e-4, rtol=0)


def test_a_float64_batch_is_resampled_in_float64():
    """Flipped both ways through the sampling grid, a float64 batch is the flipped batch to
    float64 precision: its grid's pixel centres are computed in float64, not float32."""
    images = smooth_images(n=2)
    flipped = to_device(
        images, "cpu", dtype=torch.float64, augment=Augment(hflip=1.0, vflip=1.0), keys=torch.arange(2)
    )
    expected = to_device(images, "cpu", dtype=torch.float64).flip([-2, -1])
    torch.testing.assert_close(flipped, expected, rtol=0, atol=1e-9)


def test_cpu_groups_of_samples_give_the_whole_batchs_result(monkeypatch):
    import fastload.augment

    images = smooth_images(n=7)
    # float64 takes the torch path on the CPU (float32 the native kernel, which has no groups)
    options = dict(dtype=torch.float64, mean=(0.5,), std=(0.3,), augment=AUG, keys=torch.arange(7), epoch=1)
    whole = to_device(images, "cpu", **options)
    monkeypatch.setattr(fastload.augment, "_CPU_WORKING_SET", 3 * 2 * (24 * 20 + 8 * 8) * 8)  # 2 per group
    grouped = to_device(images, "cpu", **options)
    assert torch.equal(whole, grouped) and grouped.is_contiguous(memory_format=torch.channels_last)
