"""DeviceLoader, the public device stage: on the CPU it equals to_device batch by batch; on CUDA
(simulated here: no GPU in CI) it queues each batch's copies on a stream of its own ahead of the
batch handed out, never makes the host wait while the GPU keeps up, and never lets a pinned
buffer be refilled before its copy ran; resume, epochs and early exits; to_device's checks."""

import contextlib
import ctypes
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import fastload
import fastload.device
from fastload import Augment, DeviceLoader, FastLoadDataset, Store, StoreWriter, to_device
from fastload.bench.measure import Context, Plan
from fastload.bench.stages import bench_to_device
from fastload.dataset.prefetch import Pass

N = 45  # not a multiple of the batch size
MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.5]
AUGMENT = Augment.from_spec("crop=0.5,flip,jitter", size=4, seed=1)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("device") / "s.bin"
    images = np.random.default_rng(0).integers(0, 256, (N, 6, 5, 3), dtype=np.uint8)
    with StoreWriter(path, (6, 5, 3), label_dtype="float64") as writer:
        writer.extend(images, np.arange(N) / 10)
    return path


def expected_batch(store, indices, epoch, augment=None, **options):
    """What to_device makes of the records `indices`, and their labels."""
    images, labels = store.gather(indices.numpy())
    x = to_device(torch.from_numpy(images), "cpu", augment=augment, keys=indices, epoch=epoch, **options)
    return x, torch.from_numpy(labels)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"mean": MEAN, "std": STD},
        {"mean": MEAN, "std": STD, "augment": AUGMENT},
        {"dtype": torch.bfloat16, "channels_last": False, "mean": 0.5, "std": 0.25},
    ],
)
@pytest.mark.parametrize("through_dataloader", [False, True])
def test_on_the_cpu_each_batch_is_exactly_what_to_device_makes(store_path, options, through_dataloader):
    store = Store(store_path)
    ds = FastLoadDataset(store, 8, seed=2, return_indices=True)
    source = DataLoader(ds, batch_size=None) if through_dataloader else ds
    loader = DeviceLoader(source, "cpu", **options)
    assert len(loader) == len(ds) == 6
    for epoch in range(2):
        seen = []
        for x, labels, indices in loader:
            expected, expected_labels = expected_batch(store, indices, epoch, **options)
            assert torch.equal(x, expected) and x.dtype == expected.dtype and x.stride() == expected.stride()
            assert torch.equal(labels, expected_labels)
            seen += indices.tolist()
        assert sorted(seen) == list(range(N))


def test_bare_image_batches_come_out_bare(store_path):
    images = torch.from_numpy(Store(store_path).gather(np.arange(8))[0])
    (x,) = list(DeviceLoader([images], "cpu", mean=MEAN, std=STD))
    assert torch.equal(x, to_device(images, "cpu", mean=MEAN, std=STD))


def test_epochs_follow_set_epoch_or_count_iterations(store_path):
    """The augmentation draws for the epoch the dataset is in: set_epoch passes through to the
    dataset (also behind a DataLoader), and without it both count iterations alike."""
    store = Store(store_path)
    ds = FastLoadDataset(store, 16, seed=4, return_indices=True)
    loader = DeviceLoader(DataLoader(ds, batch_size=None), "cpu", augment=AUGMENT)
    for epoch in (0, 1):  # counted
        for x, _, indices in loader:
            assert torch.equal(x, expected_batch(store, indices, epoch, augment=AUGMENT)[0])
    loader.set_epoch(7)
    order = [indices.tolist() for _, _, indices in FastLoadDataset(store, 16, seed=4, return_indices=True)]
    reference = FastLoadDataset(store, 16, seed=4, return_indices=True)
    reference.set_epoch(7)
    batches = list(loader)
    assert [i.tolist() for _, _, i in batches] == [i.tolist() for _, _, i in reference] != order
    for x, _, indices in batches:
        assert torch.equal(x, expected_batch(store, indices, 7, augment=AUGMENT)[0])


@pytest.mark.parametrize("depth", [1, 3])
def test_state_dict_counts_the_batches_handed_out_not_those_copied_ahead(store_path, depth):
    store = Store(store_path)
    make = lambda: FastLoadDataset(store, 4, seed=5, return_indices=True)  # noqa: E731
    everything = [indices.tolist() for _, _, indices in make()]
    ds = make()
    loader = DeviceLoader(ds, "cpu", depth=depth)
    assert loader.state_dict() == {"seed": 5, "epoch": 0, "position": 0}
    taken = []
    for _, _, indices in loader:
        taken.append(indices.tolist())
        if len(taken) == 3:
            break
    state = loader.state_dict()
    assert state == {"seed": 5, "epoch": 0, "position": 3}
    resumed = DeviceLoader(make(), "cpu", depth=depth)
    resumed.load_state_dict(state)
    rest = [indices.tolist() for _, _, indices in resumed]
    assert taken + rest == everything
    assert resumed.state_dict() == {"seed": 5, "epoch": 1, "position": 0}


def test_state_dict_is_exact_through_a_dataloader_with_workers(store_path):
    """The dataset object in the main process cannot see its workers' progress; the loader
    counts what the loop got, so resuming from its state continues exactly."""
    store = Store(store_path)

    def make():
        ds = FastLoadDataset(store, 4, seed=6, return_indices=True)
        return DeviceLoader(DataLoader(ds, batch_size=None, num_workers=1), "cpu")

    loader = make()
    loader.set_epoch(2)
    everything = [indices.tolist() for _, _, indices in loader]
    loader.set_epoch(2)
    taken = []
    for _, _, indices in loader:
        taken.append(indices.tolist())
        if len(taken) == 5:
            break
    state = loader.state_dict()
    assert state == {"seed": 6, "epoch": 2, "position": 5}
    resumed = make()
    resumed.load_state_dict(state)
    assert taken + [indices.tolist() for _, _, indices in resumed] == everything


def test_leaving_early_closes_the_source(store_path, monkeypatch):
    """A loop that breaks (or raises) closes the dataset's pass at once, which joins its
    threads and hands its buffers back; the next iteration runs whole."""
    closed = []
    close = Pass.close
    monkeypatch.setattr(Pass, "close", lambda self: closed.append(self) or close(self))
    ds = FastLoadDataset(store_path, 4, return_indices=True)
    loader = DeviceLoader(ds, "cpu")
    for _ in loader:
        break
    assert len(closed) == 1
    assert sum(len(x) for x, _, _ in loader) == N and len(closed) == 2


def test_timings_on_the_cpu(store_path):
    loader = DeviceLoader(FastLoadDataset(store_path, 8), "cpu", timing=True)
    list(loader)
    summary = loader.timings()
    assert summary["batches"] == 6 and set(summary) == {"batches", "wait_ms", "convert_ms"}
    assert all(summary[k]["total"] >= summary[k]["median"] >= 0 for k in ("wait_ms", "convert_ms"))
    with pytest.raises(ValueError, match="timing=True"):
        DeviceLoader([], "cpu").timings()


class SimulatedCuda:
    """CUDA on the CPU, for DeviceLoader and the dataset's pinned buffers. The copy stream
    queues copies and events; the simulated GPU runs them in order only when it is told to
    (`run`: it caught up), when the compute stream waits for one of its events (the GPU does
    that copy before going on: no host wait), or when the host synchronizes (counted in
    `syncs`). A copy reads the host memory when it runs, as DMA does, and notes in
    `overwritten` any whose bytes changed after it was queued; with `keeps_up`, an event
    recorded while the copy stream is idle is done at once. The compute stream is the
    host itself: what is queued there has run at once. `log` lists ("copy", n) as batch n's
    images copy is queued and the test adds ("out", n) as batch n reaches the loop."""

    def __init__(self, monkeypatch):
        self.queue, self.log, self.overwritten, self.record_streams = [], [], [], []
        self.pinned, self.allocator = [], {}  # the pool's pinned buffers; pin_memory's copies
        self.syncs = self.copies = self.clock = 0
        self.keeps_up = False  # then an event recorded on the idle copy stream is done at once
        gpu = self

        class Stream:
            def __init__(self, device=None, compute=False):
                self.compute = compute

            def wait_event(self, event):
                gpu.log.append(("wait", event))
                if self.compute:
                    gpu.run(until=event)

            def wait_stream(self, other):
                if self.compute:
                    gpu.run()  # the GPU finishes the copies before going on: no host wait

            def synchronize(self):
                gpu.syncs += 1
                gpu.run()

        class Event:
            def __init__(self, enable_timing=False):
                self.done, self.time = False, None

            def record(self, stream=None):
                self.done = False
                if (stream or gpu.current).compute or (gpu.keeps_up and not gpu.queue):
                    self.done, self.time = True, gpu.clock
                else:
                    gpu.queue.append(("event", self))

            def query(self):
                return self.done

            def synchronize(self):
                gpu.syncs += 1
                if not self.done:
                    gpu.run(until=self)

            def elapsed_time(self, later):
                return float(later.time - self.time)

        self.compute = self.current = Stream(compute=True)

        @contextlib.contextmanager
        def stream(s):
            previous, self.current = self.current, s
            try:
                yield
            finally:
                self.current = previous

        def synchronize(device=None):
            gpu.syncs += 1
            gpu.run()

        def copy(copies, tensor):
            assert tensor.is_contiguous() and tensor.is_pinned()
            out = torch.empty_like(tensor)
            if tensor.dim() == 4:
                self.log.append(("copy", self.copies))
                self.copies += 1
            # The address and the bytes due, not the tensor (the GPU holds no reference to it),
            # unless torch's host allocator keeps it until the copy ran (made by pin_memory).
            kept = self.allocator.pop(tensor.data_ptr(), None)
            self.queue.append(("copy", (tensor.data_ptr(), tensor.nbytes, _bytes(tensor), out, kept)))
            return out

        def pin_memory(tensor):
            pinned = tensor.clone()
            self.allocator[pinned.data_ptr()] = pinned
            return pinned

        def is_pinned(tensor):
            address = tensor.data_ptr()
            return address in self.allocator or any(a <= address < a + n for a, n in self.pinned)

        empty = torch.empty

        def pinned_empty(*args, **kwargs):
            pin = kwargs.pop("pin_memory", False)
            tensor = empty(*args, **kwargs)
            if pin:
                self.pinned.append((tensor.data_ptr(), tensor.nbytes))
            return tensor

        for name, value in (
            ("is_available", lambda: True),
            ("is_initialized", lambda: True),
            ("current_device", lambda: 0),
            ("Stream", Stream),
            ("Event", Event),
            ("stream", stream),
            ("current_stream", lambda device=None: self.current),
            ("synchronize", synchronize),
        ):
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(torch, "empty", pinned_empty)
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: self.record_streams.append((t, s)))
        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
        monkeypatch.setattr(torch.Tensor, "is_pinned", is_pinned)
        monkeypatch.setattr(fastload.device.CudaCopies, "copy", copy)

    def run(self, until=None):
        """Runs the copy stream's queue in order: all of it, or up to and including `until`."""
        while self.queue:
            kind, item = self.queue.pop(0)
            self.clock += 1
            if kind == "event":
                item.done, item.time = True, self.clock
                if item is until:
                    return
                continue
            address, nbytes, due, out, _ = item
            now = ctypes.string_at(address, nbytes)
            if now != due:
                self.overwritten.append(address)
            if nbytes:
                out.reshape(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(now), dtype=torch.uint8))


def _bytes(tensor):
    return ctypes.string_at(tensor.data_ptr(), tensor.nbytes)


def simulated_epochs(gpu, store, loader, epochs, catch_up, options):
    """Runs `epochs` through `loader`, checking each batch against to_device and logging it;
    with `catch_up`, the GPU keeps up: it finishes its queue during each step."""
    gpu.keeps_up = catch_up
    for epoch in range(epochs):
        handed = 0
        for x, labels, indices in loader:
            gpu.log.append(("out", handed))
            expected, expected_labels = expected_batch(store, indices, epoch, **options)
            assert torch.equal(x, expected) and torch.equal(labels, expected_labels)
            handed += 1
            if catch_up:
                gpu.run()
        gpu.log = [entry for entry in gpu.log if entry[0] != "wait"]
        yield handed


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_the_copies_of_the_next_batches_are_queued_before_a_batch_is_handed_out(
    store_path, monkeypatch, depth
):
    gpu = SimulatedCuda(monkeypatch)
    store = Store(store_path)
    ds = FastLoadDataset(store, 4, return_indices=True)
    assert ds.pin_memory
    loader = DeviceLoader(ds, "cuda", depth=depth)
    (batches,) = simulated_epochs(gpu, store, loader, 1, True, {})
    assert batches == len(ds)
    for k in range(batches):
        for ahead in range(k, min(k + depth, batches - 1) + 1):
            assert gpu.log.index(("copy", ahead)) < gpu.log.index(("out", k))


@pytest.mark.parametrize(
    "options", [{"mean": MEAN, "std": STD}, {"augment": AUGMENT, "dtype": torch.bfloat16}]
)
def test_the_host_never_waits_while_the_gpu_keeps_up(store_path, monkeypatch, options):
    """With the GPU done with its queue at each step, no event, stream or device is ever
    synchronized (the compute stream waits for each copy on the GPU), every device tensor is
    marked as used on the compute stream, the batches are to_device's bit for bit and the
    pinned buffers are reused, not allocated anew."""
    gpu = SimulatedCuda(monkeypatch)
    allocated = []
    make_buffer = fastload.dataset.buffers.BufferPool._new_buffer
    monkeypatch.setattr(
        fastload.dataset.buffers.BufferPool,
        "_new_buffer",
        lambda pool: allocated.append(1) or make_buffer(pool),
    )
    store = Store(store_path)
    ds = FastLoadDataset(store, 4, return_indices=True)
    loader = DeviceLoader(ds, "cuda", **options)
    assert list(simulated_epochs(gpu, store, loader, 3, True, options)) == [len(ds)] * 3
    assert gpu.syncs == 0 and gpu.overwritten == []
    # images, labels and indices of every batch, each marked as used on the compute stream
    assert len(gpu.record_streams) == 3 * 3 * len(ds)
    assert all(stream is gpu.compute for _, stream in gpu.record_streams)
    assert len(allocated) <= ds.prefetch + loader.depth + 2


@pytest.mark.parametrize("depth", [1, 2])
def test_a_pinned_buffer_is_refilled_only_after_its_copy_ran(store_path, monkeypatch, depth):
    """The GPU lags as far as it can: it runs a copy only when the compute stream needs it
    or the host synchronizes, so the dataset's events on the buffers report not done for
    batches on end. No buffer is rewritten before the copy queued on it ran."""
    gpu = SimulatedCuda(monkeypatch)
    store = Store(store_path)
    ds = FastLoadDataset(store, 4, prefetch=2, return_indices=True)
    loader = DeviceLoader(ds, "cuda", depth=depth, mean=MEAN, std=STD)
    assert list(simulated_epochs(gpu, store, loader, 2, False, {"mean": MEAN, "std": STD})) == [len(ds)] * 2
    gpu.run()
    assert gpu.overwritten == []


def test_a_loop_that_breaks_leaves_nothing_queued_behind(store_path, monkeypatch):
    """Breaking out with copies still queued: the dataset's pass is closed, the buffers of the
    batches copied ahead are refilled only once their copies ran (the loop's stream waits for
    the copy stream: on the GPU), and the next epoch runs whole."""
    gpu = SimulatedCuda(monkeypatch)
    closed = []
    close = Pass.close
    monkeypatch.setattr(Pass, "close", lambda self: closed.append(self) or close(self))
    store = Store(store_path)
    ds = FastLoadDataset(store, 4, return_indices=True)
    loader = DeviceLoader(ds, "cuda", depth=3)
    for _ in loader:
        break
    assert len(closed) == 1 and loader.state_dict()["position"] == 1
    # The dataset iterated directly next, on the loop's stream, with the copies of the
    # batches read ahead perhaps still queued: its buffers are refilled only after them.
    for images, _, _ in ds:
        del images
    assert list(simulated_epochs(gpu, store, loader, 1, False, {})) == [len(ds)]
    gpu.run()
    assert gpu.overwritten == [] and len(closed) == 3


def test_timings_per_stage_from_cuda_events(store_path, monkeypatch):
    gpu = SimulatedCuda(monkeypatch)
    loader = DeviceLoader(FastLoadDataset(store_path, 8, return_indices=True), "cuda", timing=True)
    gpu.keeps_up, batches = True, 0
    for _ in loader:
        batches += 1
        gpu.run()
    assert gpu.syncs == 0
    summary = loader.timings()
    stages = {"wait_ms", "copy_ms", "link_idle_ms", "gpu_wait_ms", "convert_ms"}
    assert summary["batches"] == batches == 6 and set(summary) == {"batches"} | stages
    assert all(math.isfinite(summary[s]["total"]) for s in stages)
    assert gpu.syncs == 1  # timings() waits for the last batch


def test_the_bench_measures_to_device_through_device_loader(store_path, monkeypatch, tmp_path):
    """bench's to_device stage (run here on the simulated GPU) delivers every sampled record
    through DeviceLoader and keeps the per-stage breakdown of an untimed epoch in the figure."""
    gpu = SimulatedCuda(monkeypatch)
    gpu.keeps_up = True
    store = Store(store_path)
    ctx = Context.for_store(
        store,
        sample=40,
        plan=Plan.for_run(quick=True),
        repeats=1,
        batch_size=8,
        workdir=str(tmp_path),
        cuda=True,
    )
    with ctx.resources:
        (figure,) = bench_to_device(ctx)
        assert figure.method.startswith("FastLoadDataset + to_device") and "DeviceLoader" in figure.note
        assert figure.trial() == (40, 40 * 6 * 5 * 3)
    breakdown = figure.extra["per_batch_ms"]
    assert breakdown["batches"] == 5 and {"copy_ms", "gpu_wait_ms", "convert_ms"} <= set(breakdown)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"depth": 0}, ValueError, "depth must be an integer from 1 to 16"),
        ({"depth": 17}, ValueError, "depth must be"),
        ({"depth": True}, ValueError, "depth must be"),
        ({"timing": "yes"}, TypeError, "timing must be True or False"),
        ({"channels_last": 1}, TypeError, "channels_last must be True or False"),
        ({"dtype": torch.int64}, TypeError, "dtype must be a floating-point"),
        ({"dtype": "float64x"}, TypeError, "not 'float64x'$"),
        ({"mean": [0.5, math.nan, 0.5]}, ValueError, "mean must be finite"),
        ({"std": math.inf}, ValueError, "std must be finite"),
        ({"std": [0.2, 0.0, 0.2]}, ValueError, "std must not be zero"),
        ({"std": -0.2}, ValueError, "std must be positive"),
        ({"mean": "grey"}, TypeError, "mean must be a number"),
        ({"augment": "flip"}, TypeError, "augment must be a fastload.Augment"),
    ],
)
def test_bad_arguments_are_refused_up_front_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        DeviceLoader([], "cpu", **kwargs)


def test_bad_sources_and_devices_are_refused(store_path, monkeypatch):
    with pytest.raises(TypeError, match="source must be an iterable"):
        DeviceLoader(3, "cpu")
    with pytest.raises(ValueError, match="device must be a torch device"):
        DeviceLoader([], "gpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        DeviceLoader([], "cuda")
    with pytest.raises(TypeError, match="must yield uint8 images tensors or tuples"):
        list(DeviceLoader([{"images": 1}], "cpu"))
    with pytest.raises(TypeError, match="uint8"):
        list(DeviceLoader([torch.zeros(1, 2, 2, 3)], "cpu"))
    with pytest.raises(ValueError, match="augment needs the record index"):
        list(DeviceLoader(FastLoadDataset(store_path, 8), "cpu", augment=AUGMENT))
    with pytest.raises(ValueError, match="epoch must be a non-negative int"):
        DeviceLoader([], "cpu").set_epoch(-1)
    with pytest.raises(TypeError, match="no dataset with a state_dict"):
        DeviceLoader([], "cpu").state_dict()


IMAGES = torch.zeros(1, 2, 2, 3, dtype=torch.uint8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mean": math.nan}, "mean must be finite"),
        ({"mean": [0.1, math.inf, 0.1]}, "mean must be finite"),
        ({"std": math.nan}, "std must be finite"),
        ({"std": [math.inf, 1.0, 1.0]}, "std must be finite"),
        ({"std": 0.0}, "std must not be zero"),
        ({"std": [0.2, -0.2, 0.2]}, "std must be positive"),
        ({"std": 1e-6, "dtype": torch.float16}, "beyond torch.float16's range"),
        ({"mean": 1e39, "dtype": torch.float32}, "beyond torch.float32.s range"),
        ({"epoch": -1}, "epoch must be a non-negative int"),
    ],
)
def test_to_device_refuses_numbers_that_would_give_nan_or_inf(kwargs, match):
    """#24: a NaN or infinite mean or std made every output NaN on the float64 path."""
    with pytest.raises(ValueError, match=match):
        to_device(IMAGES, "cpu", **{"dtype": torch.float64, **kwargs})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("depth", [1, 2, 4])
def test_on_cuda_the_batches_are_the_cpu_ones(store_path, depth):
    """On a real GPU: the plain conversion gives the CPU's bits (the same float32 operations),
    the augmented one the CPU's within rounding; labels and indices arrive; a loop that breaks
    leaves the next epoch whole; timings() gives every stage."""
    store = Store(store_path)
    ds = FastLoadDataset(store, 8, seed=3, return_indices=True)
    assert ds.pin_memory
    for options, exact in (({"mean": MEAN, "std": STD}, True), ({"augment": AUGMENT}, False)):
        loader = DeviceLoader(ds, "cuda", depth=depth, timing=True, **options)
        for epoch in range(2):
            for step, (x, labels, indices) in enumerate(loader):
                assert x.is_cuda and labels.is_cuda and indices.is_cuda
                expected, expected_labels = expected_batch(store, indices.cpu(), epoch, **options)
                if exact:
                    assert torch.equal(x.cpu(), expected)
                else:
                    torch.testing.assert_close(x.cpu(), expected, atol=1e-4, rtol=0)
                assert torch.equal(labels.cpu(), expected_labels)
                if epoch == 0 and step == 2:
                    break
        summary = loader.timings()
        assert summary["batches"] == len(ds) and {"copy_ms", "gpu_wait_ms", "convert_ms"} <= set(summary)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_to_device_layout_dtype_and_normalization(dtype):
    images = torch.randint(0, 256, (2, 5, 4, 3), dtype=torch.uint8)
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.5]
    x = to_device(images, "cpu", dtype=dtype, mean=mean, std=std)
    assert x.shape == (2, 3, 5, 4) and x.dtype == dtype
    assert x.is_contiguous(memory_format=torch.channels_last)
    expected = (
        images.permute(0, 3, 1, 2).double() / 255 - torch.tensor(mean).view(1, 3, 1, 1).double()
    ) / torch.tensor(std).view(1, 3, 1, 1).double()
    torch.testing.assert_close(
        x.double(), expected, atol=0.03 if dtype == torch.bfloat16 else 1e-5, rtol=0.01
    )
    plain = to_device(images, "cpu", channels_last=False)
    assert plain.is_contiguous() and plain.shape == (2, 3, 5, 4)
    torch.testing.assert_close(plain, images.permute(0, 3, 1, 2).float() / 255)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 5), st.integers(1, 9), st.integers(1, 9), st.sampled_from([1, 3, 4])),
    mean=st.floats(-1, 2),
    std=st.floats(0.01, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_to_device_on_the_cpu_gives_the_same_bits_as_the_torch_formula(shape, mean, std, seed):
    """float32 on the CPU runs the native kernel (1 or 3 channels) into recycled memory; it
    must equal `x.float() * scale - shift` bit for bit, whatever the path."""
    images = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))
    channels = shape[3]
    means, stds = [mean + k / 10 for k in range(channels)], [std * (1 + k) for k in range(channels)]
    x = to_device(images, "cpu", mean=means, std=stds)
    scale, shift = fastload.device._normalization(
        torch.device("cpu"), torch.float32, *map(tuple, (means, stds))
    )
    expected = images.permute(0, 3, 1, 2).to(torch.float32).mul_(scale).sub_(shift)
    assert x.is_contiguous(memory_format=torch.channels_last) and x.dtype == torch.float32
    assert torch.equal(x, expected)


def test_to_device_makes_its_normalization_tensors_once_per_setting():
    """Each batch reuses the scale and shift already on the device (a new small tensor per
    batch would be a synchronous copy behind the batch's asynchronous one); alternating
    settings each get their own."""
    images = torch.randint(0, 256, (2, 3, 3, 3), dtype=torch.uint8)
    settings = [((0.5, 0.4, 0.3), (0.2, 0.25, 0.5)), (0.5, 0.25), ((0.1, 0.2, 0.3), (1.0, 1.0, 1.0))]
    fastload.device._normalization.cache_clear()
    for _ in range(3):
        for mean, std in settings:
            x = to_device(images, "cpu", mean=mean, std=std)
            m = torch.tensor(mean, dtype=torch.float64).reshape(1, -1, 1, 1)
            sd = torch.tensor(std, dtype=torch.float64).reshape(1, -1, 1, 1)
            expected = (images.permute(0, 3, 1, 2).double() / 255 - m) / sd
            torch.testing.assert_close(x.double(), expected, atol=1e-5, rtol=1e-5)
    assert fastload.device._normalization.cache_info().misses == len(settings)


def test_to_device_rejects_bad_input():
    images = torch.zeros(1, 2, 2, 3, dtype=torch.uint8)
    with pytest.raises(TypeError, match="uint8"):
        to_device(torch.zeros(1, 2, 2, 3), "cpu")
    with pytest.raises(ValueError, match="^mean must have 1 or 3 values, not 2$"):
        to_device(images, "cpu", mean=[0.1, 0.2])
    with pytest.raises(ValueError, match="^std must have 1 or 3 values, not 2$"):
        to_device(images, "cpu", std=[0.1, 0.2])
    with pytest.raises(ValueError, match="^std must not be zero"):
        to_device(images, "cpu", std=[0.1, 0.0, 0.2])
    with pytest.raises(TypeError, match="^augment must be a fastload.Augment, not str$"):
        to_device(images, "cpu", augment="crop", keys=[0])
    with pytest.raises(
        ValueError, match=r"^augment needs keys: the record index of each image \(FastLoadDataset\("
    ):
        to_device(images, "cpu", augment=fastload.Augment(hflip=0.5))
    for dtype in (torch.int32, "float64x", "float 16", "int32"):
        with pytest.raises(TypeError, match="^dtype must be a floating-point torch dtype"):
            to_device(images, "cpu", dtype=dtype)


def test_to_device_takes_a_dtype_by_name_and_moves_to_the_device_asked_for():
    images = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    assert to_device(images, "cpu", dtype="bfloat16").dtype == torch.bfloat16
    # "meta": a device other than the CPU that needs no GPU; normalisation happens there too
    on_meta = to_device(images, "meta", mean=[0.5, 0.4, 0.3], std=[0.2, 0.2, 0.2])
    assert on_meta.device.type == "meta" and on_meta.shape == (2, 3, 4, 4)


def test_to_device_augments_as_for_epoch_0_unless_told_the_epoch():
    images = torch.arange(16 * 4 * 4 * 3, dtype=torch.int64).remainder(251).to(torch.uint8).view(16, 4, 4, 3)
    augment, keys = fastload.Augment(hflip=0.5, seed=3), list(range(16))
    default = to_device(images, "cpu", augment=augment, keys=keys)
    assert torch.equal(default, to_device(images, "cpu", augment=augment, keys=keys, epoch=0))
    assert not torch.equal(default, to_device(images, "cpu", augment=augment, keys=keys, epoch=1))  # 2**-16


def test_float32_cpu_batches_go_through_the_fused_kernel(monkeypatch):
    """The same bits as the torch formula (tested above), in one pass instead of three."""
    calls = []
    convert = fastload.device.convert
    monkeypatch.setattr(fastload.device, "convert", lambda *args: calls.append(1) or convert(*args))
    images = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    to_device(images, "cpu")
    assert calls == [1]
    to_device(images, "cpu", dtype=torch.float16)
    to_device(images, "cpu", channels_last=False)
    assert calls == [1]


def test_a_pinned_batch_is_copied_without_blocking_and_a_pageable_one_is_not(monkeypatch):
    """The copy of a batch in pinned memory is queued asynchronously (`non_blocking=True`:
    the host goes on while the DMA engine copies), by to_device and by DeviceLoader on a device
    without a copy stream, labels included; a pageable batch is copied as torch must (a
    non-blocking copy from pageable memory is synchronous anyway). Pinned memory needs CUDA, so
    `is_pinned` is simulated here and each `.to` records how it was asked."""
    pinned, copies = set(), []
    moved = torch.Tensor.to

    def to(tensor, *args, **kwargs):
        copies.append((tensor.dtype, kwargs.get("non_blocking", False)))
        return moved(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda tensor: tensor.data_ptr() in pinned)
    monkeypatch.setattr(torch.Tensor, "to", to)
    images = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    labels = torch.arange(2)
    to_device(images, "cpu")
    assert copies[0] == (torch.uint8, False)
    pinned.update({images.data_ptr(), labels.data_ptr()})
    copies.clear()
    to_device(images, "cpu")
    assert copies[0] == (torch.uint8, True)
    copies.clear()
    list(DeviceLoader([(images, labels)], "cpu"))
    assert copies[:2] == [(torch.uint8, True), (torch.int64, True)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("depth", [1, 2, 4])
def test_on_cuda_held_batches_survive_a_slow_gpu(store_path, depth):
    """The events on a real GPU: every batch of two epochs is held while the GPU lags far
    behind the host (each step queues a long sleep kernel), so a pinned buffer refilled before
    its copy ran, or a device buffer reused while a held batch still reads it, shows as a batch
    that differs from the CPU's. The stage timings count every batch, none negative."""
    store = Store(store_path)
    ds = FastLoadDataset(store, 8, seed=5, return_indices=True)
    loader = DeviceLoader(ds, "cuda", depth=depth, timing=True, mean=MEAN, std=STD)
    for epoch in range(2):
        held = []
        for x, labels, indices in loader:
            torch.cuda._sleep(2_000_000)  # ~1 ms of GPU time: the host runs ahead of the GPU
            held.append((x, labels, indices))
        torch.cuda.synchronize()
        assert len(held) == len(ds)
        for x, labels, indices in held:
            expected, expected_labels = expected_batch(store, indices.cpu(), epoch, mean=MEAN, std=STD)
            assert torch.equal(x.cpu(), expected)
            assert torch.equal(labels.cpu(), expected_labels)
        summary = loader.timings()
        assert summary["batches"] == len(ds)
        assert all(summary[stage]["median"] >= 0 for stage in ("copy_ms", "gpu_wait_ms", "convert_ms"))
