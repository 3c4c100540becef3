"""FastLoadDataset (`fastload.dataset.dataset`) as a training loop sees it: every order covers
the epoch, workers and epochs, drop_last, the batches themselves, resume (state_dict, torchdata's
StatefulDataLoader), argument checks. The plan, buffers, prefetch, ranks and the store it reads
have their own files beside this one (test_plan.py, test_buffers.py, test_prefetch.py,
test_dataset_store.py) and tests/test_distributed.py."""

import collections
import copy
import pickle
import re
import warnings

import numpy as np
import pytest
import torch
from dataset_helpers import N, epoch, simulate_worker, write_store
from torch.utils.data import DataLoader

import fastload
import fastload.dataset.dataset
import fastload.device
from fastload import FastLoadDataset, Store
from fastload.dataset.plan import epoch_order

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


def test_shuffle_false_is_sequential(store_path):
    ds = FastLoadDataset(store_path, 10, shuffle=False, return_indices=True)
    assert sum(epoch(ds), []) == list(range(N))
    with pytest.raises(ValueError, match="shuffle=False"):
        FastLoadDataset(store_path, 10, shuffle=False, order="block")


def test_the_defaults_are_a_random_order_of_seed_0_two_batches_ahead_in_8_mib_blocks(store_path):
    """What the store and a batch size alone give: the signature's defaults, seen in the batches."""
    ds = FastLoadDataset(store_path, 4, return_indices=True)
    assert (ds.order, ds.seed, ds.prefetch, ds.window, ds.drop_last) == ("random", 0, 2, 8, False)
    assert ds.pin_memory == torch.cuda.is_available()
    assert epoch(ds) == epoch(FastLoadDataset(store_path, 4, order="random", seed=0, return_indices=True))
    # a block holds 8 MiB of records, rounded up: here 36 bytes a record
    blocks = FastLoadDataset(store_path, 4, order="block", return_indices=True)
    assert type(blocks.block_size) is int and blocks.block_size == -(-(8 << 20) // 36) == 233017
    explicit = FastLoadDataset(store_path, 4, order="block", block_size=233017, return_indices=True)
    assert epoch(blocks) == epoch(explicit)


def test_a_block_size_given_makes_the_blocks(store_path):
    ds = FastLoadDataset(store_path, 4, order="block", block_size=3, window=2, seed=1, return_indices=True)
    assert ds.block_size == 3
    assert sum(epoch(ds), []) == epoch_order(np.arange(N), "block", 1, 0, 3, 2).tolist()


def test_a_record_larger_than_a_block_is_a_block_of_its_own(tmp_path):
    path = write_store(tmp_path / "big.bin", 2, shape=(1024, 2731, 3))  # 8 MiB + 1 KiB a record
    assert FastLoadDataset(path, 1, order="block").block_size == 1


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
    for workers in (1, 2):  # new workers every epoch; worker 0 alone advances the epoch
        fresh = FastLoadDataset(store_path, 4, return_indices=True)
        assert [epoch(fresh, workers) for _ in range(2)] == expected[:2], workers
    persistent = FastLoadDataset(store_path, 4, return_indices=True)
    loader = DataLoader(persistent, batch_size=None, num_workers=2, persistent_workers=True)
    assert [[b[2].tolist() for b in loader] for _ in range(3)] == expected
    persistent.set_epoch(1)  # reaches the running workers
    assert [b[2].tolist() for b in loader] == expected[1]


def test_workers_agree_on_the_epoch_whatever_their_start_order(store_path):
    ds = FastLoadDataset(store_path, 4)
    Info = collections.namedtuple("Info", "id num_workers seed")

    def loader_iteration(base_seed, start_order):
        """Epochs claimed by the fresh worker copies of one DataLoader iteration."""
        copies = {w: copy.copy(ds.cursor) for w in start_order}  # copies share the control block
        claims = {w: copies[w].claim(Info(w, 2, base_seed + w), dispatched=False) for w in start_order}
        return {w: claim.progress.epoch for w, claim in claims.items()}

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


def test_batches_equal_store_gather(store_path):
    store = Store(store_path)
    ds = FastLoadDataset(store, 8, return_indices=True)
    for images, labels, idx in ds:
        expected_images, expected_labels = store.gather(idx.numpy())
        assert images.dtype == torch.uint8 and images.shape == (len(idx), 4, 3, 3)
        assert labels.dtype == torch.int64
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
    with pytest.raises(TypeError, match="state must be a dict from state_dict\\(\\), not list"):
        ds.load_state_dict([0, 1, 2])
    with pytest.raises(ValueError, match="^position must be an integer >= 0, not -1$"):
        ds.load_state_dict({"seed": 0, "epoch": 1, "position": -1})
    with pytest.raises(ValueError, match="^seed must be an integer >= 0, not -1$"):
        ds.load_state_dict({"seed": -1, "epoch": 1, "position": 0})
    for bad in (1.5, "1", None):
        with pytest.raises(ValueError, match=f"^epoch must be an integer from 0 to 2\\*\\*62, not {bad!r}$"):
            ds.load_state_dict({"seed": 0, "epoch": bad, "position": 0})
        with pytest.raises(ValueError, match="^epoch must be an integer"):
            ds.set_epoch(bad)
    assert ds.state_dict() == {"seed": 0, "epoch": 0, "position": 0}  # nothing half-loaded


def test_a_loaded_state_is_reported_back_until_set_epoch_starts_over(store_path):
    """state_dict() right after load_state_dict() is the state loaded (a job that saves again
    before its first batch loses nothing); set_epoch() then starts that epoch from its start."""
    ds = FastLoadDataset(store_path, 4, return_indices=True)
    ds.load_state_dict({"seed": 3, "epoch": 1, "position": 5})
    assert ds.state_dict() == {"seed": 3, "epoch": 1, "position": 5}
    ds.set_epoch(1)
    assert ds.state_dict() == {"seed": 3, "epoch": 1, "position": 0}
    assert len(epoch(ds)) == len(ds)


def test_a_state_of_a_rank_that_accelerate_does_not_let_read_is_refused_whole(store_path):
    """Under Accelerate's dispatch only rank 0 reads the dataset; another rank's state says so
    (tests/test_accelerate.py makes one) and loading it changes nothing."""
    ds = FastLoadDataset(store_path, 4)
    with pytest.raises(ValueError, match="^this dataset state comes from rank 1, which Accelerate"):
        ds.load_state_dict({"seed": 3, "epoch": 1, "position": 2, "not_iterated_on_rank": 1})
    assert ds.state_dict() == {"seed": 0, "epoch": 0, "position": 0}


def test_a_worker_that_finished_its_share_reports_it_and_resumes_with_nothing_left(store_path, monkeypatch):
    """Inside a DataLoader worker the state is that worker's progress through its share (what
    StatefulDataLoader saves per worker), also once the share is done: restored from it, the
    worker has nothing left of that epoch, and its next iteration is its share of the next
    epoch, not the same share again. Worker 1 of 2, simulated in this process."""
    simulate_worker(monkeypatch, 1, 2, seed=11)
    ds = FastLoadDataset(store_path, 4, seed=3, return_indices=True)
    share = epoch(ds)
    assert len(share) == len(ds) // 2
    state = ds.state_dict()
    assert state == {"seed": 3, "epoch": 0, "position": len(ds)}
    restored = FastLoadDataset(store_path, 4, return_indices=True)
    restored.load_state_dict(state)
    next_share = FastLoadDataset(store_path, 4, seed=3, return_indices=True)
    next_share.set_epoch(1)
    assert [epoch(restored), epoch(restored)] == [[], epoch(next_share)]


def test_a_copy_pickled_mid_epoch_starts_with_the_next_epoch_and_no_buffers(store_path):
    """What a spawned DataLoader worker gets of a dataset the main process is iterating: the
    store path and the epoch counter, not the batch buffers or the iteration under way."""
    ds = FastLoadDataset(store_path, 4, seed=2, return_indices=True)
    batches = iter(ds)
    next(batches), next(batches)
    clone = pickle.loads(pickle.dumps(ds))
    assert ds.state_dict() == {"seed": 2, "epoch": 0, "position": 2}
    assert clone.state_dict() == {"seed": 2, "epoch": 1, "position": 0}
    assert clone._pool is None
    reference = FastLoadDataset(store_path, 4, seed=2, return_indices=True)
    reference.set_epoch(1)
    assert epoch(clone) == epoch(reference)


def integer_error(name, minimum, value):
    """int_in_range's message for `name`, whole: the argument's own name, not another's."""
    return f"^{name} must be an integer >= {minimum}, not {re.escape(repr(value))}$"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"store": 123}, TypeError, "^store must be a str or os.PathLike, not int$"),
        ({"batch_size": 0}, ValueError, integer_error("batch_size", 1, 0)),
        ({"batch_size": 2.5}, ValueError, integer_error("batch_size", 1, 2.5)),
        (
            {"order": "shuffled"},
            ValueError,
            "^order must be one of random, sequential, block, not 'shuffled'$",
        ),
        ({"indices": [0, N]}, IndexError, f"^indices out of range for .* \\({N} records\\): \\[{N}\\]$"),
        ({"indices": [-1]}, IndexError, "out of range"),
        # the first five bad ones are named
        (
            {"indices": list(range(N - 1, N + 7))},
            IndexError,
            f"records\\): \\[{', '.join(map(str, range(N, N + 5)))}\\]$",
        ),
        ({"indices": [0.5]}, TypeError, "integers"),
        (
            {"rank": 2, "world_size": 2},
            ValueError,
            "^rank must be < world_size, not rank=2 with world_size=2$",
        ),
        ({"rank": -1, "world_size": 2}, ValueError, integer_error("rank", 0, -1)),
        ({"rank": 0, "world_size": 0}, ValueError, integer_error("world_size", 1, 0)),
        ({"prefetch": 0}, ValueError, integer_error("prefetch", 1, 0)),
        ({"window": 0}, ValueError, integer_error("window", 1, 0)),
        ({"block_size": 0}, ValueError, integer_error("block_size", 1, 0)),
        ({"seed": -3}, ValueError, integer_error("seed", 0, -3)),
    ],
)
def test_bad_arguments(store_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        FastLoadDataset(**{"store": store_path, "batch_size": 4, **kwargs})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_pin_memory_needs_cuda(store_path):
    with pytest.raises(ValueError, match="^pin_memory=True needs CUDA, which is not available$"):
        FastLoadDataset(store_path, 4, pin_memory=True)


def test_a_dataloader_that_batches_the_batches_again_is_warned_about(tmp_path):
    path = tmp_path / "s.fl"
    with fastload.StoreWriter(path, (2, 2, 3)) as w:
        w.extend(np.zeros((6, 2, 2, 3), np.uint8), np.arange(6.0))
    ds = FastLoadDataset(path, batch_size=4, shuffle=False)
    message = (
        "^FastLoadDataset yields whole batches, and this DataLoader batches them again into 5-D "
        "tensors: pass batch_size=None, as in DataLoader\\(ds, batch_size=None\\)$"
    )
    with pytest.warns(UserWarning, match=message) as record:
        images, _ = next(iter(torch.utils.data.DataLoader(ds)))
    assert images.dim() == 5  # what the warning is about
    # attributed to fastload, not to torch: a filter on torch's warnings leaves it alone
    assert [w.filename for w in record] == [fastload.dataset.dataset.__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        images, _ = next(iter(torch.utils.data.DataLoader(ds, batch_size=None)))
        assert images.shape == (4, 2, 2, 3)
        for images, _ in ds:
            assert images.dim() == 4
        # iterated by an object whose `dataset` is ds, but that is no DataLoader's fetcher
        for images, _ in fastload.device.DeviceLoader(ds, "cpu"):
            assert images.dim() == 4
