"""Which store a `FastLoadDataset` reads, in every process, and the bounds of its epoch counter."""

import numpy as np
import pytest
from torch.utils.data import DataLoader

from fastload import FastLoadDataset, StoreError, StoreWriter
from fastload.dataset.dataset import LAST_EPOCH


def _write(path, value, shape=(8, 8, 3), count=24):
    with StoreWriter(path, shape=shape, label_dtype="int64", overwrite=True) as writer:
        for i in range(count):
            writer.append(np.full(shape, value, np.uint8), i)


def test_workers_refuse_a_store_replaced_after_the_dataset_was_made(tmp_path):
    """A store replaced by rename between epochs (the documented safe way) is another store:
    DataLoader workers, which open the store by path, refuse it with a StoreError naming the
    file instead of reading other records (or records of another shape) than the main process."""
    path = tmp_path / "s.bin"
    _write(path, 1)
    ds = FastLoadDataset(path, 4)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    assert all(images.shape[1:] == (8, 8, 3) for images, _ in loader)
    _write(path, 2, shape=(4, 4, 1), count=8)
    with pytest.raises(StoreError, match=r"s\.bin: the store was replaced.*make the dataset again"):
        list(loader)
    # the main process keeps the mapping it has: the old store, whole, as documented
    assert all(bool((images == 1).all()) and images.shape[1:] == (8, 8, 3) for images, _ in ds)
    # a dataset made now reads the new store, in workers too
    fresh = DataLoader(FastLoadDataset(path, 4), batch_size=None, num_workers=2)
    assert all(bool((images == 2).all()) and images.shape[1:] == (4, 4, 1) for images, _ in fresh)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_epoch_counter_stays_within_what_load_state_dict_accepts(tmp_path, num_workers):
    """After the last epoch the counter can hold, the state it leaves loads again, and a
    further iteration is refused by name instead of overflowing."""
    path = tmp_path / "s.bin"
    _write(path, 1)
    ds = FastLoadDataset(path, 4)
    ds.set_epoch(LAST_EPOCH)
    assert len(list(ds)) == len(ds)
    state = ds.state_dict()
    assert state["epoch"] == LAST_EPOCH + 1
    again = FastLoadDataset(path, 4)
    again.load_state_dict(state)
    assert again.state_dict() == state
    with pytest.raises(ValueError, match=r"epoch 4611686018427387904 is past the last epoch"):
        list(DataLoader(again, batch_size=None, num_workers=num_workers) if num_workers else again)
    with pytest.raises(ValueError, match="epoch must be an integer from 0 to 2"):
        again.set_epoch(LAST_EPOCH + 2)
