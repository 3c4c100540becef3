"""FastLoadDataset inside Hugging Face Accelerate (`accelerator.prepare`), with the real package
under torchrun: 2 ranks on the CPU (gloo). By default Accelerate dispatches an IterableDataset's
batches from rank 0; each rank must still get every epoch's share it gets without Accelerate,
resume mid-epoch with exactly the batches not yet seen, and a configuration that cannot work
must fail at its first batch saying which ones do. The README's recipe runs there too."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dataset_helpers import labelled_by_record, rank_share
from test_readme import readme_blocks

N, WORLD, BATCH = 64, 2, 4
STEPS = N // (WORLD * BATCH)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]


def torchrun(script, *args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FASTLOAD_NUM_THREADS": "1"}
    result = subprocess.run(
        [*TORCHRUN, str(script), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return labelled_by_record(tmp_path_factory.mktemp("accelerate") / "s.bin", N)


@pytest.fixture(scope="module")
def reports(store):
    torchrun(Path(__file__).with_name("accelerate_worker.py"), store, store.parent / "rank", cwd=store.parent)
    return [json.loads((store.parent / f"rank.{r}.json").read_text()) for r in range(WORLD)]


def without_accelerate(store, rank, seed, epoch):
    return rank_share(store, BATCH, seed, rank, WORLD, epoch)


def test_the_ranks_are_accelerates(reports):
    assert [(r["rank"], r["world_size"]) for r in reports] == [(0, WORLD), (1, WORLD)]


def test_each_rank_gets_the_batches_it_gets_without_accelerate(reports, store):
    """Dispatched from rank 0, each rank still trains on its own share, batch for batch."""
    for rank, report in enumerate(reports):
        for epoch, batches in enumerate(report["default"]["epochs"]):
            assert batches == without_accelerate(store, rank, 1, epoch)


@pytest.mark.parametrize("config", ["default", "workers=2", "not prepared"])
def test_every_record_once_per_epoch_across_the_ranks(reports, config):
    epochs = [r[config]["epochs"] for r in reports]
    for epoch in range(len(epochs[0])):
        shares = [sum(e[epoch], []) for e in epochs]
        assert sorted(shares[0] + shares[1]) == list(range(N))
    assert all(r[config]["len"] == STEPS == len(r[config]["epochs"][0]) for r in reports)


def test_epochs_come_in_fresh_orders(reports):
    """Accelerate's loader sets the epoch of each iteration; the dataset shuffles by it."""
    orders = [sum(sum((r["default"]["epochs"][e] for r in reports), []), []) for e in range(3)]
    assert len({tuple(o) for o in orders}) == 3


def test_workers_or_a_loader_left_out_of_prepare_read_the_same_batches(reports):
    for report in reports:
        assert report["workers=2"]["epochs"][0] == report["default"]["epochs"][0]
        assert report["not prepared"]["epochs"][0] == report["default"]["epochs"][0]


def test_a_resume_mid_epoch_gets_exactly_the_batches_not_yet_seen(reports, store):
    """Rank 0's state_dict() after 2 steps of epoch 1 (Accelerate has fetched the next step
    already); a new dataset loaded from it finishes epoch 1, then epoch 2 is whole."""
    assert reports[0]["resume"]["saved"] == {"seed": 5, "epoch": 1, "position": 2}
    for rank, report in enumerate(reports):
        resumed = report["resume"]
        assert resumed["before"] + resumed["after"][0] == without_accelerate(store, rank, 5, 1)
        assert resumed["after"][1] == without_accelerate(store, rank, 5, 2)
    epoch = sum((r["resume"]["before"] + r["resume"]["after"][0] for r in reports), [])
    assert sorted(sum(epoch, [])) == list(range(N))


def test_accelerates_own_checkpoint_resumes_exactly_or_refuses_another_ranks_state(reports, store):
    """use_stateful_dataloader=True, save_state after 2 steps of epoch 1, load_state in a new
    Accelerator. Accelerate writes each rank's loader state to one file; rank 1's dataset, never
    iterated, marks its state. With rank 0's state the run resumes with exactly the steps not yet
    trained; with rank 1's (the copy that rank 1 wrote last), both ranks refuse at the first
    batch, naming what works: never a silent restart of the wrong epoch."""
    assert "'not_iterated_on_rank': 1" in reports[1]["save_state"]["saved"]
    assert "not_iterated_on_rank" not in reports[0]["save_state"]["saved"]
    for rank, report in enumerate(reports):
        resumed = report["save_state"]
        assert len(resumed["before"]) == 2
        refused = resumed["rank 1's state"]
        assert refused["after"] == [] and refused["error"].startswith(
            "this dataset state comes from rank 1, which Accelerate does not let read the dataset"
        )
        assert "Save ds.state_dict() from the main process" in refused["error"]
        as_saved = resumed["as saved"]  # rank 0's state, unless rank 1 happened to write last
        if as_saved["error"] is None:
            assert resumed["before"] + as_saved["after"] == without_accelerate(store, rank, 7, 1)
        else:
            assert as_saved == refused
    assert len({r["save_state"]["as saved"]["error"] is None for r in reports}) == 1


def test_dispatch_batches_false_fails_at_the_first_batch_naming_what_works(reports):
    for report in reports:
        errors = report["dispatch_batches=False"]
        assert errors["prepare"] is None
        for call in ("first batch", "len"):
            assert errors[call].startswith(
                "ValueError: Accelerate wraps this FastLoadDataset in IterableDatasetShard"
            )
            assert "leave dispatch_batches at its default" in errors[call]
            assert "leave the DataLoader out of accelerator.prepare()" in errors[call]


def test_split_batches_is_refused_by_accelerate_in_prepare(reports):
    for report in reports:
        assert re.match(r"ValueError: .*split_batches", report["split_batches=True"]["prepare"])


def test_the_readme_recipe_trains_on_two_ranks_and_resumes(tmp_path, store):
    """The README's Accelerate block, as a script under torchrun: run twice, the second run
    continues from the checkpoint the first one saved mid-epoch."""
    (recipe,) = [code for _, code in readme_blocks() if "Accelerator(" in code]
    script = tmp_path / "train_accelerate.py"
    script.write_text(recipe)
    (tmp_path / "store.bin").symlink_to(store)
    first = torchrun(script, cwd=tmp_path)
    assert first.stdout.splitlines() == [f"epoch 0: {STEPS} steps", f"epoch 1: {STEPS} steps"]
    again = torchrun(script, cwd=tmp_path)  # from the checkpoint after step 2 of epoch 1
    assert again.stdout.splitlines() == [f"epoch 1: {STEPS - 2} steps"]
