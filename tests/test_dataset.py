"""FastLoadDataset as a training loop sees it: orders, splits across ranks and workers,
resume, buffer safety, prefetch thread lifetime, memory sharing; to_device; split_indices."""

import collections
import copy
import ctypes
import gc
import multiprocessing
import os
import pickle
import signal
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import fastload
import fastload.device
from fastload import FastLoadDataset, Store, StoreError, StoreWriter, split_indices, to_device
from fastload.dataset import RankPlan, epoch_order
from fastload.dataset.buffers import COPIES_IN_FLIGHT, BufferPool
from fastload.dataset.prefetch import Pass

N = 53  # does not divide by the batch sizes or world sizes used here


def write_store(path, n, shape=(4, 3, 3), seed=0):
    images = np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)
    with StoreWriter(path, shape, label_dtype="int64") as w:
        w.extend(images, np.arange(n) * 10)
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("ds") / "s.bin", N)


def epoch(ds, num_workers=None, **loader_kwargs):
    """Record numbers of each batch of one epoch (directly, or through a DataLoader)."""
    source = (
        ds
        if num_workers is None
        else DataLoader(ds, batch_size=None, num_workers=num_workers, **loader_kwargs)
    )
    return [batch[2].tolist() for batch in source]


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


SUBSETS = [None, [50, 3, 7, 8, 9, 10, 11, 30, 31, 32, 40, 1, 2]]


@pytest.mark.parametrize("order", ["random", "sequential", "block"])
@pytest.mark.parametrize("indices", SUBSETS)
def test_every_order_covers_the_epoch_deterministically(store_path, order, indices):
    expected = sorted(range(N) if indices is None else indices)

    def make():
        return FastLoadDataset(
            store_path, 4, order=order, indices=indices, seed=3, block_size=3, window=2, return_indices=True
        )

    ds = make()
    first, second = epoch(ds), epoch(ds)
    assert len(first) == len(ds) == -(-len(expected) // 4)
    assert all(len(b) == 4 for b in first[:-1])
    assert sorted(sum(first, [])) == expected == sorted(sum(second, []))
    assert epoch(make()) == first  # same (seed, epoch): same order
    if order == "sequential":
        assert sum(first, []) == expected == sum(second, [])
    else:
        assert first != second  # the epoch advances by itself
        other = make()
        other.set_epoch(1)
        assert epoch(other) == second


def test_block_order_keeps_blocks_together():
    order = epoch_order(np.arange(1000), "block", seed=1, epoch=0, block_size=10, window=4)
    assert sorted(order) == list(range(1000))
    assert not np.array_equal(order, np.arange(1000))
    windows = order.reshape(-1, 40) // 10  # each window of 40 draws from exactly 4 whole blocks
    assert all(len(set(w)) == 4 for w in windows)
    assert sorted(np.unique(windows)) == list(range(100))
    # and mixes their records: not 4 runs of one block each (1 chance in 40!/10!^4 per window)
    assert all(np.count_nonzero(np.diff(w)) > 3 for w in windows)


def test_random_order_ignores_the_block_parameters_and_no_order_fails_on_no_records():
    indices = np.arange(100, 300)
    random = [
        epoch_order(indices, "random", 5, 2, block_size, window) for block_size, window in [(1, 1), (7, 3)]
    ]
    assert np.array_equal(*random)
    for order in ("random", "sequential", "block"):
        assert len(epoch_order(indices[:0], order, 5, 2, 7, 3)) == 0


# At least 20 records: two seeds then give the same shuffled order with negligible probability
# (1 / the number of equally likely orders). Random order draws one of 20! (2e18) orders; block
# order at worst, with blocks of 3 records each its own window, one of 7! * 3!^6 * 2! (5e8):
# the seed shuffles the blocks and the records within each window, whatever the sizes.
SHUFFLED = st.sampled_from(["random", "block"])
DISTINCT_SEEDS = st.lists(st.integers(0, 2**62 - 1), min_size=2, max_size=2, unique=True)


@given(
    order=SHUFFLED,
    count=st.integers(20, 400),
    seeds=DISTINCT_SEEDS,
    at_epoch=st.integers(0, 10**6),
    block_size=st.integers(1, 64),
    window=st.integers(1, 16),
)
def test_every_shuffled_order_differs_between_seeds_at_the_same_epoch(
    order, count, seeds, at_epoch, block_size, window
):
    """Two runs with different seeds must not read the same data order: each shuffled order
    is a function of the seed too, not only of the epoch."""
    indices = np.arange(1000, 1000 + count)
    first, second = (epoch_order(indices, order, seed, at_epoch, block_size, window) for seed in seeds)
    assert sorted(first) == sorted(second) == list(indices)
    assert not np.array_equal(first, second)


@given(seeds=DISTINCT_SEEDS, at_epoch=st.integers(0, 10**6))
def test_sequential_order_is_the_same_whatever_the_seed(seeds, at_epoch):
    indices = np.array([9, 2, 7, 4])
    for seed in seeds:
        assert epoch_order(indices, "sequential", seed, at_epoch, 1, 1).tolist() == [2, 4, 7, 9]


@settings(max_examples=25, deadline=None)
@given(
    order=SHUFFLED,
    indices=st.lists(st.integers(0, N - 1), min_size=20, max_size=N, unique=True),
    seeds=DISTINCT_SEEDS,
    at_epoch=st.integers(0, 1000),
    block_size=st.integers(1, 16),
)
def test_datasets_with_different_seeds_yield_different_orders(
    store_path, order, indices, seeds, at_epoch, block_size
):
    """What a user sees of the seed: `FastLoadDataset(seed=...)` at the same epoch yields the
    same records in a different order (`indices` drawn at least 20 long, see SHUFFLED)."""
    orders = []
    for seed in seeds:
        ds = FastLoadDataset(
            store_path, 8, order=order, seed=seed, indices=indices, block_size=block_size, return_indices=True
        )
        ds.set_epoch(at_epoch)
        orders.append(sum(epoch(ds), []))
    assert sorted(orders[0]) == sorted(orders[1]) == sorted(indices)
    assert orders[0] != orders[1]


def test_shuffle_false_is_sequential(store_path):
    ds = FastLoadDataset(store_path, 10, shuffle=False, return_indices=True)
    assert sum(epoch(ds), []) == list(range(N))
    with pytest.raises(ValueError, match="shuffle=False"):
        FastLoadDataset(store_path, 10, shuffle=False, order="block")


@pytest.mark.parametrize("order", ["random", "block"])
def test_workers_do_not_change_the_order(store_path, order):
    ds = FastLoadDataset(store_path, 4, order=order, block_size=5, return_indices=True)
    reference = []
    for e in range(2):
        ds.set_epoch(e)
        reference.append(epoch(ds))
    for workers in (0, 1, 2):
        for e in range(2):
            ds.set_epoch(e)
            assert epoch(ds, workers) == reference[e], (workers, e)


def test_workers_advance_the_epoch_without_set_epoch(store_path):
    reference = FastLoadDataset(store_path, 4, return_indices=True)
    expected = [epoch(reference) for _ in range(3)]
    fresh = FastLoadDataset(store_path, 4, return_indices=True)
    assert [epoch(fresh, 2) for _ in range(2)] == expected[:2]  # new workers every epoch
    persistent = FastLoadDataset(store_path, 4, return_indices=True)
    loader = DataLoader(persistent, batch_size=None, num_workers=2, persistent_workers=True)
    assert [[b[2].tolist() for b in loader] for _ in range(3)] == expected
    persistent.set_epoch(1)  # reaches the running workers
    assert [b[2].tolist() for b in loader] == expected[1]


def test_workers_agree_on_the_epoch_whatever_their_start_order(store_path):
    ds = FastLoadDataset(store_path, 4)
    Info = collections.namedtuple("Info", "id seed")

    def loader_iteration(base_seed, start_order):
        """Epochs claimed by the fresh worker copies of one DataLoader iteration."""
        copies = {w: copy.copy(ds) for w in start_order}  # copies share the control block
        return {w: copies[w]._claim_epoch(Info(w, base_seed + w))[0] for w in start_order}

    assert loader_iteration(7, [1, 0]) == {0: 0, 1: 0}
    assert loader_iteration(8, [0, 1]) == {0: 1, 1: 1}
    ds.set_epoch(5)
    assert loader_iteration(8, [1, 0]) == {0: 5, 1: 5}  # the same base seed again: re-seeded RNG
    assert loader_iteration(9, [1, 0]) == {0: 6, 1: 6}


@pytest.mark.parametrize("drop_last", [False, True])
def test_drop_last(store_path, drop_last):
    ds = FastLoadDataset(store_path, 10, drop_last=drop_last, return_indices=True)
    batches = epoch(ds)
    sizes = [len(b) for b in batches]
    assert sizes == ([10] * 5 if drop_last else [10] * 5 + [3])
    assert len(ds) == len(batches) and ds.last_batch_size == sizes[-1]
    assert len(set(sum(batches, []))) == sum(sizes)


@pytest.mark.parametrize("world_size", [2, 3, 7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_get_disjoint_equal_shares(store_path, world_size, drop_last):
    shares = [
        sum(
            epoch(
                FastLoadDataset(
                    store_path, 4, rank=r, world_size=world_size, drop_last=drop_last, return_indices=True
                )
            ),
            [],
        )
        for r in range(world_size)
    ]
    counts = {
        len(FastLoadDataset(store_path, 4, rank=r, world_size=world_size, drop_last=drop_last))
        for r in range(world_size)
    }
    assert len(counts) == 1
    seen = sum(shares, [])
    assert len({len(s) for s in shares}) == 1
    if drop_last:
        assert len(seen) == len(set(seen)) == N // (4 * world_size) * 4 * world_size
    else:
        padding = -(-N // world_size) * world_size - N
        assert set(seen) == set(range(N))
        assert len(seen) == N + padding  # wrapped-around records, seen twice


def test_rank_plan_with_fewer_records_than_ranks():
    plan = RankPlan(2, batch_size=4, rank=4, world_size=5, drop_last=False)
    assert len(plan) == 1
    assert plan.batch(plan.pad(np.array([7, 8])), 0).tolist() == [7]


@given(
    count=st.integers(0, 60),
    batch_size=st.integers(1, 9),
    world_size=st.integers(1, 5),
    drop_last=st.booleans(),
    workers=st.integers(1, 3),
    start=st.integers(0, 4),
)
def test_rank_plans_cut_the_epoch_into_consecutive_runs(
    count, batch_size, world_size, drop_last, workers, start
):
    """All ranks' k-th batches, rank after rank, continue the epoch order where the (k-1)-th
    left off; every rank gets the same number of batches; a worker's share from a resume
    position is its batches one after the other, with their bounds."""
    order = np.arange(100, 100 + count)
    plans = [RankPlan(count, batch_size, r, world_size, drop_last) for r in range(world_size)]
    padded = plans[0].pad(order)
    assert {len(p) for p in plans} == {len(plans[0])}
    read = np.concatenate([p.batch(padded, k) for k in range(len(plans[0])) for p in plans] or [order[:0]])
    np.testing.assert_array_equal(read, padded[: len(read)])
    assert len(read) == (
        world_size * batch_size * (count // (world_size * batch_size)) if drop_last else len(padded)
    )
    for plan in plans:
        assert plan.last == (len(plan.batch(padded, len(plan) - 1)) if len(plan) else 0)
        ks = range(start, len(plan), workers)
        records, bounds = plan.batches(padded, ks)
        assert records.dtype == np.int64 and len(bounds) == len(ks) + 1 and bounds[-1] == len(records)
        for j, k in enumerate(ks):
            np.testing.assert_array_equal(records[bounds[j] : bounds[j + 1]], plan.batch(padded, k))


@given(count=st.integers(1, 80), batch_size=st.integers(2, 9), world_size=st.integers(1, 5))
def test_dropping_a_lone_last_record_keeps_every_other_batch(count, batch_size, world_size):
    """What training relies on to keep batches of one record from BatchNorm: where each rank's
    last batch holds one record, drop_last drops just those (one per rank at most) and every
    rank's other batches stay the same records."""
    kept = [RankPlan(count, batch_size, r, world_size, drop_last=False) for r in range(world_size)]
    assume(kept[0].last == 1)
    dropped = [RankPlan(count, batch_size, r, world_size, drop_last=True) for r in range(world_size)]
    order = np.arange(100, 100 + count)
    for plan, without in zip(kept, dropped):
        assert len(without) == len(plan) - 1
        for k in range(len(without)):
            np.testing.assert_array_equal(without.batch(order, k), plan.batch(plan.pad(order), k))
    assert count - world_size <= len(dropped[0]) * batch_size * world_size < count


def test_batches_equal_store_gather(store_path):
    store = Store(store_path)
    ds = FastLoadDataset(store, 8, return_indices=True)
    for images, labels, idx in ds:
        expected_images, expected_labels = store.gather(idx.numpy())
        assert images.dtype == torch.uint8 and images.shape == (len(idx), 4, 3, 3)
        assert labels.dtype == torch.int64
        np.testing.assert_array_equal(images.numpy(), expected_images)
        np.testing.assert_array_equal(labels.numpy(), expected_labels)


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


def test_worker_batches_stay_valid_when_held(store_path):
    store = Store(store_path)
    ds = FastLoadDataset(store, 4, return_indices=True)
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    for images, labels, idx in batches:
        expected_images, expected_labels = store.gather(idx.numpy())
        np.testing.assert_array_equal(images.numpy(), expected_images)
        np.testing.assert_array_equal(labels.numpy(), expected_labels)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_yields_exactly_the_remaining_batches(store_path, workers):
    ds = FastLoadDataset(store_path, 4, seed=5, return_indices=True)
    ds.set_epoch(2)
    full = epoch(ds)
    ds.set_epoch(2)
    it = iter(ds)
    seen = [next(it)[2].tolist() for _ in range(6)]
    state = ds.state_dict()
    assert state == {"seed": 5, "epoch": 2, "position": 6}
    del it
    restarted = FastLoadDataset(store_path, 4, seed=0, return_indices=True)
    restarted.load_state_dict(state)
    rest = epoch(restarted, workers if workers else None)
    assert seen + rest == full
    if not workers:
        assert restarted.state_dict() == {"seed": 5, "epoch": 3, "position": 0}


def test_a_state_saved_at_an_epoch_end_resumes_with_the_next_epoch(store_path):
    """Saved after the loop over an epoch: the restarted job's next loop is the next epoch.
    Saved in the loop, after the last batch: the restarted loop finishes that epoch (no
    batch left), and the loop after it is the next epoch. Neither repeats nor skips one."""
    uninterrupted = FastLoadDataset(store_path, 4, seed=7, return_indices=True)
    epochs = [epoch(uninterrupted) for _ in range(3)]
    ds = FastLoadDataset(store_path, 4, seed=7, return_indices=True)
    assert epoch(ds) == epochs[0]
    after_the_loop = ds.state_dict()
    assert after_the_loop == {"seed": 7, "epoch": 1, "position": 0}
    for k, _ in enumerate(ds):
        if k == len(ds) - 1:
            in_the_loop = ds.state_dict()
    assert in_the_loop == {"seed": 7, "epoch": 1, "position": len(ds)}
    for state, expected in ((after_the_loop, epochs[1:3]), (in_the_loop, [[], epochs[2]])):
        restarted = FastLoadDataset(store_path, 4, seed=0, return_indices=True)
        restarted.load_state_dict(state)
        assert [epoch(restarted), epoch(restarted)] == expected


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 on newer torch
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker")  # more than the cores here
@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (3, True)])
@pytest.mark.parametrize("stop", ["start", 5, "after the last batch", "after the epoch"])
def test_stateful_dataloader_resumes_exactly(store_path, workers, persistent, stop):
    """torchdata's StatefulDataLoader saves and restores the dataset by itself (each worker's
    own progress, with workers): a job stopped anywhere and restarted sees exactly the batches
    of the uninterrupted job, epoch after epoch."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader():
        ds = FastLoadDataset(store_path, 4, seed=7, return_indices=True)
        return stateful.StatefulDataLoader(
            ds, batch_size=None, num_workers=workers, persistent_workers=persistent
        )

    reference = FastLoadDataset(store_path, 4, seed=7, return_indices=True)
    uninterrupted = [epoch(reference) for _ in range(4)]
    interrupted = loader()
    batches = iter(interrupted)
    if stop == "after the epoch":
        seen = epoch(batches)
    else:
        count = {"start": 0, "after the last batch": len(reference)}.get(stop, stop)
        seen = [next(batches)[2].tolist() for _ in range(count)]
    state = interrupted.state_dict()
    del batches, interrupted
    restarted = loader()
    restarted.load_state_dict(state)
    # The first iteration finishes the interrupted epoch (or, if it had ended, is the next).
    after = [epoch(restarted) for _ in range(3)]
    epochs = 3 + (stop == "after the epoch")
    assert seen + sum(after, []) == sum(uninterrupted[:epochs], [])


def test_state_dict_rejects_bad_states(store_path):
    ds = FastLoadDataset(store_path, 4)
    with pytest.raises(ValueError, match="missing.*position"):
        ds.load_state_dict({"seed": 0, "epoch": 1})
    with pytest.raises(ValueError, match="beyond"):
        ds.load_state_dict({"seed": 0, "epoch": 1, "position": len(ds) + 1})


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


@pytest.mark.parametrize("gpu_catches_up_every", [1, 3, None])
def test_pinned_buffers_wait_for_the_gpu_copies_queued_on_them(store_path, monkeypatch, gpu_catches_up_every):
    """With CUDA, batches land in pinned buffers and the user queues asynchronous copies
    (`.to("cuda", non_blocking=True)`) and drops the batch at once: a buffer is refilled
    only after the copies queued on it have run, however far the GPU lags (simulated here:
    no GPU in CI), and buffers are still reused rather than allocated anew."""
    stream = SimulatedStream()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", stream.event_class())
    empty = torch.empty
    pinned = []

    def allocate(*args, **kwargs):
        if "pin_memory" in kwargs:
            pinned.append(kwargs.pop("pin_memory"))
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", allocate)
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
    assert pinned and all(pinned)
    buffers = len(pinned) // 2  # each buffer is an images and a labels tensor
    # `prefetch` ahead, the user's batch, and those whose copy is still queued: the pool
    # allocates rather than wait for a copy while fewer than COPIES_IN_FLIGHT are queued
    assert buffers <= 2 + 1 + COPIES_IN_FLIGHT


def test_ctrl_c_interrupts_a_wait_for_a_batch(store_path):
    """A batch that never comes (no buffer lent) is waited for with the GIL released, and
    Ctrl-C still ends the wait."""
    store = Store(store_path)
    prefetcher = store.prefetcher(np.arange(4), [4])
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        prefetcher.next()
    assert time.monotonic() - started < 5
    prefetcher.close()
    assert prefetch_threads_settled(0) == []


def test_truncated_store_is_detected_at_the_next_epoch(tmp_path):
    path = write_store(tmp_path / "t.bin", 20)
    ds = FastLoadDataset(path, 4)
    assert len(list(ds)) == 5
    os.truncate(path, os.path.getsize(path) - 4096)
    with pytest.raises(StoreError):
        next(iter(ds))


def test_pickles_by_path(store_path):
    ds = FastLoadDataset(Store(store_path), 4, seed=2, return_indices=True)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._store is None
    assert epoch(copy) == epoch(ds)


@pytest.mark.slow
def test_spawned_workers_open_the_store_by_path_and_advance_epochs(store_path):
    ds = FastLoadDataset(Store(store_path), 4, return_indices=True)
    reference = FastLoadDataset(store_path, 4, return_indices=True)
    expected = [epoch(reference) for _ in range(2)]
    assert [epoch(ds, 2, multiprocessing_context="spawn") for _ in range(2)] == expected


def test_a_closed_store_is_reopened_by_path(store_path):
    store = Store(store_path)
    ds = FastLoadDataset(store, 4, shuffle=False, return_indices=True)
    store.close()
    assert sum(epoch(ds), []) == list(range(N))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"batch_size": 0}, ValueError, "batch_size must be an integer >= 1, not 0"),
        ({"batch_size": 2.5}, ValueError, "batch_size"),
        ({"order": "shuffled"}, ValueError, "order must be one of random, sequential, block, not 'shuffled'"),
        ({"indices": [0, N]}, IndexError, f"indices out of range .*{N} records.*\\[{N}\\]"),
        ({"indices": [-1]}, IndexError, "out of range"),
        ({"indices": [0.5]}, TypeError, "integers"),
        ({"rank": 2, "world_size": 2}, ValueError, "rank must be < world_size"),
        ({"rank": -1, "world_size": 2}, ValueError, "rank"),
        ({"prefetch": 0}, ValueError, "prefetch"),
        ({"window": 0}, ValueError, "window"),
        ({"seed": -3}, ValueError, "seed"),
    ],
)
def test_bad_arguments(store_path, kwargs, error, match):
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(error, match=match):
        FastLoadDataset(store_path, **args)


def test_bad_store_paths(tmp_path):
    with pytest.raises(StoreError):
        FastLoadDataset(tmp_path / "missing.bin", 4)
    with pytest.raises(TypeError, match="store"):
        FastLoadDataset(42, 4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_pin_memory_needs_cuda(store_path):
    with pytest.raises(ValueError, match="CUDA"):
        FastLoadDataset(store_path, 4, pin_memory=True)


def test_split_indices():
    train, val = split_indices(103, 0.2, seed=1)
    assert len(val) == 21 and len(train) == 82
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(103))
    assert np.array_equal(split_indices(103, 0.2, seed=1)[1], val)
    assert not np.array_equal(split_indices(103, 0.2, seed=2)[1], val)
    assert train.dtype == np.int64 and list(train) == sorted(train)
    with pytest.raises(ValueError, match="val_fraction"):
        split_indices(10, 1.5)


def test_split_indices_edges_and_arguments(store_path):
    """The edges a mutation pass found unchecked: both ends of val_fraction, zero records, a
    `Store` object, the default seed, and errors that name the argument."""
    assert [len(part) for part in split_indices(10, 0.0)] == [10, 0]
    assert [len(part) for part in split_indices(10, 1.0)] == [0, 10]
    assert [len(part) for part in split_indices(0, 0.5)] == [0, 0]
    with Store(store_path) as store:
        assert [len(part) for part in split_indices(store, 0.25)] == [N - 13, 13]
    assert all(np.array_equal(a, b) for a, b in zip(split_indices(50, 0.3), split_indices(50, 0.3, seed=0)))
    with pytest.raises(ValueError, match="^n must be an integer >= 0"):
        split_indices(-1, 0.1)
    with pytest.raises(ValueError, match="^seed must be an integer >= 0"):
        split_indices(10, 0.1, seed=-1)
    with pytest.raises(ValueError, match=r"^seed must be below 2\*\*62"):
        split_indices(10, 0.1, seed=2**62)
    with pytest.raises(TypeError, match="^n_or_store must be a str or os.PathLike, not float"):
        split_indices(10.0, 0.1)


def test_split_indices_from_a_store_feeds_datasets(store_path):
    train, val = split_indices(store_path, 0.25)
    assert len(train) + len(val) == N
    ds = FastLoadDataset(Store(store_path), 5, indices=val, return_indices=True)
    assert sorted(sum(epoch(ds), [])) == val.tolist()


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


def _rss_anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


def _mapping_memory(path):
    """Rss, Shared_Clean, Private_Clean, Private_Dirty... summed over this process's mappings of `path`."""
    totals, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split()[0]
            if not first.endswith(":"):  # a mapping's header line: "start-end perms offset dev inode path"
                inside = line.rstrip("\n").endswith(str(path))
            elif inside and line.split()[-1] == "kB":
                totals[first[:-1]] = totals.get(first[:-1], 0) + int(line.split()[1]) * 1024
    return totals


def _read_epoch_and_report(path, barrier, results):
    ds = FastLoadDataset(path, 32, pin_memory=False)  # alive until measured: it maps the store
    anon_before = _rss_anon()
    for _ in ds:
        pass
    barrier.wait()  # every process has mapped the whole store before anyone measures
    results.put({"anon_growth": _rss_anon() - anon_before, **_mapping_memory(path)})
    barrier.wait()


def test_processes_share_the_store_pages(tmp_path):
    path = write_store(tmp_path / "big.bin", 1400, shape=(128, 128, 3))  # 69 MB
    size = os.path.getsize(path)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_read_epoch_and_report, args=(path, barrier, results)) for _ in range(3)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for r in reports:
        assert r["Shared_Clean"] > 0.9 * size  # the store's pages, mapped by all three
        assert r["Private_Clean"] + r["Private_Dirty"] == 0  # ... and held by none privately
        assert r["Pss"] < 0.4 * size  # each accounts for a third
        assert r["anon_growth"] < 0.2 * size  # private memory: a few batch buffers


def test_anonymous_memory_does_not_grow_with_the_store(tmp_path):
    path = write_store(tmp_path / "big.bin", 1400, shape=(128, 128, 3))
    ds = FastLoadDataset(path, 32, pin_memory=False)
    before = _rss_anon()
    for _ in ds:
        pass
    assert _rss_anon() - before < 0.2 * os.path.getsize(path)


def test_a_batch_size_beyond_the_store_allocates_only_what_it_yields(store_path):
    ds = FastLoadDataset(store_path, 2**40, return_indices=True)
    assert len(ds) == 1
    ((images, labels, idx),) = list(ds)
    assert images.shape[0] == N and sorted(idx.tolist()) == list(range(N))
    assert images.untyped_storage().nbytes() == N * images[0].numel()


def test_a_batch_buffer_too_large_to_allocate_is_a_clear_memory_error():
    pool = BufferPool(2**50, (64, 64, 3), np.dtype(np.int64), pin=False, worker=False)
    with pytest.raises(
        MemoryError, match=r"batch buffer of 1125899906842624 images \(1.38e\+10 GB\).*smaller batch_size"
    ):
        pool.take()


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


def test_a_dataloader_that_batches_the_batches_again_is_warned_about(tmp_path):
    path = tmp_path / "s.fl"
    with fastload.StoreWriter(path, (2, 2, 3)) as w:
        w.extend(np.zeros((6, 2, 2, 3), np.uint8), np.arange(6.0))
    ds = FastLoadDataset(path, batch_size=4, shuffle=False)
    with pytest.warns(UserWarning, match="batch_size=None"):
        images, _ = next(iter(torch.utils.data.DataLoader(ds)))
    assert images.dim() == 5  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        images, _ = next(iter(torch.utils.data.DataLoader(ds, batch_size=None)))
        assert images.shape == (4, 2, 2, 3)
        for images, _ in ds:
            assert images.dim() == 4
