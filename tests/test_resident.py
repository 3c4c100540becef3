"""DeviceStore, the store held on the device: bit for bit the batches of FastLoadDataset +
DeviceLoader (device "cpu" stands in for the GPU), in every order, on every rank, across
set_epoch and a resume mid-epoch; the fit decided before anything is allocated; batches a
caller holds are never written over."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fastload.cli
import fastload.inspect
import fastload.resident
import fastload.train
from fastload import Augment, DeviceLoader, FastLoadDataset, Store, StoreWriter, to_device
from fastload.resident import DeviceStore

N = 45  # not a multiple of the batch size or the world size
AUGMENT = Augment.from_spec("crop=0.5,flip,jitter", size=4, seed=1)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("resident") / "s.fastload"
    images = np.random.default_rng(0).integers(0, 256, (N, 6, 5, 3), dtype=np.uint8)
    with StoreWriter(path, (6, 5, 3), label_dtype="float64") as writer:
        writer.extend(images, np.arange(N) / 10)
    return path


@pytest.fixture(scope="module")
def resident(store_path):
    return DeviceStore(store_path, "cpu", reserve_bytes=0, progress=False)


def same_batches(got, expected):
    got, expected = list(got), list(expected)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
            assert torch.equal(x, y)
    return got


def pair(store_path, resident, **options):
    """(streaming loader, resident loader) over two datasets made alike."""
    conversion = {k: options.pop(k) for k in ("mean", "std", "augment", "dtype") if k in options}
    stream = DeviceLoader(FastLoadDataset(store_path, 8, **options), "cpu", **conversion)
    return stream, resident.loader(FastLoadDataset(store_path, 8, **options), **conversion)


@pytest.mark.parametrize("order", ["random", "block", "sequential"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_every_batch_is_the_streaming_paths_in_every_order_and_rank(store_path, resident, order, world_size):
    for rank in range(world_size):
        options = dict(
            order=order, shuffle=order != "sequential", seed=3, rank=rank, world_size=world_size, block_size=4
        )
        stream, on_device = pair(store_path, resident, return_indices=True, **options)
        assert len(on_device) == len(stream)
        for _ in range(2):  # epochs advance alike
            same_batches(on_device, stream)


def test_set_epoch_and_a_resume_mid_epoch_continue_as_streaming(store_path, resident):
    options = dict(seed=5, return_indices=True, mean=[0.5, 0.4, 0.3], std=0.25, augment=AUGMENT)
    stream, on_device = pair(store_path, resident, **options)
    stream.set_epoch(4)
    on_device.set_epoch(4)
    expected = list(stream)
    it = iter(on_device)
    first = [next(it) for _ in range(2)]
    state = on_device.state_dict()
    assert state == {"seed": 5, "epoch": 4, "position": 2}
    _, again = pair(store_path, resident, **options)
    again.load_state_dict(state)
    same_batches(first + list(again), expected)
    assert again.state_dict() == {"seed": 5, "epoch": 5, "position": 0}


@settings(max_examples=15, deadline=None)
@given(
    batch_size=st.integers(1, 20),
    seed=st.integers(0, 2**31),
    world_size=st.integers(1, 3),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_any_plan_gives_the_streaming_batches(
    store_path, resident, batch_size, seed, world_size, drop_last, data
):
    rank = data.draw(st.integers(0, world_size - 1))
    indices = data.draw(st.lists(st.integers(0, N - 1), min_size=world_size, max_size=N, unique=True))
    options = dict(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last, indices=indices)
    stream = DeviceLoader(FastLoadDataset(store_path, batch_size, **options), "cpu")
    same_batches(resident.loader(FastLoadDataset(store_path, batch_size, **options)), stream)


def test_a_batch_held_is_never_written_over(store_path, resident):
    loader = resident.loader(FastLoadDataset(store_path, 8, seed=1, return_indices=True), dtype=torch.float64)
    store = Store(store_path)
    held = list(loader)  # every batch kept while the later ones are gathered
    for x, labels, indices in held:
        images, expected_labels = store.gather(indices.numpy())
        assert torch.equal(x, to_device(torch.from_numpy(images), "cpu", dtype=torch.float64))
        assert torch.equal(labels, torch.from_numpy(expected_labels))


def test_a_subset_is_held_and_a_dataset_reading_beyond_it_is_refused(store_path):
    part = DeviceStore(store_path, "cpu", indices=range(10, 30), reserve_bytes=0, progress=False)
    assert len(part) == 20 and part.nbytes == 20 * (6 * 5 * 3 + 8)
    ds = FastLoadDataset(store_path, 4, indices=range(12, 28), return_indices=True)
    same_batches(
        part.loader(ds),
        DeviceLoader(FastLoadDataset(store_path, 4, indices=range(12, 28), return_indices=True), "cpu"),
    )
    with pytest.raises(IndexError, match=r"not on the device.*indices="):
        part.loader(FastLoadDataset(store_path, 4))
    with pytest.raises(ValueError, match="more than once"):
        DeviceStore(store_path, "cpu", indices=[1, 1], progress=False)
    with pytest.raises(IndexError, match="out of range"):
        DeviceStore(store_path, "cpu", indices=[N], progress=False)


def test_a_store_that_does_not_fit_is_refused_before_anything_is_allocated(store_path, monkeypatch):
    record = 6 * 5 * 3 + 8
    monkeypatch.setattr(fastload.inspect, "free_device_bytes", lambda device: 1000 + 20 * record)
    allocated = []
    monkeypatch.setattr(torch, "empty", lambda *a, **k: allocated.append(a))
    with pytest.raises(MemoryError) as refused:
        DeviceStore(store_path, "cpu", reserve_bytes=1000, progress=False)
    message = str(refused.value)
    assert "45 records need 0.000 GB" in message and "reserved for the model" in message
    assert "at most 20 records (e.g. indices=range(20))" in message
    assert allocated == []
    monkeypatch.undo()
    monkeypatch.setattr(fastload.inspect, "free_device_bytes", lambda device: 1000 + 20 * record)
    assert len(DeviceStore(store_path, "cpu", indices=range(20), reserve_bytes=1000, progress=False)) == 20


def test_an_out_of_memory_during_the_upload_names_the_option(store_path, monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(torch, "empty", no_memory)
    with pytest.raises(MemoryError, match=r"DeviceStore, on_device=True, --on-device"):
        DeviceStore(store_path, "cpu", reserve_bytes=0, progress=False)


def test_the_upload_shows_progress_and_bad_arguments_are_named(store_path, capsys):
    DeviceStore(store_path, "cpu", reserve_bytes=0, progress=True)
    assert "uploading the store" in capsys.readouterr().err
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="reserve_bytes"):
            DeviceStore(store_path, "cpu", reserve_bytes=bad, progress=False)
    with pytest.raises(ValueError, match="device"):
        DeviceStore(store_path, "nowhere", progress=False)
    resident = DeviceStore(store_path, "cpu", reserve_bytes=0, progress=False)
    with pytest.raises(TypeError, match="FastLoadDataset"):
        resident.loader([1, 2])


def test_a_dataset_over_another_store_is_refused(store_path, resident, tmp_path):
    other = tmp_path / "other.fastload"
    with StoreWriter(other, (6, 5, 3), label_dtype="float64") as writer:
        writer.extend(np.zeros((N, 6, 5, 3), np.uint8), np.zeros(N))
    with pytest.raises(ValueError, match="another store"):
        resident.loader(FastLoadDataset(other, 8))


@pytest.fixture(scope="module")
def bright_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("resident-train") / "bright.fastload"
    images = np.random.default_rng(0).integers(0, 256, (40, 8, 8, 3), dtype=np.uint8)
    with StoreWriter(path, (8, 8, 3)) as writer:
        writer.extend(images, images.reshape(40, -1).mean(1) / 255.0)
    return path


TRAIN = dict(epochs=2, batch_size=8, device="cpu", threads=1, deterministic=True, augment="flip")


def close_histories(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            if key.startswith(("train_", "val_", "baseline_")):  # not timings
                assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-9), key


def test_fit_on_device_trains_on_the_same_batches(bright_path, monkeypatch):
    streamed = fastload.train.fit(bright_path, **TRAIN)
    made = []
    real = fastload.resident.DeviceStore.__init__

    def counted(self, *args, **kwargs):
        made.append(kwargs.get("indices"))
        real(self, *args, **kwargs)

    monkeypatch.setattr(fastload.resident.DeviceStore, "__init__", counted)
    resident = fastload.train.fit(bright_path, on_device=True, **TRAIN)
    close_histories(resident.history, streamed.history)
    assert len(made) == 1 and sorted(made[0]) == list(range(40))  # training and validation, once
    runs = [dict(name="a", lr=1e-3), dict(name="b", lr=3e-2, seed=1)]
    results = fastload.fit_many(bright_path, runs, on_device=True, **TRAIN)
    assert len(made) == 2  # one copy for both runs
    for result, alone in zip(results, fastload.fit_many(bright_path, runs, **TRAIN)):
        close_histories(result.history, alone.history)


def test_on_device_takes_no_workers_and_the_cli_flag_reaches_fit(bright_path, monkeypatch, capsys):
    with pytest.raises(ValueError, match="workers must be 0"):
        fastload.train.fit(bright_path, on_device=True, workers=2, **TRAIN)
    seen = []
    monkeypatch.setattr(fastload.train, "fit", lambda store, **options: seen.append(options) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        fastload.cli.main(["train", str(bright_path), "--on-device", "--device", "cpu"])
    assert seen[0]["on_device"] is True


def test_the_bench_row_gathers_on_the_device_beside_device_loader(store_path, tmp_path):

    from fastload import bench
    from fastload.bench.measure import Context, Plan, Skip
    from fastload.bench.stages import bench_resident, resident_figure

    store = Store(store_path)
    ctx = Context.for_store(
        store,
        sample=40,
        plan=Plan.for_run(quick=True),
        repeats=1,
        batch_size=8,
        workdir=str(tmp_path),
        cuda=False,
    )
    with ctx.resources:
        with pytest.raises(Skip, match="no GPU to hold the store"):
            bench_resident(ctx)
        figure = resident_figure(ctx, "cpu")
        assert figure.method == "resident, gather on device, float32" and figure.stage == "resident"
        assert figure.trial() == (40, 40 * 6 * 5 * 3)
    # Gathering in device memory is bounded by no host copy: its row never makes the memcpy limit wrong.
    rows = [
        {"stage": "memcpy", "method": "memcpy", "kind": "limit", "images_per_s": 100.0},
        {"stage": "resident", "method": figure.method, "kind": "fastload", "images_per_s": 1000.0},
    ]
    assert bench.limit_problem(rows) is None
    rows[1]["stage"] = "gather"
    assert bench.limit_problem(rows) is not None


def test_an_error_other_than_out_of_memory_during_the_upload_is_not_called_one(store_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch, "empty", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        DeviceStore(store_path, "cpu", reserve_bytes=0, progress=False)


def test_a_device_store_says_what_it_holds_and_where(store_path):
    resident = DeviceStore(store_path, "cpu", indices=range(10), reserve_bytes=0, progress=False)
    assert repr(resident) == f"DeviceStore({str(store_path)!r}, 10 records on cpu, 0.000 GB)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("side_stream", [False, True], ids=["default stream", "side stream"])
@pytest.mark.parametrize(
    "options",
    [{"mean": 0.5, "std": 0.25}, {"dtype": torch.bfloat16, "augment": AUGMENT}],
    ids=["plain", "augmented"],
)
def test_on_cuda_a_held_batch_is_never_written_over(store_path, options, side_stream):
    """ResidentLoader's guarantee on a real GPU: every batch of two epochs is held while the
    GPU lags behind the host (a long sleep kernel queued after each batch), on the default
    stream or a stream of the caller's; each must still be the batch the CPU copy makes, bit
    for bit, so neither of the two reused gather buffers was written while a conversion read it."""
    on_cpu = DeviceStore(store_path, "cpu", reserve_bytes=0, progress=False)
    on_gpu = DeviceStore(store_path, "cuda", reserve_bytes=0, progress=False)
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    for epoch in range(2):
        dataset = FastLoadDataset(store_path, 8, seed=2, return_indices=True)
        dataset.set_epoch(epoch)
        held = []
        with torch.cuda.stream(stream):
            for batch in on_gpu.loader(dataset, **options):
                torch.cuda._sleep(2_000_000)
                held.append(batch)
        torch.cuda.synchronize()
        reference = FastLoadDataset(store_path, 8, seed=2, return_indices=True)
        reference.set_epoch(epoch)
        expected = list(on_cpu.loader(reference, **options))
        assert len(held) == len(expected) == len(dataset)
        for got, want in zip(held, expected):
            for a, b in zip(got, want):
                if "augment" in options and a.is_floating_point():  # the GPU's sampling rounds differently
                    torch.testing.assert_close(a.cpu().float(), b.float(), atol=1e-2, rtol=0)
                else:
                    assert torch.equal(a.cpu(), b), "a held batch changed after it was handed out"


@pytest.mark.safety
def test_records_larger_than_the_device_are_refused_before_torch_shapes_them(tmp_path):
    """An empty store of 2**31 x 2**31 x 3 records made torch fail "Stride calculation overflowed"."""
    path = tmp_path / "wide.fastload"
    with StoreWriter(path, (2**31, 2**31, 3)):
        pass
    with pytest.raises(MemoryError) as refused:
        DeviceStore(path, "cpu")
    assert str(refused.value).startswith(
        f"{path}: one record of 2147483648x2147483648x3 takes 13,835,058,055.282 GB, more than the"
    )
