"""FastLoadDataset across ranks: under torchrun, 2 ranks (gloo, CPU) over a store whose size
divides by neither the batch size nor the world size; and every rank's share made in one process
(`rank=`, `world_size=`) for several world sizes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from dataset_helpers import N as RECORDS
from dataset_helpers import epoch

from fastload import FastLoadDataset, StoreWriter

N, WORLD, BATCH = 101, 2, 8


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    store = tmp / "s.bin"
    images = np.random.default_rng(0).integers(0, 256, (N, 4, 3, 3), dtype=np.uint8)
    with StoreWriter(store, (4, 3, 3), label_dtype="int64") as w:
        w.extend(images, np.arange(N))
    worker = Path(__file__).with_name("ddp_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FASTLOAD_NUM_THREADS": "1"}
    result = subprocess.run(
        [*cmd, str(worker), str(store), str(tmp / "rank")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((tmp / f"rank.{r}.json").read_text()) for r in range(WORLD)]


def test_ranks_come_from_the_process_group(reports):
    assert [(r["rank"], r["world_size"]) for r in reports] == [(0, WORLD), (1, WORLD)]


@pytest.mark.parametrize("mode", ["drop_last=False", "workers=2"])
def test_ranks_cover_the_epoch_once_apart_from_padding(reports, mode):
    per_rank = [sum(r[f"batches {mode}"], []) for r in reports]
    assert len(per_rank[0]) == len(per_rank[1]) == -(-N // WORLD)
    seen = sum(per_rank, [])
    assert set(seen) == set(range(N))
    assert len(seen) - len(set(seen)) == -(-N // WORLD) * WORLD - N  # the documented wrap-around padding


def test_workers_split_a_rank_without_changing_it(reports):
    for r in reports:
        assert r["batches workers=2"] == r["batches drop_last=False"]


def test_drop_last_keeps_equal_full_batches(reports):
    batches = [r["batches drop_last=True"] for r in reports]
    assert len(batches[0]) == len(batches[1]) == reports[0]["len drop_last=True"] == N // (BATCH * WORLD)
    assert all(len(b) == BATCH for b in batches[0] + batches[1])
    seen = sum(batches[0] + batches[1], [])
    assert len(seen) == len(set(seen))


def test_equal_batch_counts_and_ddp_training_completes(reports):
    assert len({r["len drop_last=False"] for r in reports}) == 1
    assert len({len(r["batches drop_last=False"]) for r in reports}) == 1
    assert reports[0]["steps"] == reports[1]["steps"] == 2 * reports[0]["len drop_last=False"]
    assert reports[0]["weights"] == reports[1]["weights"]  # gradients were all-reduced every step


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without torch.distributed")
def test_rank_and_world_size_come_from_an_initialized_process_group_unless_given(store_path, monkeypatch):
    """Rank 2 of a group of 3, simulated in this process (the torchrun tests above run a real
    group of 2, in subprocesses)."""
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 2)
    ds = FastLoadDataset(store_path, 4, return_indices=True)
    assert (ds.rank, ds.world_size) == (2, 3)
    assert epoch(ds) == epoch(FastLoadDataset(store_path, 4, rank=2, world_size=3, return_indices=True))
    given = FastLoadDataset(store_path, 4, rank=0, world_size=1)
    assert (given.rank, given.world_size) == (0, 1)


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
        assert len(seen) == len(set(seen)) == RECORDS // (4 * world_size) * 4 * world_size
    else:
        padding = -(-RECORDS // world_size) * world_size - RECORDS
        assert set(seen) == set(range(RECORDS))
        assert len(seen) == RECORDS + padding  # wrapped-around records, seen twice


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without torch.distributed")
def test_a_dataset_made_before_the_process_group_is_refused_in_it(store_path, monkeypatch):
    """A LightningDataModule's __init__ runs before Lightning starts the process group: a dataset
    made there takes itself for the only rank and would give every rank the whole store. Its
    length and first batch refuse, naming where to make it; one given its rank is unaffected.
    Rank 1 of 2, simulated in this process."""
    early = FastLoadDataset(store_path, 4)
    given = FastLoadDataset(store_path, 4, rank=1, world_size=2)
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    refused = r"made before torch.distributed started.* rank 1 of 2: .*in setup\(\).*after Accelerator\(\)"
    for use in (len, lambda ds: next(iter(ds))):
        with pytest.raises(ValueError, match=refused):
            use(early)
    assert len(given) == len(FastLoadDataset(store_path, 4)) == -(-RECORDS // 8)
    assert len(next(iter(given))[0]) == 4
