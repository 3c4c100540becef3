"""The prefetch stage (`fastload.dataset.prefetch.Pass` over the Rust prefetcher): how far ahead
batches are gathered, buffers handed back at once or kept, batch numbers checked, the prefetch
thread's lifetime (early breaks, Ctrl-C, a fork mid-epoch)."""

import gc
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from dataset_helpers import N
from torch.utils.data import DataLoader

from fastload import FastLoadDataset, Store
from fastload.dataset.prefetch import Pass


def prefetch_threads():
    """Names of this process's live prefetch threads (Rust threads, so read from /proc)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return sorted(n for n in names if n.startswith(("fastload-prefet", "fastload-readah")))


def prefetch_threads_settled(count, timeout=2.0):
    """prefetch_threads() once `count` of them are listed, or after `timeout`. /proc lags the
    threads both ways on a busy machine: a Rust thread takes its name only once it first runs,
    and the kernel wakes a joiner before it removes the exiting thread's entry (both seen in CI
    runs or full suites under load)."""
    deadline = time.monotonic() + timeout
    while len(threads := prefetch_threads()) != count and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads


def test_breaking_out_stops_the_prefetch_thread(store_path):
    ds = FastLoadDataset(store_path, 2, prefetch=3)
    for _ in ds:
        assert len(prefetch_threads_settled(2)) == 2
        break
    assert prefetch_threads_settled(0) == []
    for k, _ in enumerate(DataLoader(ds, batch_size=None)):
        if k == 3:
            break
    gc.collect()
    assert prefetch_threads_settled(0) == []


def test_prefetcher_checks_its_arguments_and_slots(store_path):
    store = Store(store_path)
    image_bytes, label_bytes = np.empty(4 * store.image_nbytes, np.uint8), np.empty(4 * 8, np.uint8)
    with pytest.raises(ValueError, match="do not add up"):
        store.prefetcher(np.arange(5), [4])
    with pytest.raises(IndexError, match="out of range"):
        store.prefetcher(np.array([0, N]), [2])
    prefetcher = store.prefetcher(np.arange(8), [4, 4])
    with pytest.raises(ValueError, match="too small"):
        prefetcher.add_slot(image_bytes[: 3 * store.image_nbytes], label_bytes[:24])
    with pytest.raises(ValueError, match="capacity"):
        prefetcher.add_slot(image_bytes, label_bytes[:31])
    with pytest.raises(ValueError, match="not a batch buffer the caller holds"):
        prefetcher.release(0)
    slot = prefetcher.add_slot(image_bytes, label_bytes)
    assert prefetcher.next()[:3] == (slot, 0, 4)  # waited or not: the thread may finish first
    expected, _ = store.gather(np.arange(4))
    assert np.array_equal(image_bytes.reshape(expected.shape), expected)
    with pytest.raises(ValueError, match="not a batch buffer the caller holds"):
        prefetcher.retire(slot + 1)
    prefetcher.close()
    prefetcher.close()
    with pytest.raises(ValueError, match="closed"):
        prefetcher.next()


def test_prefetcher_takes_a_buffer_back_from_another_thread_while_waiting(store_path):
    store = Store(store_path)
    image_bytes, label_bytes = np.empty(4 * store.image_nbytes, np.uint8), np.empty(4 * 8, np.uint8)
    prefetcher = store.prefetcher(np.arange(8), [4, 4])
    slot = prefetcher.add_slot(image_bytes, label_bytes)
    assert prefetcher.next()[:3] == (slot, 0, 4)
    threading.Timer(0.2, prefetcher.release, (slot,)).start()
    assert prefetcher.next() == (slot, 1, 4, True)  # waited for the buffer, then got batch 2
    expected, _ = store.gather(np.arange(4, 8))
    assert np.array_equal(image_bytes.reshape(expected.shape), expected)
    assert prefetcher.next() is None and prefetcher.remaining == 0
    prefetcher.close()


def prefetch_depths(monkeypatch):
    """Records, for every batch taken, how many buffers the prefetcher then keeps ahead."""
    depths = []
    take = Pass.next

    def recording(self):
        batch = take(self)
        depths.append(self.depth)
        return batch

    monkeypatch.setattr(Pass, "next", recording)
    return depths


def test_a_slow_training_step_finds_its_batches_ready(store_path, monkeypatch):
    """While the step is the slower side, the next `prefetch` batches are gathered during
    it, so no batch after the first is waited for."""
    depths = prefetch_depths(monkeypatch)
    ds = FastLoadDataset(store_path, 4, prefetch=3, return_indices=True)
    seen = []
    for _, _, idx in ds:
        time.sleep(0.02)  # the training step
        seen += idx.tolist()
    assert depths[1:] == [3] * (len(ds) - 1)
    assert sorted(seen) == list(range(N))


def passes(monkeypatch):
    """Records every iteration's `_Pass` (its prefetcher and the buffers it holds)."""
    made = []
    start = Pass.__init__

    def recording(self, *args):
        start(self, *args)
        made.append(self)

    monkeypatch.setattr(Pass, "__init__", recording)
    return made


def test_a_dropped_batch_is_handed_back_at_once_and_a_kept_one_is_not(store_path, monkeypatch):
    made = passes(monkeypatch)
    it = iter(FastLoadDataset(store_path, 4, prefetch=2))
    previous = next(it)
    time.sleep(0.2)  # a training step: the next batches are ready when asked for
    batch = next(it)
    (current,) = made
    held = len(current.held)
    del previous  # as a `for` loop does when it takes the next batch
    assert len(current.held) == held + 1 == current.prefetcher.in_flight
    view = batch[0][1:]  # the user keeps part of the images
    held = len(current.held)
    del batch
    assert len(current.held) == held == current.prefetcher.in_flight
    kept = view.clone()
    for _ in range(5):
        next(it)
    assert torch.equal(view, kept)
    it.close()


class AlwaysWaited:
    """A prefetcher whose every batch reports that the consumer had to wait for it."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def next(self):
        slot, batch, n, _ = self._real.next()
        return slot, batch, n, True


def test_a_loader_bound_loop_rotates_few_buffers(store_path, monkeypatch):
    """While the loop waits for every batch (the loader is the slower side), one buffer
    ahead keeps the gather busy, and only three buffers rotate (warm in the CPU cache)."""
    depths = prefetch_depths(monkeypatch)
    real = Store.prefetcher
    monkeypatch.setattr(Store, "prefetcher", lambda store, *args: AlwaysWaited(real(store, *args)))
    store = Store(store_path)
    ds = FastLoadDataset(store, 2, prefetch=4, shuffle=False)
    for _ in range(2):
        buffers, first = [], []
        for images, _ in ds:
            buffers.append(images.data_ptr())
            first += images[:, 0, 0, 0].tolist()
        assert first == store.images[:, 0, 0, 0].tolist()
        # the first batches use the buffers lent when the pass started, `prefetch` of them
        assert len(set(buffers[4:])) <= 3
    assert set(depths) == {1}


class Renumbered(AlwaysWaited):
    """A prefetcher that reports every batch under the next batch's number."""

    def next(self):
        slot, batch, n, waited = self._real.next()
        return slot, batch + 1, n, waited


def test_a_batch_out_of_turn_is_an_error_not_a_wrongly_indexed_batch(store_path, monkeypatch):
    """The Python side checks the batch number the prefetcher returns instead of trusting
    that both sides count in lock step (return_indices would name the wrong records)."""
    real = Store.prefetcher
    monkeypatch.setattr(Store, "prefetcher", lambda store, *args: Renumbered(real(store, *args)))
    with pytest.raises(RuntimeError, match="returned batch 1 where batch 0 was due"):
        next(iter(FastLoadDataset(store_path, 4, return_indices=True)))


def test_ctrl_c_interrupts_a_wait_for_a_batch(store_path):
    """A batch that never comes (no buffer lent) is waited for with the GIL released, and
    Ctrl-C still ends the wait."""
    store = Store(store_path)
    prefetcher = store.prefetcher(np.arange(4), [4])
    # Python's own Ctrl-C handler, even where the suite was started with SIGINT ignored (a
    # background job of a shell without job control), which would make this wait endless.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            prefetcher.next()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 5
    prefetcher.close()
    assert prefetch_threads_settled(0) == []


def test_a_forked_child_can_drop_a_copy_of_a_running_iteration(store_path):
    """A process forked while an epoch is under way (a DataLoader starting workers for another
    dataset, say) inherits the iteration's objects but not its threads; dropping them there
    must neither hang nor crash."""
    it = iter(FastLoadDataset(store_path, 4, prefetch=2))
    next(it)
    pid = os.fork()
    if pid == 0:  # the child: close the copied iteration and exit at once
        try:
            it.close()
            gc.collect()
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung dropping the copied iteration")
    assert os.WIFEXITED(done[1]) and os.WEXITSTATUS(done[1]) == 0
    assert len(list(it)) == len(FastLoadDataset(store_path, 4)) - 1
