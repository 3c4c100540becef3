"""Run by tests/test_lightning.py: a Lightning `Trainer(accelerator="cpu", devices=2,
strategy="ddp")` fed by a FastLoadDataset from a LightningDataModule. Lightning starts rank 1
by running this script again. A store's labels are its record numbers, so each training step
appends the records it trained on to `OUT.RANK.jsonl` (with its epoch and the loader's length).

Modes, each with a number of DataLoader workers: `fit WORKERS` (2 epochs), `crash WORKERS` (a
checkpoint after step CHECKPOINT_STEP, then a crash at the next step, in epoch 1), `resume
WORKERS CKPT` (fit(ckpt_path=CKPT) to the end of epoch 1), `early WORKERS` (the dataset made in
the DataModule's __init__, before Lightning starts the process group: refused)."""

import json
import sys
import warnings

import lightning as L
import torch
from peer_deadlines import PEER_TIMEOUT, dump_stacks_if_stalled, loader_timeout
from torchdata.stateful_dataloader import StatefulDataLoader

from fastload import FastLoadDataset, to_device

BATCH, EPOCHS, CHECKPOINT_STEP = 4, 2, 11


class Records(L.LightningDataModule):
    def __init__(self, store: str, num_workers: int, early: bool = False):
        super().__init__()
        self.store, self.num_workers = store, num_workers
        if early:
            self.train = FastLoadDataset(self.store, BATCH, seed=3)

    def setup(self, stage: str) -> None:
        if not hasattr(self, "train"):
            self.train = FastLoadDataset(self.store, BATCH, seed=3)  # each rank's process group is up by now

    def train_dataloader(self):
        return StatefulDataLoader(
            self.train,
            batch_size=None,
            num_workers=self.num_workers,
            timeout=loader_timeout(self.num_workers),
        )


class Logged(L.LightningModule):
    """A linear regressor that logs each step's records, and crashes at `crash_at` if given."""

    def __init__(self, out: str, crash_at=None):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.out, self.crash_at = out, crash_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.crash_at:
            raise RuntimeError("simulated crash")
        images, labels = batch
        step = {
            "epoch": self.current_epoch,
            "records": labels.tolist(),
            "len": self.trainer.num_training_batches,
        }
        with open(f"{self.out}.{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(step) + "\n")
        return torch.nn.functional.mse_loss(
            self.linear(to_device(images, self.device).flatten(1))[:, 0], labels / 64
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(folder: str, callbacks=()):
    return L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=L.pytorch.strategies.DDPStrategy(timeout=PEER_TIMEOUT),
        max_epochs=EPOCHS,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        default_root_dir=folder,
    )


def main(store: str, out: str, mode: str, workers: str, checkpoint: str = "") -> None:
    dump_stacks_if_stalled()
    # The length a FastLoadDataset reports is exact with workers too (README, "With PyTorch Lightning").
    warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")
    folder, data = out + ".lightning", Records(store, int(workers), early=mode == "early")
    if mode in ("fit", "early"):
        trainer(folder).fit(Logged(out), data)
    elif mode == "crash":
        every = L.pytorch.callbacks.ModelCheckpoint(
            dirpath=folder, every_n_train_steps=CHECKPOINT_STEP, save_top_k=-1
        )
        trainer(folder, [every]).fit(Logged(out, crash_at=CHECKPOINT_STEP), data)
    else:
        trainer(folder).fit(Logged(out), data, ckpt_path=checkpoint)


if __name__ == "__main__":
    main(*sys.argv[1:])
