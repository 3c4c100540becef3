"""FastLoadDataset in a LightningDataModule, with the real `lightning` package:
`Trainer(accelerator="cpu", devices=2, strategy="ddp")` (Lightning starts the second rank
itself) gives each rank its own share of every epoch, disjoint and complete, in a fresh order
each epoch, with and without DataLoader workers, and the length Lightning is given is exact; a
crash mid-epoch and `fit(ckpt_path=...)` with torchdata's StatefulDataLoader trains on exactly
the records not yet seen."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dataset_helpers import labelled_by_record, rank_share

N, WORLD = 64, 2
WORKER = Path(__file__).with_name("lightning_worker.py")
sys.path.insert(0, str(WORKER.parent))
from lightning_worker import BATCH, CHECKPOINT_STEP, EPOCHS  # noqa: E402

STEPS = N // (WORLD * BATCH)  # per rank and epoch


def lightning(*args, cwd, ok=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FASTLOAD_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(WORKER), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert (result.returncode == 0) == ok, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def steps(out):
    """Each rank's logged training steps."""
    return [
        [json.loads(line) for line in Path(f"{out}.{r}.jsonl").read_text().splitlines()] for r in range(WORLD)
    ]


def by_epoch(logged, epoch):
    return [s["records"] for s in logged if s["epoch"] == epoch]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return labelled_by_record(tmp_path_factory.mktemp("lightning") / "s.bin", N)


@pytest.fixture(scope="module", params=[0, 2], ids=["num_workers=0", "num_workers=2"])
def fitted(request, store):
    out = store.parent / f"fit{request.param}"
    lightning(store, out, "fit", request.param, cwd=store.parent)
    return steps(out)


def test_ddp_ranks_train_on_their_own_share_of_each_epoch(fitted, store):
    for rank, logged in enumerate(fitted):
        for epoch in range(EPOCHS):
            assert by_epoch(logged, epoch) == rank_share(store, BATCH, 3, rank, WORLD, epoch)


def test_ddp_epochs_are_disjoint_complete_and_in_fresh_orders(fitted):
    orders = [sum(by_epoch(fitted[0], e) + by_epoch(fitted[1], e), []) for e in range(EPOCHS)]
    for order in orders:
        assert sorted(order) == list(range(N))
    assert orders[0] != orders[1]


def test_the_length_lightning_is_given_is_exact(fitted):
    """What Lightning's warning about an IterableDataset's __len__ fears does not happen: each
    rank's loader says STEPS batches and yields that many, with workers too."""
    for logged in fitted:
        assert {s["len"] for s in logged} == {STEPS}
        assert [len(by_epoch(logged, e)) for e in range(EPOCHS)] == [STEPS] * EPOCHS


@pytest.mark.parametrize("workers", [0, 2])
def test_a_crash_mid_epoch_resumes_with_exactly_the_records_not_yet_seen(store, workers):
    folder = store.parent
    crash, resume = folder / f"crash{workers}", folder / f"resume{workers}"
    crashed = lightning(store, crash, "crash", workers, cwd=folder, ok=False)
    assert "simulated crash" in crashed.stderr
    before = steps(crash)
    assert [len(logged) for logged in before] == [CHECKPOINT_STEP] * WORLD
    (checkpoint,) = Path(f"{crash}.lightning").glob("*.ckpt")
    lightning(store, resume, "resume", workers, checkpoint, cwd=folder)
    after = steps(resume)
    for rank in range(WORLD):
        assert {s["epoch"] for s in after[rank]} == {1}
        epoch = by_epoch(before[rank], 1) + by_epoch(after[rank], 1)
        assert epoch == rank_share(store, BATCH, 3, rank, WORLD, 1)
        assert len(by_epoch(after[rank], 1)) == STEPS - (CHECKPOINT_STEP - STEPS)


def test_a_dataset_made_in_the_datamodules_init_is_refused_naming_setup(store):
    """Made before Lightning starts the process group, each rank's dataset would read the whole
    store: with workers, where the first batch is made in worker processes, Lightning's len()
    of the loader already refuses."""
    result = lightning(store, store.parent / "early", "early", 2, cwd=store.parent, ok=False)
    assert "ValueError: this FastLoadDataset of" in result.stderr
    assert "made before torch.distributed started" in result.stderr and "in setup()" in result.stderr
    assert not Path(f"{store.parent / 'early'}.0.jsonl").exists()  # not one step trained
