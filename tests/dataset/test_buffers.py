"""Batch buffer lifetime (`fastload.dataset.buffers`): no byte of a batch the user can still
reach is ever rewritten by the prefetcher, whatever way the batch is kept, and a batch whose
memory the user moved (shared memory, a torch.multiprocessing queue) is never written again."""

import ctypes
import functools
import pickle
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from dataset_helpers import N, simulate_worker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from fastload import FastLoadDataset, Store, StoreWriter
from fastload.dataset import buffers
from fastload.dataset.buffers import COPIES_IN_FLIGHT, BufferPool

RECORDS = 48


@pytest.fixture(scope="module")
def marked_store(tmp_path_factory):
    """Records whose every byte is their record number, so a batch's pixels name its records."""
    path = tmp_path_factory.mktemp("buffers") / "marked.bin"
    with StoreWriter(path, shape=(8, 8, 3), label_dtype="int64") as writer:
        for i in range(RECORDS):
            writer.append(np.full((8, 8, 3), i, np.uint8), i)
    return path


def _records_in(images) -> list:
    return torch.as_tensor(np.asarray(images)).reshape(len(images), -1)[:, 0].tolist()


def _torch_dlpack(images):
    return torch.from_dlpack(images)


def _numpy_dlpack(images):
    return np.from_dlpack(images)


def _storage(images):
    """Only the Python storage object, re-viewed as a batch when checked."""
    return (images.untyped_storage(), images.shape)


def _shared(images):
    return images.share_memory_()


def _pickled(images):
    return pickle.loads(pickle.dumps(images))


def _cloned_then_dropped(images):
    return images.clone()


KEEPERS = {
    "tensor": lambda images: images,
    "view": lambda images: images[:, 1:],
    "numpy": lambda images: images.numpy(),
    "torch_dlpack": _torch_dlpack,
    "numpy_dlpack": _numpy_dlpack,
    "storage": _storage,
    "share_memory_": _shared,
    "pickle": _pickled,
    "clone": _cloned_then_dropped,
}


def _as_batch(kept):
    if isinstance(kept, tuple):  # a storage object and the batch's shape
        storage, shape = kept
        return torch.empty(0, dtype=torch.uint8).set_(storage)[: int(np.prod(shape))].view(shape)
    return kept


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=st.lists(st.tuples(st.sampled_from(sorted(KEEPERS)), st.booleans()), min_size=1, max_size=14),
    batch_size=st.integers(1, 5),
    prefetch=st.integers(1, 3),
)
def test_a_batch_kept_any_way_keeps_its_bytes(marked_store, plan, batch_size, prefetch):
    """Over epochs, batches kept in every way a user can keep one (views, NumPy, DLPack, the
    storage alone, shared memory, pickling, a clone) keep the records they were yielded with,
    while the loop goes on and later batches are gathered."""
    ds = FastLoadDataset(marked_store, batch_size, prefetch=prefetch, seed=1)
    held = []
    steps = iter(plan * 50)
    for _ in range(2):
        for images, labels in ds:
            keeper, keep = next(steps, ("tensor", False))
            if keep:
                held.append((KEEPERS[keeper](images), labels.tolist(), keeper))
            assert _records_in(images) == labels.tolist()
            del images, labels
    for kept, expected, keeper in held:
        assert _records_in(_as_batch(kept)) == expected, keeper


def test_a_batch_moved_to_shared_memory_is_never_written_again(marked_store):
    """`share_memory_()` moves the batch and frees its old memory: the buffer is retired, so
    later batches carry their own pixels and nothing writes to freed memory (on main before
    this rule: old pixels under new labels, then heap corruption)."""
    ds = FastLoadDataset(marked_store, 3, shuffle=False, prefetch=2)
    recent = []
    for _ in range(3):
        for images, labels in ds:
            images.share_memory_()
            assert _records_in(images) == labels.tolist()
            recent = [*recent[-3:], (images, labels.tolist())]
    for images, expected in recent:
        assert _records_in(images) == expected


def test_a_batch_kept_only_through_its_storage_is_not_overwritten(marked_store):
    ds = FastLoadDataset(marked_store, 4, shuffle=False, prefetch=2)
    kept = [(images.untyped_storage(), images.shape, labels.tolist()) for images, labels in ds]
    for storage, shape, expected in kept:
        assert _records_in(_as_batch((storage, shape))) == expected


CONSUMER = """
import sys
import numpy as np
import torch
import torch.multiprocessing as mp
from fastload import FastLoadDataset


def consume(queue, results):
    bad = 0
    while True:
        item = queue.get()
        if item is None:
            break
        images, labels = item
        if images.reshape(len(images), -1)[:, 0].tolist() != labels.tolist():
            bad += 1
    results.put(bad)


if __name__ == "__main__":
    context = mp.get_context(sys.argv[2])
    queue, results = context.Queue(), context.Queue()
    consumer = context.Process(target=consume, args=(queue, results))
    consumer.start()
    bad = 0
    ds = FastLoadDataset(sys.argv[1], 3, shuffle=False, prefetch=2)
    for _ in range(4):
        for k, (images, labels) in enumerate(ds):
            if images.reshape(len(images), -1)[:, 0].tolist() != labels.tolist():
                bad += 1
            if k % 10 == 0:
                queue.put((images, labels))
    queue.put(None)
    consumer_bad = results.get(timeout=60)
    consumer.join(timeout=60)
    print("bad", bad, consumer_bad)
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_batches_sent_through_a_torch_multiprocessing_queue(marked_store, tmp_path, start_method):
    """Every 10th batch goes to a consumer process through a torch.multiprocessing queue (which
    moves it into shared memory): the producer's later batches and the consumer's batches all
    carry their own records, and neither process crashes."""
    script = tmp_path / "consumer.py"
    script.write_text(textwrap.dedent(CONSUMER))
    done = subprocess.run(
        [sys.executable, str(script), str(marked_store), start_method],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["bad", "0", "0"], done.stdout


def test_held_batches_are_never_overwritten(store_path):
    store = Store(store_path)
    ds = FastLoadDataset(store, 2, prefetch=2, return_indices=True)
    held, addresses = [], []
    for k, (images, labels, idx) in enumerate(ds):
        addresses.append(images.data_ptr())
        if k % 5 == 0:
            held.append((images, labels, idx))
        elif k % 5 == 1:
            held.append((images[:, 0], labels[:1], idx))  # only a derived view survives
        elif k % 5 == 2:
            held.append((images.numpy(), labels.numpy(), idx))  # only a NumPy view survives
        del images, labels
    for images, labels, idx in held:
        expected_images, expected_labels = store.gather(idx.numpy())
        np.testing.assert_array_equal(
            np.asarray(images), expected_images[:, 0] if images.ndim == 3 else expected_images
        )
        np.testing.assert_array_equal(np.asarray(labels), expected_labels[: len(labels)])
    assert len(set(addresses)) < len(addresses)  # buffers of dropped batches were reused


def test_a_torch_that_cannot_count_storage_users_never_reuses_a_buffer(store_path, monkeypatch):
    """Where torch has no storage use count, nothing tells a held batch from a dropped one, so
    no buffer is ever refilled: every batch, held or not, keeps the records it was yielded with."""
    monkeypatch.setattr(buffers, "_STORAGE_USE_COUNT", None)
    monkeypatch.setattr(buffers, "_dying_view_count", functools.cache(buffers._dying_view_count.__wrapped__))
    store = Store(store_path)
    ds = FastLoadDataset(store, 4, prefetch=2, return_indices=True)
    held = [batch for _ in range(2) for batch in ds]
    assert len({images.data_ptr() for images, _, _ in held}) == len(held)
    for images, labels, idx in held:
        expected_images, expected_labels = store.gather(idx.numpy())
        np.testing.assert_array_equal(images.numpy(), expected_images)
        np.testing.assert_array_equal(labels.numpy(), expected_labels)


def test_buffers_are_reused_across_epochs_and_early_breaks(store_path, monkeypatch):
    allocations = []
    allocate = BufferPool._allocate
    monkeypatch.setattr(BufferPool, "_allocate", lambda pool: allocations.append(1) or allocate(pool))
    ds = FastLoadDataset(store_path, 4, prefetch=2)
    for _ in range(3):
        for _ in ds:
            pass
    for _ in range(5):
        for _ in ds:
            break  # the batches made ahead go back to the pool too
    for _ in ds:
        pass
    # at most: `prefetch` held by the prefetcher, the batch the loop holds, and one more
    # still held from the epoch before (the loop variable outlives the loop)
    assert len(allocations) <= 2 + 1 + 1
    assert len(allocations) < len(ds)


@pytest.mark.parametrize("cuda_in_use", [False, True])
def test_a_moved_batch_does_not_hold_back_the_buffers_freed_with_it(monkeypatch, cuda_in_use):
    """Two batches let go of at once, the first moved to shared memory on the way: the moved
    one is retired and the other is reused, not left behind and replaced by a new allocation;
    unpinned, it never waits for a GPU copy, even in a process that uses CUDA."""
    if cuda_in_use:
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "Event", None)  # an unpinned buffer records no event
    pool = BufferPool(2, (2, 2, 1), np.dtype(np.int64), pin=False, worker=False)
    moved, kept = pool.take(), pool.take()
    batches = [moved.images[:2], kept.images[:2]]
    pool.lend(moved)
    pool.lend(kept)
    views = [batch[:1] for batch in batches]  # alive when the batches go: no buffer freed yet
    views[0].share_memory_()
    del batches, views
    pool.reclaim()
    assert pool.take() is kept


HELD_AT_EXIT = """
import atexit
import sys


def after_the_finalizers():
    rest = [labels.tolist() for _, labels in batches]
    print(len(rest), held.reshape(len(held), -1)[:, 0].tolist() == expected)


# registered before torch's import, which registers weakref.finalize's own exit hook: atexit
# runs the hooks last registered first, so this one runs after the finalizers called at exit
atexit.register(after_the_finalizers)

from fastload import FastLoadDataset

batches = iter(FastLoadDataset(sys.argv[1], 3, shuffle=False, prefetch=2, pin_memory=False))
held, labels = next(batches)
expected = labels.tolist()
del labels
"""


def test_a_batch_held_at_exit_is_not_taken_back_by_the_exit_hooks(marked_store, tmp_path):
    """A batch is given back when it dies, not when the interpreter exits while it is still
    held: code that runs at exit after weakref's finalizers (here an atexit hook registered
    before torch's import, which iterates the rest of the epoch) still reads its records."""
    script = tmp_path / "held_at_exit.py"
    script.write_text(HELD_AT_EXIT)
    done = subprocess.run(
        [sys.executable, str(script), str(marked_store)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(RECORDS // 3 - 1), "True"], done.stdout


def test_worker_batches_stay_valid_when_held(store_path):
    store = Store(store_path)
    ds = FastLoadDataset(store, 4, return_indices=True)
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    for images, labels, idx in batches:
        expected_images, expected_labels = store.gather(idx.numpy())
        np.testing.assert_array_equal(images.numpy(), expected_images)
        np.testing.assert_array_equal(labels.numpy(), expected_labels)


class SimulatedStream:
    """One CUDA stream, simulated on the CPU: `copy` queues a host-to-device copy of a batch,
    an Event recorded on the stream completes once everything queued before it ran, and the
    "GPU" runs queued copies only when told (`run`) or when an event is synchronized. Running
    a copy reads the host memory then, as the DMA engine would, and checks that it still holds
    what it held when the copy was queued."""

    def __init__(self):
        self.queue, self.copied, self.overwritten = [], 0, []

    def copy(self, images, expected):
        self.queue.append(("copy", (images.data_ptr(), images.nbytes, expected.tobytes())))

    def run(self, until=None):
        """Runs the queued work in order: all of it, or up to and including event `until`."""
        while self.queue:
            kind, item = self.queue.pop(0)
            if kind == "event":
                item.done = True
                if item is until:
                    return
                continue
            address, nbytes, expected = item
            if ctypes.string_at(address, nbytes) != expected:
                self.overwritten.append(self.copied)
            self.copied += 1

    def event_class(self):
        stream = self

        class Event:
            def __init__(self):
                self.done = False

            def record(self):
                stream.queue.append(("event", self))

            def query(self):
                return self.done

            def synchronize(self):
                if not self.done:
                    stream.run(until=self)

        return Event


def simulate_cuda(monkeypatch):
    """A machine with CUDA, simulated: its stream, and the `pin_memory` that each batch
    buffer's images and labels were allocated with, in order."""
    stream = SimulatedStream()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", stream.event_class())
    empty = torch.empty
    pinned = []

    def allocate(*args, **kwargs):
        if "dtype" in kwargs:  # a batch buffer's images or labels
            pinned.append(kwargs.pop("pin_memory", False))
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", allocate)
    return stream, pinned


@pytest.mark.parametrize("pin_memory, pinned", [(None, True), (True, True), (False, False)])
def test_with_cuda_batches_are_pinned_unless_pin_memory_is_false(store_path, monkeypatch, pin_memory, pinned):
    stream, allocations = simulate_cuda(monkeypatch)
    ds = FastLoadDataset(store_path, 4, pin_memory=pin_memory)
    assert ds.pin_memory is pinned
    for _ in ds:
        stream.run()
    assert allocations and set(allocations) == {pinned}


def test_a_workers_batches_are_made_in_shared_memory_and_never_pinned(store_path, monkeypatch):
    """In a DataLoader worker each batch is made in shared memory, which the DataLoader sends to
    the main process as it is (no copy), and is not pinned, even where the main process's
    batches are: pinning would start CUDA in a forked worker. Simulated: worker 0 of 1, in this
    process, on a machine with CUDA."""
    _, pinned = simulate_cuda(monkeypatch)
    simulate_worker(monkeypatch, 0, 1, seed=5)
    ds = FastLoadDataset(store_path, 4)
    assert ds.pin_memory
    shared = [images.is_shared() and labels.is_shared() for images, labels in ds]
    assert len(shared) == len(ds) and all(shared)
    assert pinned and not any(pinned)


@pytest.mark.parametrize("gpu_catches_up_every", [1, 3, None])
def test_pinned_buffers_wait_for_the_gpu_copies_queued_on_them(store_path, monkeypatch, gpu_catches_up_every):
    """With CUDA, batches land in pinned buffers and the user queues asynchronous copies
    (`.to("cuda", non_blocking=True)`) and drops the batch at once: a buffer is refilled
    only after the copies queued on it have run, however far the GPU lags (simulated here:
    no GPU in CI), and buffers are still reused rather than allocated anew."""
    stream, pinned = simulate_cuda(monkeypatch)
    store = Store(store_path)
    ds = FastLoadDataset(store, 4, prefetch=2, return_indices=True)
    assert ds.pin_memory
    for _ in range(2):
        for step, (images, labels, idx) in enumerate(ds):
            stream.copy(images, store.gather(idx.numpy())[0])
            del images, labels
            if gpu_catches_up_every and step % gpu_catches_up_every == 0:
                stream.run()
    stream.run()
    assert stream.copied == 2 * len(ds) and stream.overwritten == []
    assert pinned and all(pinned)  # each batch buffer's images and labels
    buffers = len(pinned) // 2  # each buffer is an images and a labels tensor
    # `prefetch` ahead, the user's batch, and those whose copy is still queued: the pool
    # allocates rather than wait for a copy while fewer than COPIES_IN_FLIGHT are queued
    assert buffers <= 2 + 1 + COPIES_IN_FLIGHT


def test_the_host_runs_at_most_copies_in_flight_batches_ahead_of_the_gpu(monkeypatch):
    """Pinned batches dropped at once while the GPU runs none of the copies queued on them:
    the pool allocates a buffer per batch while fewer than COPIES_IN_FLIGHT copies are pending,
    then waits for the oldest copy and refills that buffer, so pinned memory stays bounded."""
    stream = SimulatedStream()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", stream.event_class())
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *args, pin_memory=False, **kwargs: empty(*args, **kwargs))
    pool = BufferPool(2, (2, 2, 1), np.dtype(np.int64), pin=True, worker=False)
    taken, copies = [], {}
    for _ in range(3 * COPIES_IN_FLIGHT):
        buf = pool.take()
        assert id(buf) not in copies or copies[id(buf)].done  # refilled once its copy ran
        taken.append(buf)
        pool.lend(buf)  # the batch is dropped at once; its copy stays queued
        pool.reclaim()
        copies[id(buf)] = buf.copied
    assert len({id(buf) for buf in taken}) == COPIES_IN_FLIGHT
    assert taken[COPIES_IN_FLIGHT] is taken[0]  # the oldest copy is waited for first


def test_a_batch_size_beyond_the_store_allocates_only_what_it_yields(store_path):
    ds = FastLoadDataset(store_path, 2**40, return_indices=True)
    assert len(ds) == 1
    ((images, labels, idx),) = list(ds)
    assert images.shape[0] == N and sorted(idx.tolist()) == list(range(N))
    assert images.untyped_storage().nbytes() == N * images[0].numel()


@pytest.mark.parametrize("in_worker", [False, True])
@pytest.mark.parametrize("batch_size", [1, 4, 8])
def test_a_batch_buffer_holds_one_batch_exactly(store_path, monkeypatch, batch_size, in_worker):
    """In the main process and in a DataLoader worker (simulated: worker 0 of 1), whose batches
    are made in shared memory: no byte more than the batch, whatever the batch size."""
    if in_worker:
        simulate_worker(monkeypatch, 0, 1, seed=5)
    images, labels = next(iter(FastLoadDataset(store_path, batch_size)))
    assert images.is_shared() is labels.is_shared() is in_worker
    assert images.untyped_storage().nbytes() == batch_size * images[0].numel()
    assert labels.untyped_storage().nbytes() == batch_size * labels.element_size()


@pytest.mark.parametrize(
    "batch_size, shape, size",
    [
        (2**50, (64, 64, 3), "1125899906842624 images (1.38e+10 GB)"),
        # 9235000005 GB: just above where 3 digits round up, so the figure is 9.24e+09, not 9.23e+09
        (9_235_000_005, (1000, 1000, 1000), "9235000005 images (9.24e+09 GB)"),
    ],
)
def test_a_batch_buffer_too_large_to_allocate_is_a_clear_memory_error(batch_size, shape, size):
    """torch refuses the allocation (its size overflows): the error names the batch buffer's
    size, in GB to 3 significant digits, and the way out."""
    pool = BufferPool(batch_size, shape, np.dtype(np.int64), pin=False, worker=False)
    with pytest.raises(
        MemoryError, match=rf"^cannot allocate a batch buffer of {re.escape(size)}: use a smaller batch_size"
    ):
        pool.take()


def test_torchs_private_storage_use_count_still_counts_the_tensors_on_a_buffer():
    """The pool tells a dropped batch from a held one by `torch._C._storage_Use_Count`, a
    private torch API: no public one counts the tensors that share a storage. On a torch
    without it the pool silently stops reusing buffers (every batch allocates); on one where
    it counts otherwise, a batch the user holds could be overwritten. So this fails loudly on
    any torch (of the range pyproject.toml accepts, as CI installs them) where it changed."""
    assert buffers._STORAGE_USE_COUNT is not None, (
        f"torch {torch.__version__} has no torch._C._storage_Use_Count: fastload.dataset.buffers "
        "can no longer tell when a batch buffer is free, and reuses none"
    )
    base = torch.empty(8, dtype=torch.uint8)
    alone = buffers._holders(base)[0]
    assert alone >= 1
    view = base[2:]
    assert buffers._holders(base)[0] == alone + 1
    array = view.numpy()
    del view
    assert buffers._holders(base)[0] == alone + 1  # the NumPy array keeps the view's tensor
    del array
    assert buffers._holders(base)[0] == alone
    # a tensor whose finalizer runs still counts once (1), or no longer (0): measured, not -1
    assert buffers._dying_view_count() in (0, 1)
