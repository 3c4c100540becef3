"""Which store a `FastLoadDataset` reads, in every process, and the bounds of its epoch counter."""

import multiprocessing
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dataset_helpers import N, epoch, write_store
from torch.utils.data import DataLoader

from fastload import FastLoadDataset, Store, StoreError, StoreWriter
from fastload.dataset.cursor import LAST_EPOCH


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


def test_bad_store_paths(tmp_path):
    with pytest.raises(StoreError):
        FastLoadDataset(tmp_path / "missing.bin", 4)
    with pytest.raises(TypeError, match="store"):
        FastLoadDataset(42, 4)


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


def test_workers_forked_while_fastload_threads_work_never_hang(tmp_path):
    """#42: a DataLoader worker forked while another thread of the process was inside a gather
    could start with the Rust pool's lock held by a thread it does not have, and wait forever.
    200 workers forked (100 epochs, 2 workers) while a thread gathers without pause and a
    prefetcher runs in the main process: every epoch whole, none past its deadline."""
    path = tmp_path / "s.bin"
    with StoreWriter(path, (16, 16, 3), label_dtype="int64") as writer:
        writer.extend(
            np.random.default_rng(0).integers(0, 256, (256, 16, 16, 3), dtype=np.uint8), np.arange(256)
        )
    epochs = 100
    done = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "fork_worker.py"), str(path), str(epochs)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "FASTLOAD_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    assert done.stdout.splitlines() == [f"{e} 16" for e in range(epochs)]
