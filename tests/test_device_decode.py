"""Decoding a compressed store on the device (fastload/decode.py): DeviceLoader(decode="device")
and DeviceStore(decode="device") against DeviceLoader's host decode (fastload's Rust threads),
on the CPU with torchvision's CPU decoder standing in for nvjpeg: the same records, labels,
indices, order, epochs, resume points and rank shares, and pixels within the measured
tolerance; the refusals; and on CUDA (skipped without it) nvjpeg within its own tolerance.

The tolerances. On the CPU torchvision's decode_jpeg (its own libjpeg-turbo, default DCT and
fancy upsampling) and fastload's equal each other exactly: max abs difference 0 and mean 0 over
43 photos cut to 384x384 at qualities 75, 90 and 95 (torchvision 0.29.2, torch 2.15), and
`test_torchvision_decodes_as_fastload_does` checks it on photo-like images. nvjpeg computes
its IDCT and chroma upsampling its own way, so CUDA_TOLERANCE is wider, and unmeasured until a
GPU run prints its figures (`test_on_cuda_nvjpeg_is_within_its_tolerance`)."""

import sys
import types
import warnings

import numpy as np
import pytest
import torch
from dataset_helpers import rank_share
from torch.utils.data import DataLoader

from fastload import Augment, DeviceLoader, DeviceStore, FastLoadDataset, Store, StoreError, StoreWriter
from fastload.errors import MissingDependencyError

try:
    from torchvision.io import decode_jpeg
except ImportError:
    decode_jpeg = None

needs_torchvision = pytest.mark.skipif(decode_jpeg is None, reason="torchvision is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")

N = 45  # not a multiple of the batch size or the world size
SHAPE = (24, 20, 3)
MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.5]
AUGMENT = Augment.from_spec("crop=0.5,flip,jitter", size=16, seed=1)
#: Largest and mean absolute difference of uint8 pixels allowed between a device decode and
#: the host decode: measured 0 and 0 on the CPU (the module's docstring).
CPU_TOLERANCE = (0, 0.0)
#: The same for nvjpeg on CUDA: assumed, not measured (no GPU yet). A GPU run prints the
#: figures; set this from them.
CUDA_TOLERANCE = (48, 1.5)


def photo_like(n, shape, seed=0):
    """Images with what JPEG meets in photos: smooth gradients, hard edges and sensor noise."""
    rng = np.random.default_rng(seed)
    h, w, c = shape
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    images = []
    for _ in range(n):
        base = (
            rng.uniform(0, 255, c)
            + rng.uniform(-4, 4, c) * x[..., None]
            + rng.uniform(-4, 4, c) * y[..., None]
        )
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(3, max(h, w) / 2)
        disc = ((y - cy) ** 2 + (x - cx) ** 2 < r**2)[..., None] * rng.uniform(-120, 120, c)
        images.append(np.clip(base + disc + rng.normal(0, 6, (h, w, c)), 0, 255).astype(np.uint8))
    return np.stack(images)


def write(path, shape=SHAPE, n=N, **encoding):
    with StoreWriter(path, shape, label_dtype="float64", **encoding) as writer:
        writer.extend(photo_like(n, shape), np.arange(n) / 10)
    return path


@pytest.fixture(scope="module")
def jpeg_path(tmp_path_factory):
    return write(tmp_path_factory.mktemp("decode") / "jpeg.fastload", encoding="jpeg", quality=90)


@pytest.fixture(scope="module")
def budget_path(tmp_path_factory):
    """Some records kept raw under a size budget, the rest encoded (all encoded, the store takes
    about 31 kB; all raw, 71 kB)."""
    path = tmp_path_factory.mktemp("decode") / "budget.fastload"
    return write(path, encoding="jpeg", quality=90, max_size=50_000, expected_count=N)


@pytest.fixture(scope="module")
def raw_path(tmp_path_factory):
    return write(tmp_path_factory.mktemp("decode") / "raw.fastload")


def differences(got: torch.Tensor, expected: torch.Tensor):
    """(max, mean) absolute difference of two uint8 batches."""
    d = (got.cpu().to(torch.int16) - expected.cpu().to(torch.int16)).abs()
    return (int(d.max()), float(d.float().mean())) if d.numel() else (0, 0.0)


def same_batches(got, expected, tolerance=CPU_TOLERANCE):
    """Every batch's labels and indices equal, and its images within `tolerance` of the host
    decode's: exactly equal where the tolerance is 0 (whatever the conversion), else compared
    as pixels (images converted without mean and std: x/255 rounds back to x exactly)."""
    got, expected = list(got), list(expected)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert len(a) == len(b)
        assert all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a[1:], b[1:]))
        assert a[0].dtype == b[0].dtype and a[0].shape == b[0].shape and a[0].stride() == b[0].stride()
        if tolerance == (0, 0.0):
            assert torch.equal(a[0].cpu(), b[0].cpu())
        else:
            largest, mean = differences(as_pixels(a[0]), as_pixels(b[0]))
            assert largest <= tolerance[0] and mean <= tolerance[1], (largest, mean)


def as_pixels(images: torch.Tensor) -> torch.Tensor:
    return (images.cpu().float() * 255).round().to(torch.uint8)


def host(path, **options):
    """The host decode's batches (fastload's Rust threads), as DeviceLoader yields them."""
    dataset_options = {k: options.pop(k) for k in list(options) if k not in ("mean", "std", "augment")}
    return DeviceLoader(FastLoadDataset(path, 8, return_indices=True, **dataset_options), "cpu", **options)


@needs_torchvision
@pytest.mark.parametrize("quality", [75, 90, 95])
def test_torchvision_decodes_as_fastload_does(tmp_path, quality):
    path = write(tmp_path / "s.fastload", shape=(64, 48, 3), n=8, encoding="jpeg", quality=quality)
    store = Store(path)
    assert store.encodings == {"raw": 0, "jpeg": 8}
    for i in range(len(store)):
        _, data = store.stored(i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchvision 0.29 announces TorchCodec
            theirs = decode_jpeg(torch.from_numpy(data.copy())).permute(1, 2, 0)
        assert differences(theirs, torch.from_numpy(store[i][0])) <= CPU_TOLERANCE


@needs_torchvision
@pytest.mark.parametrize(
    "options",
    [{}, {"mean": MEAN, "std": STD, "augment": AUGMENT}, {"order": "sequential", "shuffle": False}],
    ids=["plain", "normalized and augmented", "sequential"],
)
def test_device_decode_yields_the_host_decodes_batches_every_epoch(jpeg_path, options):
    conversion = {k: v for k, v in options.items() if k in ("mean", "std", "augment")}
    dataset = {k: v for k, v in options.items() if k not in conversion}
    loader = DeviceLoader(
        FastLoadDataset(jpeg_path, 8, seed=3, return_indices=True, **dataset),
        "cpu",
        decode="device",
        **conversion,
    )
    expected = host(jpeg_path, seed=3, **options)
    assert len(loader) == len(expected) == 6
    for _ in range(2):  # the next epoch follows on its own, as the dataset's does
        same_batches(loader, expected)
    loader.set_epoch(5)
    expected.set_epoch(5)
    same_batches(loader, expected)
    assert loader.state_dict() == expected.state_dict()


@needs_torchvision
def test_a_resume_mid_epoch_continues_as_the_host_decode_does(jpeg_path):
    loader = DeviceLoader(FastLoadDataset(jpeg_path, 8, seed=4, return_indices=True), "cpu", decode="device")
    loader.set_epoch(1)
    batches = iter(loader)
    for _ in range(2):
        next(batches)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 2
    resumed = DeviceLoader(FastLoadDataset(jpeg_path, 8, seed=4, return_indices=True), "cpu", decode="device")
    resumed.load_state_dict(state)
    expected = host(jpeg_path, seed=4)
    expected.load_state_dict(state)
    continued = list(resumed)
    same_batches(continued, expected)
    same_batches(batches, continued)  # the interrupted iteration goes on the same way


@needs_torchvision
def test_two_ranks_get_their_shares_as_before(jpeg_path):
    shares = []
    for rank in range(2):
        ds = FastLoadDataset(jpeg_path, 8, seed=5, rank=rank, world_size=2, return_indices=True)
        ds.set_epoch(2)
        loader = DeviceLoader(ds, "cpu", decode="device")
        got = list(loader)
        assert [labels.tolist() for _, labels, _ in got] == rank_share(jpeg_path, 8, 5, rank, 2, 2)
        shares.append({int(i) for _, _, indices in got for i in indices})
    assert shares[0] | shares[1] == set(range(N))


@needs_torchvision
def test_a_budget_store_mixing_raw_and_jpeg_records_decodes_both(budget_path):
    store = Store(budget_path)
    assert store.encodings["raw"] > 0 and store.encodings["jpeg"] > 0, store.encodings
    same_batches(
        DeviceLoader(FastLoadDataset(budget_path, 8, seed=6, return_indices=True), "cpu", decode="device"),
        host(budget_path, seed=6),
    )
    resident = DeviceStore(budget_path, "cpu", reserve_bytes=0, progress=False, decode="device")
    same_batches(
        resident.loader(FastLoadDataset(budget_path, 8, seed=6, return_indices=True)),
        host(budget_path, seed=6),
    )


@needs_torchvision
def test_a_grayscale_store_decodes_to_one_channel(tmp_path):
    path = write(tmp_path / "gray.fastload", shape=(64, 48, 1), encoding="jpeg", quality=90)
    assert Store(path).encodings["jpeg"] > 0
    same_batches(
        DeviceLoader(FastLoadDataset(path, 8, seed=7, return_indices=True), "cpu", decode="device"),
        host(path, seed=7),
    )


@needs_torchvision
def test_the_resident_store_holds_the_compressed_bytes_and_yields_the_same_batches(jpeg_path):
    resident = DeviceStore(jpeg_path, "cpu", reserve_bytes=0, progress=False, decode="device")
    store = Store(jpeg_path)
    held = sum(len(store.stored(i)[1]) for i in range(N))
    assert resident.images is None
    assert resident.nbytes == held + N * 8 < N * store.image_nbytes / 2
    assert "compressed in pinned host memory" in repr(resident)
    for options in ({}, {"mean": MEAN, "std": STD, "augment": AUGMENT}):
        ds = FastLoadDataset(jpeg_path, 8, seed=8, return_indices=True)
        same_batches(resident.loader(ds, **options), host(jpeg_path, seed=8, **options))
    # A subset, resumed mid-epoch, on rank 1 of 2.
    subset = DeviceStore(
        jpeg_path, "cpu", indices=range(0, N, 2), reserve_bytes=0, progress=False, decode="device"
    )
    ds = FastLoadDataset(
        jpeg_path, 4, seed=9, indices=range(0, N, 2), rank=1, world_size=2, return_indices=True
    )
    ds.load_state_dict({"seed": 9, "epoch": 3, "position": 1})
    expected = DeviceLoader(
        FastLoadDataset(
            jpeg_path, 4, seed=9, indices=range(0, N, 2), rank=1, world_size=2, return_indices=True
        ),
        "cpu",
    )
    expected.load_state_dict({"seed": 9, "epoch": 3, "position": 1})
    same_batches(subset.loader(ds), expected)


def test_by_default_the_resident_store_holds_a_compressed_store_decoded_by_the_host(budget_path):
    resident = DeviceStore(budget_path, "cpu", reserve_bytes=0, progress=False)
    assert resident.decoder is None and resident.images.shape == (N, *SHAPE)
    same_batches(
        resident.loader(FastLoadDataset(budget_path, 8, seed=11, return_indices=True)),
        host(budget_path, seed=11),
    )


@needs_torchvision
def test_records_beyond_half_the_ram_are_refused_before_anything_is_pinned(jpeg_path, monkeypatch):
    import fastload.resident

    monkeypatch.setattr(fastload.resident, "machine_memory", lambda: 2 * 3000)
    with pytest.raises(MemoryError, match=r"half this machine's RAM .* indices= with at most \d+ records"):
        DeviceStore(jpeg_path, "cpu", reserve_bytes=0, progress=False, decode="device")


def test_a_raw_store_is_refused_naming_the_host_decode(raw_path):
    ds = FastLoadDataset(raw_path, 8)
    with pytest.raises(ValueError, match=r"stores its records raw .* decode='host' \(the default\)"):
        DeviceLoader(ds, "cpu", decode="device")
    with pytest.raises(ValueError, match=r"stores its records raw"):
        DeviceStore(raw_path, "cpu", reserve_bytes=0, progress=False, decode="device")


def test_bad_options_are_named(jpeg_path):
    ds = FastLoadDataset(jpeg_path, 8)
    for bad in ("gpu", "cpu", None, True):
        with pytest.raises(ValueError, match=r"decode must be one of 'host', 'device'"):
            DeviceLoader(ds, "cpu", decode=bad)
    with pytest.raises(ValueError, match=r"decode must be one of"):
        DeviceStore(jpeg_path, "cpu", progress=False, decode="nvjpeg")
    with pytest.raises(TypeError, match=r"pass the FastLoadDataset as the source \(not a DataLoader"):
        DeviceLoader(DataLoader(ds, batch_size=None), "cpu", decode="device")
    with pytest.raises(ValueError, match=r"timing=True times the copies of decode='host'"):
        DeviceLoader(ds, "cpu", decode="device", timing=True)
    with pytest.raises(ValueError, match=r"on the CPU and on CUDA only, not on meta: use decode='host'"):
        DeviceLoader(ds, "meta", decode="device")


def test_without_torchvision_the_error_names_the_install(jpeg_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision.io", None)  # import fails, as when not installed
    with pytest.raises(
        MissingDependencyError, match=r"decode='device' needs torchvision.*pip install torchvision"
    ):
        DeviceLoader(FastLoadDataset(jpeg_path, 8), "cpu", decode="device")


def stand_in_torchvision(monkeypatch, decode):
    """A torchvision.io whose decode_jpeg is `decode`: the decoder's failures, with or without
    torchvision."""
    module = types.ModuleType("torchvision.io")
    module.ImageReadMode = types.SimpleNamespace(GRAY="GRAY", RGB="RGB")
    module.decode_jpeg = decode
    monkeypatch.setitem(sys.modules, "torchvision.io", module)


def test_a_record_decoding_to_another_size_or_failing_is_named(jpeg_path, monkeypatch):
    def wrong_size(inputs, mode, device):
        return [torch.zeros((3, 2, 2), dtype=torch.uint8) for _ in inputs]

    stand_in_torchvision(monkeypatch, wrong_size)
    loader = DeviceLoader(
        FastLoadDataset(jpeg_path, 8, order="sequential", shuffle=False), "cpu", decode="device"
    )
    with pytest.raises(
        StoreError, match=r"record 0 decodes to 2x2x3, not the store's 24x20x3: the record is damaged"
    ):
        next(iter(loader))

    def failing(inputs, mode, device):
        raise RuntimeError("decode_jpegs_cuda: torchvision not compiled with nvJPEG support")

    stand_in_torchvision(monkeypatch, failing)
    loader = DeviceLoader(
        FastLoadDataset(jpeg_path, 8, order="sequential", shuffle=False), "cpu", decode="device"
    )
    with pytest.raises(
        RuntimeError,
        match=r"decode_jpeg on cpu failed on records \[0, 1, 2, 3, 4\]\.\.\.: .*nvJPEG.*decode='host'",
    ):
        next(iter(loader))


@needs_cuda
@needs_torchvision
def test_on_cuda_nvjpeg_is_within_its_tolerance(jpeg_path, budget_path, capsys):
    """nvjpeg against fastload's host decode, both paths, a mixed store too: labels and indices
    exact, pixels within CUDA_TOLERANCE. Prints the measured figures (for CUDA_TOLERANCE)."""
    for path in (jpeg_path, budget_path):
        expected = list(host(path, seed=10))
        streamed = DeviceLoader(
            FastLoadDataset(path, 8, seed=10, return_indices=True), "cuda", decode="device"
        )
        resident = DeviceStore(path, "cuda", reserve_bytes=0, progress=False, decode="device")
        for name, loader in (
            ("DeviceLoader", streamed),
            ("DeviceStore", resident.loader(FastLoadDataset(path, 8, seed=10, return_indices=True))),
        ):
            got = list(loader)
            assert all(batch[0].device.type == "cuda" for batch in got)
            figures = [differences(as_pixels(a[0]), as_pixels(e[0])) for a, e in zip(got, expected)]
            with capsys.disabled():
                print(
                    f"\n{name} decode='device' on {torch.cuda.get_device_name()} ({Store(path).encodings}): "
                    f"max abs {max(f[0] for f in figures)}, mean abs {np.mean([f[1] for f in figures]):.4f}"
                )
            same_batches(got, expected, tolerance=CUDA_TOLERANCE)
