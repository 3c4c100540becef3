"""Run by tests/test_accelerate.py under torchrun: one rank of a job that feeds a FastLoadDataset
through Hugging Face Accelerate (CPU, gloo). A store's labels are its record numbers, so the
labels of a batch say which records it holds.

Writes this rank's report as JSON: the records of each epoch per configuration, a resume
mid-epoch, and the error each configuration that cannot work raises at its first batch."""

import json
import shutil
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator, DataLoaderConfiguration, InitProcessGroupKwargs
from peer_deadlines import PEER_TIMEOUT, dump_stacks_if_stalled, loader_timeout
from torch.utils.data import DataLoader

from fastload import FastLoadDataset, to_device

BATCH, RESUME_AFTER = 4, 2
DEADLINE = [InitProcessGroupKwargs(timeout=PEER_TIMEOUT)]  # every Accelerator's process group


def records(batch):
    return batch[1].tolist()


def prepared(accelerator, store, num_workers=0, seed=1):
    """A model, optimizer and loader as `accelerator.prepare` returns them, and the dataset."""
    ds = FastLoadDataset(store, BATCH, seed=seed)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(
        model,
        optimizer,
        DataLoader(ds, batch_size=None, num_workers=num_workers, timeout=loader_timeout(num_workers)),
    )
    return model, optimizer, loader, ds


def step(accelerator, model, optimizer, batch):
    """One training step: gradients are all-reduced, so it hangs if the ranks' steps differ."""
    images, labels = batch
    loss = torch.nn.functional.mse_loss(
        model(to_device(images, "cpu", torch.float64).flatten(1))[:, 0], labels / 100
    )
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


def epochs(accelerator, store, count, num_workers=0):
    """Each epoch's records as this rank got them, with set_epoch left to Accelerate's loader."""
    model, optimizer, loader, _ = prepared(accelerator, store, num_workers)
    seen = []
    for _ in range(count):
        seen.append([])
        for batch in loader:
            seen[-1].append(records(batch))
            step(accelerator, model, optimizer, batch)
    return {"len": len(loader), "epochs": seen}


def not_prepared(accelerator, store):
    """The loader left out of prepare: each rank reads its own share, moved by hand."""
    ds = FastLoadDataset(store, BATCH, seed=1)
    model = accelerator.prepare(torch.nn.Linear(4, 1).double())
    seen = []
    for images, labels in DataLoader(ds, batch_size=None):
        seen.append(labels.tolist())
        x = to_device(images, accelerator.device, torch.float64).flatten(1)
        accelerator.backward(torch.nn.functional.mse_loss(model(x)[:, 0], labels / 100))
    return {"len": len(ds), "epochs": [seen]}


def resume(accelerator, store):
    """Epoch 0 whole, epoch 1 stopped after RESUME_AFTER steps and its state saved on rank 0;
    then a new dataset and loader loaded from that state finish epoch 1 and run epoch 2."""
    model, optimizer, loader, ds = prepared(accelerator, store, seed=5)
    before, state = [], None
    for epoch in range(2):
        loader.set_epoch(epoch)
        for k, batch in enumerate(loader):
            step(accelerator, model, optimizer, batch)
            if epoch == 1:
                before.append(records(batch))
                if k + 1 == RESUME_AFTER:
                    state = ds.state_dict()
                    break
    shared = [state]
    dist.broadcast_object_list(shared, src=0)  # what rank 0 saved, as each rank loads it
    model, optimizer, loader, ds = prepared(accelerator, store, seed=5)
    ds.load_state_dict(shared[0])
    after = []
    for epoch in range(shared[0]["epoch"], 3):
        loader.set_epoch(epoch)
        after.append([])
        for batch in loader:
            after[-1].append(records(batch))
            step(accelerator, model, optimizer, batch)
    return {"saved": shared[0], "before": before, "after": after}


def accelerate_checkpoint(store, folder):
    """As `resume`, through Accelerate's own checkpoint: `use_stateful_dataloader=True` and
    `save_state` / `load_state`, which restores the dataset's state_dict by itself. Every rank
    writes its loader state to the same file (dl_state_dict.bin), and only rank 0 reads the
    dataset: a run resumes exactly when rank 0's state was written last, and refuses rank 1's
    state. A copy of the checkpoint holds rank 1's state, as when rank 1 writes last."""
    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = Accelerator(cpu=True, dataloader_config=config, kwargs_handlers=DEADLINE)
    model, optimizer, loader, _ = prepared(accelerator, store, seed=7)
    before = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        for k, batch in enumerate(loader):
            step(accelerator, model, optimizer, batch)
            if epoch == 1:
                before.append(records(batch))
                if k + 1 == RESUME_AFTER:
                    accelerator.save_state(folder)
                    break
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.copytree(folder, f"{folder}.rank1")
    accelerator.wait_for_everyone()
    if accelerator.process_index == 1:
        torch.save(loader.state_dict(), f"{folder}.rank1/dl_state_dict.bin")
    accelerator.wait_for_everyone()
    report = {"before": before, "saved": repr(loader.state_dict())}
    for name, checkpoint in (("as saved", folder), ("rank 1's state", f"{folder}.rank1")):
        accelerator = Accelerator(
            cpu=True, dataloader_config=config, kwargs_handlers=DEADLINE
        )  # as a restarted job makes it
        model, optimizer, loader, _ = prepared(accelerator, store, seed=7)
        accelerator.load_state(checkpoint)
        loader.set_epoch(1)
        after, error = [], None
        try:
            for batch in loader:
                after.append(records(batch))
                step(accelerator, model, optimizer, batch)
        except ValueError as exc:
            error = str(exc)
        report[name] = {"after": after, "error": error}
    return report


def refused(config, store):
    """The error a configuration that cannot work raises: in prepare(), else at its first batch
    and at len() (None where none is raised)."""
    accelerator = Accelerator(cpu=True, dataloader_config=config, kwargs_handlers=DEADLINE)
    try:
        _, _, loader, _ = prepared(accelerator, store)
    except Exception as exc:  # noqa: BLE001 - the test reads the type and message
        return {"prepare": f"{type(exc).__name__}: {exc}"}
    errors = {"prepare": None}
    for name, call in (("first batch", lambda: next(iter(loader))), ("len", lambda: len(loader))):
        try:
            call()
            errors[name] = None
        except Exception as exc:  # noqa: BLE001 - the test reads the type and message
            errors[name] = f"{type(exc).__name__}: {exc}"
    return errors


def main(store, out_prefix):
    accelerator = Accelerator(cpu=True, kwargs_handlers=DEADLINE)
    report = {"rank": accelerator.process_index, "world_size": accelerator.num_processes}
    report["default"] = epochs(accelerator, store, 3)
    report["workers=2"] = epochs(accelerator, store, 1, num_workers=2)
    report["not prepared"] = not_prepared(accelerator, store)
    report["resume"] = resume(accelerator, store)
    report["save_state"] = accelerate_checkpoint(store, f"{out_prefix}.checkpoint")
    report["dispatch_batches=False"] = refused(DataLoaderConfiguration(dispatch_batches=False), store)
    report["split_batches=True"] = refused(DataLoaderConfiguration(split_batches=True), store)
    with open(f"{out_prefix}.{report['rank']}.json", "w") as f:
        json.dump(report, f)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    dump_stacks_if_stalled()
    main(sys.argv[1], sys.argv[2])
