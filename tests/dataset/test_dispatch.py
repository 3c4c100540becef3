"""What `fastload.dataset.dispatch` assumes of Hugging Face Accelerate, pinned against the
installed release (`.ci/run` runs it with the newest and with the oldest that pyproject.toml's
test extra accepts, accelerate 1.0.0): the loader classes it recognises by name, the `dataset`
attribute they hold, and that `len()`, `set_epoch` and `iter()` reach the dataset from them
within the caller frames it reads (CALLER_DEPTH). A refactor of Accelerate that breaks one fails here, naming it, before
tests/test_accelerate.py's two-rank runs would show a wrong share."""

import json
import subprocess
import sys

import pytest

from fastload.dataset import dispatch

pytest.importorskip("accelerate")

# Runs in a process of its own: Accelerator() keeps process-wide state.
PROBE = """
import json, sys
import torch
from torch.utils.data import DataLoader, IterableDataset
from accelerate import Accelerator
from accelerate.data_loader import IterableDatasetShard
from accelerate.state import AcceleratorState
from accelerate.utils import DataLoaderConfiguration
from fastload.dataset.dispatch import accelerate_loader

class Recorder(IterableDataset):
    '''Records, per call, how dispatch sees the loader that made it.'''
    def __init__(self):
        self.seen = {}
    def __len__(self):
        self.seen["len"] = accelerate_loader(self, sys._getframe(1))
        return 2
    def set_epoch(self, epoch):
        self.seen["set_epoch"] = accelerate_loader(self, sys._getframe(1))
    def __iter__(self):
        self.seen["iter"] = accelerate_loader(self, sys._getframe(1))
        yield from (torch.zeros(2, 3), torch.ones(2, 3))

report = {}
for name, config in (("default", {}), ("dispatch_batches=False", {"dispatch_batches": False})):
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
    dataset = Recorder()
    loader = accelerator.prepare(DataLoader(dataset, batch_size=None))
    len(loader)
    list(loader)
    report[name] = {"loader": type(loader).__name__, **dataset.seen}
    AcceleratorState._reset_state(True)
try:
    list(IterableDatasetShard(Recorder(), batch_size=2, num_processes=2, process_index=0))
except ValueError as error:
    report["IterableDatasetShard"] = str(error)
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def report():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_default_prepare_is_a_dispatcher_seen_from_every_call(report):
    """One process suffices: Accelerate dispatches an IterableDataset by default at any size."""
    assert report["default"] == {
        "loader": "DataLoaderDispatcher",
        "len": dispatch.DISPATCHED,
        "set_epoch": dispatch.DISPATCHED,
        "iter": dispatch.DISPATCHED,
    }


def test_a_loader_that_does_not_dispatch_is_seen_as_prepared(report):
    assert report["dispatch_batches=False"] == {
        "loader": "DataLoaderShard",
        "len": dispatch.PREPARED,
        "set_epoch": dispatch.PREPARED,
        "iter": dispatch.PREPARED,
    }


def test_a_record_by_record_shard_is_refused_naming_what_works(report):
    assert report["IterableDatasetShard"] == dispatch.SHARDED


def test_without_accelerate_imported_nothing_is_looked_up(monkeypatch):
    """A process that never imported Accelerate pays one dict lookup per call, no frame read."""
    monkeypatch.delitem(sys.modules, "accelerate.data_loader", raising=False)
    assert dispatch.accelerate_loader(object(), sys._getframe()) is None
