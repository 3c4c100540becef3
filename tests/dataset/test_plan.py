"""The epoch plan (`fastload.dataset.plan`): the order of each epoch for every seed (random,
block, sequential), how RankPlan cuts it across ranks and workers, and split_indices."""

import numpy as np
import pytest
from dataset_helpers import N, epoch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fastload import FastLoadDataset, Store, split_indices
from fastload.dataset import RankPlan, epoch_order

# At least 20 records: two seeds then give the same shuffled order with negligible probability
# (1 / the number of equally likely orders). Random order draws one of 20! (2e18) orders; block
# order at worst, with blocks of 3 records each its own window, one of 7! * 3!^6 * 2! (5e8):
# the seed shuffles the blocks and the records within each window, whatever the sizes.
SHUFFLED = st.sampled_from(["random", "block"])
DISTINCT_SEEDS = st.lists(st.integers(0, 2**62 - 1), min_size=2, max_size=2, unique=True)


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


@given(
    count=st.integers(0, 60),
    batch_size=st.integers(1, 9),
    world_size=st.integers(1, 5),
    drop_last=st.booleans(),
    workers=st.integers(1, 3),
    start=st.integers(0, 9),
)
def test_every_ranks_batches_in_step_order_are_each_ranks_own(
    count, batch_size, world_size, drop_last, workers, start
):
    """What rank 0 reads when Accelerate dispatches: batch j of that stream is rank j % W's
    batch j // W, from any start and split among workers as a rank's batches are."""
    order = np.arange(100, 100 + count)
    plans = [RankPlan(count, batch_size, r, world_size, drop_last) for r in range(world_size)]
    padded = plans[0].pad(order)
    js = range(start, len(plans[0]) * world_size, workers)
    for plan in plans:
        records, bounds = plan.all_ranks(padded, js)
        assert records.dtype == np.int64 and len(bounds) == len(js) + 1 and bounds[-1] == len(records)
        for i, j in enumerate(js):
            mine = plans[j % world_size].batch(padded, j // world_size)
            np.testing.assert_array_equal(records[bounds[i] : bounds[i + 1]], mine)


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


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    val_fraction=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
)
def test_a_stratified_split_holds_every_class_out_in_proportion(counts, val_fraction, seed):
    """#45: a random 20% of 35 photos in 4 classes left whole classes out of the validation
    figures. Stratified, each class of two or more records has at least one in validation and
    one in training, a class of one trains, and each class's share is its rounded proportion
    otherwise; the split is a function of the seed."""
    labels = np.random.default_rng(seed % 1000).permutation(np.repeat(np.arange(len(counts)), counts))
    train, val = split_indices(len(labels), val_fraction, seed=seed, stratify=labels)
    assert np.array_equal(np.sort(np.concatenate([train, val])), np.arange(len(labels)))
    for c, count in enumerate(counts):
        held = int(np.sum(labels[val] == c))
        wanted = int(np.round(count * val_fraction))
        if count == 1:
            assert held == 0
        elif val_fraction > 0:
            assert held == min(max(wanted, 1), count - 1)
        else:
            assert held == 0
    again = split_indices(len(labels), val_fraction, seed=seed, stratify=labels)
    assert all(np.array_equal(a, b) for a, b in zip((train, val), again))


def test_stratify_must_give_one_class_per_record():
    with pytest.raises(ValueError, match=r"one class per record \(5\), not an array of shape \(4,\)"):
        split_indices(5, 0.2, stratify=np.zeros(4))
