"""Hugging Face Accelerate's loaders, recognised by the dataset they drive.

`accelerator.prepare(DataLoader(FastLoadDataset(...), batch_size=None))` puts the loader inside
one of Accelerate's. By default (an IterableDataset, `dispatch_batches` unset) that is a
`DataLoaderDispatcher`: only rank 0 iterates the dataset, takes one batch per rank each step,
concatenates them and hands each rank its slice. A FastLoadDataset that yielded only rank 0's
share there would train on 1/world_size of the data, silently; so, dispatched, it yields every
rank's batches in step order (`RankPlan.all_ranks`) and each rank gets exactly the batch it gets
without Accelerate. With `dispatch_batches=False` Accelerate wraps the dataset in
`IterableDatasetShard`, which re-splits it record by record and fails on `batch_size=None`
inside Accelerate: that is refused at the first batch, naming the configurations that work.
(`split_batches=True` Accelerate refuses itself in `prepare`, as it needs a batch_size.)

Accelerate gives the dataset no other sign than the calls in progress: the dataset looks up
the callers of `__len__`, `__iter__`, `set_epoch` and `state_dict` for the Accelerate object
driving it, and only when Accelerate is already imported (elsewhere a call costs one dict
lookup; never a cost per batch). The frames are read rather than replaced because every other
sign is worse: a flag the user passes would break the promise that the default
`accelerator.prepare` sees every record once per epoch; patching Accelerate's classes when it
is imported would change a library's methods process-wide and break on the same refactors;
`gc.get_referrers` is slow and depends on the collector. What this module assumes of
Accelerate (the three class names, their `dataset` attribute, the calls reaching the dataset
within CALLER_DEPTH frames) is pinned by tests/dataset/test_dispatch.py, and the end result by
tests/test_accelerate.py, which `.ci/run` runs against the newest Accelerate and the oldest
that pyproject.toml's test extra accepts (1.0.0)."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any, Optional

# How Accelerate drives a dataset: dispatched from rank 0, or iterated as it is (one process).
DISPATCHED, PREPARED = "dispatched", "prepared"

# Calls between the dataset's method and Accelerate's loader: DataLoader.__iter__ ->
# _get_iterator -> the iterator's __init__ -> create_fetcher -> the fetcher's __init__ -> iter(dataset),
# with room for torchdata's StatefulDataLoader.
CALLER_DEPTH = 12

# DataLoaderDispatcher fetches the next step's batches before it hands out the current one, so
# while a step is being trained, rank 0's dataset has yielded this many steps more than were
# handed out: `FastLoadDataset.state_dict` leaves them out.
LOOKAHEAD_STEPS = 1


# The key a state of a rank other than 0 under dispatch carries (that rank's dataset is never
# iterated, so its state says nothing), and why such a state is refused. Accelerate's save_state
# writes every rank's loader state to one file (dl_state_dict.bin), the last writer's kept.
NOT_ITERATED = "not_iterated_on_rank"
NOT_ITERATED_STATE = (
    "this dataset state comes from rank {rank}, which Accelerate does not let read the dataset (it "
    "dispatches every batch from rank 0), so it says nothing of where training stopped: Accelerate's "
    "save_state (use_stateful_dataloader=True) writes the loader state of every rank to one file, and "
    "another rank's came last. Save ds.state_dict() from the main process with your checkpoint and "
    "load it with ds.load_state_dict(): see the README, 'With Hugging Face Accelerate'"
)


def steps_handed_out(batches_yielded: int, ranks: int) -> int:
    """Steps the ranks have had, from the batches rank 0's dataset yielded for them. A step
    begun counts as fetched: with `use_stateful_dataloader=True` Accelerate saves the state as
    it was before the last batch of each step it fetches, and that state resumes after the step
    in training (exact with 2 ranks or more; with one, one step early)."""
    return max(0, -(-batches_yielded // ranks) - LOOKAHEAD_STEPS)


SHARDED = (
    "Accelerate wraps this FastLoadDataset in IterableDatasetShard "
    "(DataLoaderConfiguration(dispatch_batches=False)), which splits a dataset record by record and "
    "cannot take the whole batches FastLoadDataset yields (DataLoader batch_size=None). FastLoadDataset "
    "splits the store among the ranks itself: leave dispatch_batches at its default (rank 0 reads "
    "every rank's batch of each step and Accelerate hands each rank its own), or leave the "
    "DataLoader out of accelerator.prepare() (each rank reads its own share; move each batch with "
    ".to(accelerator.device)): see the README, 'Hugging Face Accelerate'"
)


def accelerate_loader(dataset: Any, frame: Optional[FrameType]) -> Optional[str]:
    """How Accelerate drives `dataset` in the calls from `frame` up: DISPATCHED, PREPARED (another
    Accelerate loader iterating it as it is) or None (no Accelerate loader of this dataset).
    Raises ValueError, naming the configurations that work, for those that cannot."""
    module = sys.modules.get("accelerate.data_loader")
    if module is None:
        return None
    for _ in range(CALLER_DEPTH):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        # Accelerate's loaders pass attributes through to the DataLoader they hold, which may
        # not exist yet while they are being made.
        if getattr(owner, "dataset", None) is dataset:
            if isinstance(owner, module.IterableDatasetShard):
                raise ValueError(SHARDED)
            if isinstance(owner, module.DataLoaderDispatcher):
                return DISPATCHED
            if isinstance(owner, module.DataLoaderShard):
                return PREPARED
        frame = frame.f_back
    return None
