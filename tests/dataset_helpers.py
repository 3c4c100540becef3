"""What the dataset tests share (tests/dataset/, and tests/test_distributed.py,
test_accelerate.py and test_lightning.py): a store of N records, whose `store_path` fixture is in conftest.py, the
record numbers of each batch of an epoch, and a DataLoader worker simulated in this process;
for the tests that train in other processes, a store labelled by record number and the share
each rank gets without them."""

import collections

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastload import FastLoadDataset, StoreWriter

N = 53  # does not divide by the batch sizes or world sizes used here


def write_store(path, n, shape=(4, 3, 3), seed=0):
    images = np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)
    with StoreWriter(path, shape, label_dtype="int64") as w:
        w.extend(images, np.arange(n) * 10)
    return path


def labelled_by_record(path, n):
    """A store of n tiny (2×2×1) records whose labels are their record numbers, so that the
    labels of a batch say which records it holds."""
    with StoreWriter(path, (2, 2, 1), label_dtype="int64") as w:
        w.extend(np.random.default_rng(0).integers(0, 256, (n, 2, 2, 1), dtype=np.uint8), np.arange(n))
    return path


def rank_share(store, batch_size, seed, rank, world_size, at_epoch):
    """The records of each batch rank `rank` gets in epoch `at_epoch` from the dataset alone."""
    ds = FastLoadDataset(store, batch_size, seed=seed, rank=rank, world_size=world_size)
    ds.set_epoch(at_epoch)
    return [labels.tolist() for _, labels in ds]


def epoch(ds, num_workers=None, **loader_kwargs):
    """Record numbers of each batch of one epoch (directly, or through a DataLoader)."""
    source = (
        ds
        if num_workers is None
        else DataLoader(ds, batch_size=None, num_workers=num_workers, **loader_kwargs)
    )
    return [batch[2].tolist() for batch in source]


def simulate_worker(monkeypatch, worker_id, num_workers, seed):
    """Makes the dataset in this process act as DataLoader worker `worker_id` of `num_workers`,
    whose base seed is `seed`: a worker's code path, without a worker process."""
    info = collections.namedtuple("WorkerInfo", "id num_workers seed")(worker_id, num_workers, seed)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)
