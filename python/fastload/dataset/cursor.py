"""Where loading stands: `EpochCursor`, the one owner of the epoch plan (seed, epoch, position
and this rank's share). `FastLoadDataset`, `DeviceLoader` and the resident loader
(`DeviceStore.loader`) all read and move the dataset's one cursor and keep no copy of it, so
`set_epoch`, `state_dict` and `load_state_dict` give the same answer on whichever stage they
are called, and a loader's batches follow the epoch the dataset was told.

The protocol is torchdata.nodes' (`reset(state)`, `next`, `get_state`) in the shape a plan that
is a pure function of (seed, epoch) allows: `reset` (load_state_dict: the whole state checked,
then applied), `get_state` (state_dict), `set_epoch`, and `claim`, which starts an iteration and
decides all of its batches at once (`Walk`: one flat array of record numbers and the bounds of
each batch, the form the Rust prefetcher takes and the resident loader indexes). A stage's
`next` hands out batch k of its walk and counts it in the walk's `Progress`. Why not one
node object per stage with `next` on each, as torchdata.nodes has: the stages are not a chain
of independent states here. Each stage's position is a count in one epoch of one plan, and a
chain would give each stage a state of its own to keep in step, the copies this module exists
to remove.

A `DeviceLoader` counts what it hands out rather than what its source yields: it holds batches
copied ahead, or reads them from DataLoader worker processes whose progress this process
cannot see. It asks for a `Progress` of its own (`hand_out`), which `get_state` reports while
it lasts; the dataset's `claim` in this process binds it to the epoch and position it claims,
so the epoch its augmentation draws for is the one its batches were ordered for."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from fastload._checks import INT_STATE_LIMIT, int_in_range, is_int
from fastload.dataset.dispatch import DISPATCHED, NOT_ITERATED, NOT_ITERATED_STATE, steps_handed_out
from fastload.dataset.plan import RankPlan, epoch_order

# Slots of the control block shared with DataLoader workers (see `_claim_epoch`; _DISPATCHED: 1
# while Accelerate dispatches this dataset's batches from rank 0, see `fastload.dataset.dispatch`).
_NEXT_EPOCH, _RESUME_EPOCH, _RESUME_POSITION, _GENERATION, _GENERATION_EPOCH, _DISPATCHED = range(6)
# The epoch counter's range: epochs 0..LAST_EPOCH are iterated, and a state may say LAST_EPOCH + 1
# (where the counter stands after the last one), so every state it produces loads again.
LAST_EPOCH = INT_STATE_LIMIT - 1
STATE_KEYS = ("seed", "epoch", "position")


class Progress:
    """One iteration under way in this process: its epoch (which the augmentation draws follow)
    and its position, the batches of that epoch handed out so far (a resumed iteration starts
    at the position loaded). In a DataLoader worker the position is where the worker's share
    continues (its next batch is position + worker id); dispatched by Accelerate, it counts
    every rank's batches (world_size a step)."""

    __slots__ = ("epoch", "position", "dispatched", "claimed")

    def __init__(self, epoch: int, position: int, dispatched: bool, claimed: bool):
        self.epoch, self.position, self.dispatched = epoch, position, dispatched
        # False for a loader's count whose source has not claimed the epoch in this process yet.
        self.claimed = claimed


class Walk:
    """The batches of one iteration, decided when it starts: `records` (int64 record numbers,
    one batch after the other), `bounds` (where each batch starts, and the end) and the
    `progress` its stage counts them in, `step` positions a batch."""

    __slots__ = ("records", "bounds", "progress", "step")

    def __init__(self, records: np.ndarray, bounds: np.ndarray, progress: Progress, step: int):
        self.records, self.bounds, self.progress, self.step = records, bounds, progress, step

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def batch(self, k: int) -> np.ndarray:
        """The record numbers of batch k of this walk."""
        return self.records[self.bounds[k] : self.bounds[k + 1]]


class EpochCursor:
    """The epoch plan of one dataset for one rank, and where it stands.

    The next epoch and a loaded resume point live in a small tensor in shared memory, so that
    set_epoch and load_state_dict reach DataLoader workers (persistent ones included) and the
    workers advance the epoch for the main process. The iteration under way in this process
    (`Progress`) is this object's alone: a pickled copy (a worker's) starts with none."""

    def __init__(
        self, indices: np.ndarray, order: str, seed: int, block_size: int, window: int, plan: RankPlan
    ):
        self.indices, self.order, self.seed = indices, order, seed
        self.block_size, self.window, self.plan = block_size, window, plan
        self._control = torch.tensor([0, -1, 0, 0, 0, 0], dtype=torch.int64).share_memory_()
        self._iterations = 0  # iterations started by this copy (worker generations)
        # The latest iteration claimed in this process, and a loader's count of what it handed out.
        self._claimed: Optional[Progress] = None
        self._handed_out: Optional[Progress] = None
        # A state loaded inside a DataLoader worker: that worker's alone, for its next iteration.
        self._worker_resume: Optional[Tuple[int, int]] = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_claimed"] = state["_handed_out"] = None
        return state

    @property
    def dispatched(self) -> bool:
        """Whether Accelerate dispatches this dataset's batches from rank 0 (the latest
        set_epoch of its loader said so): what a worker learns from the main process."""
        return bool(self._control.numpy()[_DISPATCHED])

    def stream_length(self, dispatched: bool) -> int:
        """Batches an epoch's iteration yields in all: every rank's when dispatched."""
        return len(self.plan) * (self.world_size if dispatched else 1)

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    def set_epoch(self, epoch: Any, driver: Optional[str] = None) -> None:
        """Makes the next iteration epoch `epoch`, from its start. `driver`: how the Accelerate
        loader calling drives the dataset (`fastload.dataset.dispatch.accelerate_loader`); it
        calls set_epoch at the start of every iteration: from it, the epoch a loaded state
        continues keeps that state's position until the epoch starts."""
        epoch = epoch_number(epoch)
        ctl = self._control.numpy()
        ctl[_DISPATCHED] = driver == DISPATCHED
        if driver is not None and ctl[_RESUME_EPOCH] == ctl[_NEXT_EPOCH] == epoch:
            return
        ctl[_NEXT_EPOCH] = epoch
        ctl[_RESUME_EPOCH] = -1
        ctl[_GENERATION] = 0  # no worker generation can mistake the next one for itself
        self._claimed = self._handed_out = None

    def get_state(self, in_worker: bool) -> Dict[str, int]:
        """{"seed", "epoch", "position"}: where the next iteration would start to continue this
        rank's batches; inside a worker, that worker's own share."""
        progress = self._handed_out or self._claimed
        if progress is None:
            epoch, position = self._next_start()
        else:
            epoch, position = progress.epoch, progress.position
            if in_worker:
                position = min(position, self.stream_length(progress.dispatched))
            elif progress.dispatched:
                position = steps_handed_out(position, self.world_size)
        return {"seed": self.seed, "epoch": int(epoch), "position": int(position)}

    def reset(self, state: Any, in_worker: bool, driver: Optional[str] = None) -> None:
        """Makes the next iteration continue epoch `state["epoch"]` after `position` batches
        (`driver`: as for set_epoch). Every part of the state is checked before
        anything changes: a refused state leaves the cursor, and so every stage reading it, as
        it was."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), not {type(state).__name__}")
        missing = set(STATE_KEYS) - set(state)
        if missing:
            raise ValueError(f"the dataset state is missing {sorted(missing)}")
        if NOT_ITERATED in state:
            raise ValueError(NOT_ITERATED_STATE.format(rank=state[NOT_ITERATED]))
        position = int_in_range(state["position"], "position", minimum=0)
        batches = self.stream_length(in_worker and self.dispatched)
        if position > batches:
            raise ValueError(f"position {position} is beyond the {batches} batches of an epoch")
        seed = int_in_range(state["seed"], "seed", minimum=0)
        epoch = epoch_number(state["epoch"])
        self.seed = seed
        if in_worker:
            # A worker restoring its own progress (StatefulDataLoader): the other workers
            # share the control block and restore theirs, so it stays out of it.
            self._worker_resume, self._claimed = (epoch, position), None
            return
        self.set_epoch(epoch, driver)
        ctl = self._control.numpy()
        ctl[_RESUME_POSITION] = position
        ctl[_RESUME_EPOCH] = epoch

    def claim(self, worker: Optional[Any], dispatched: bool) -> Walk:
        """Starts an iteration: claims its epoch and resume position, advancing the shared
        epoch, and decides its batches: this rank's (this worker's share of them), or every
        rank's in step order when Accelerate dispatches them from this process."""
        per_step = self.world_size if dispatched else 1
        epoch, start = self._claim_epoch(worker, per_step)
        order = self.plan.pad(
            epoch_order(self.indices, self.order, self.seed, epoch, self.block_size, self.window)
        )
        worker_id, num_workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        cut = self.plan.all_ranks if dispatched else self.plan.batches
        records, bounds = cut(order, range(start + worker_id, self.stream_length(dispatched), num_workers))
        self._claimed = Progress(epoch, start, dispatched, claimed=True)
        # A loader's count waiting for this claim in the main process counts this iteration
        # (the epoch claimed here is the one its batches are drawn for). Any other is stale:
        # a loader's earlier count, or in a DataLoader worker the main process's, forked with it.
        waiting = self._handed_out
        if worker is None and waiting is not None and not waiting.claimed:
            waiting.epoch, waiting.position, waiting.claimed = epoch, start // per_step, True
        else:
            self._handed_out = None
        return Walk(records, bounds, self._claimed, num_workers)

    def hand_out(self) -> Progress:
        """A loader's count of the batches it hands out of the next iteration, which its source
        claims (in this process, or in DataLoader workers): the epoch and position that
        iteration starts at, reported by `get_state` while the loader's iteration lasts."""
        epoch, start = self._next_start()
        self._handed_out = Progress(epoch, start, dispatched=False, claimed=False)
        return self._handed_out

    def end_hand_out(self, progress: Progress) -> None:
        """A loader's iteration is over, run to its end or left: its count stays where loading
        stands until another iteration starts, but no later claim counts in it."""
        progress.claimed = True

    def finish(self, progress: Progress) -> None:
        """An iteration ran to its end: the next one (the next epoch, from its start) is where
        loading stands, unless another iteration has started since."""
        if self._claimed is progress:
            self._claimed = None
        if self._handed_out is progress:
            self._handed_out = None

    def _next_start(self) -> Tuple[int, int]:
        """(epoch, position) the next iteration of this process starts at."""
        ctl = self._control.numpy()
        epoch = int(ctl[_NEXT_EPOCH])
        return epoch, int(ctl[_RESUME_POSITION]) if ctl[_RESUME_EPOCH] == epoch else 0

    def _claim_epoch(self, worker: Optional[Any], per_step: int = 1) -> Tuple[int, int]:
        """(epoch, first batch) of the iteration starting now, advancing the shared epoch; a
        loaded position (in steps) is `per_step` batches a step of the stream iterated.

        In the main process that is plain. DataLoader workers of one loader iteration (a
        "generation": same base seed, same iteration count of their copy) must agree on the
        epoch without a lock: worker 0 alone advances it, writing the generation's epoch and
        key before the next epoch; the others read the next epoch first and the key second,
        so either they see worker 0's key (and take its epoch) or worker 0 has not yet
        advanced (and the next epoch they read is the generation's). The base seed comes from
        torch's random generator; if it is re-seeded identically before every epoch, two
        generations look alike, which `set_epoch` (clearing the key) avoids."""
        ctl = self._control.numpy()
        if worker is not None and self._worker_resume is not None:
            (epoch, start), self._worker_resume = self._worker_resume, None
            _check_epoch_left(epoch)
            self._iterations += 1
            ctl[_NEXT_EPOCH] = epoch + 1  # every resumed worker writes the same value
            return epoch, start
        if worker is None:
            epoch = _check_epoch_left(int(ctl[_NEXT_EPOCH]))
            ctl[_NEXT_EPOCH] = epoch + 1
        else:
            generation = hash((worker.seed - worker.id, self._iterations)) or 1
            self._iterations += 1
            if worker.id == 0:
                epoch = _check_epoch_left(int(ctl[_NEXT_EPOCH]))
                ctl[_GENERATION_EPOCH] = epoch
                ctl[_GENERATION] = generation
                ctl[_NEXT_EPOCH] = epoch + 1
            else:
                epoch = int(ctl[_NEXT_EPOCH])
                if ctl[_GENERATION] == generation:
                    epoch = int(ctl[_GENERATION_EPOCH])
                _check_epoch_left(epoch)
        start = int(ctl[_RESUME_POSITION]) * per_step if ctl[_RESUME_EPOCH] == epoch else 0
        return epoch, start


def epoch_number(epoch: Any) -> int:
    """An epoch a state or `set_epoch` may name: 0..LAST_EPOCH + 1."""
    if not is_int(epoch) or not 0 <= epoch <= LAST_EPOCH + 1:
        raise ValueError(f"epoch must be an integer from 0 to 2**62, not {epoch!r}")
    return int(epoch)


def _check_epoch_left(epoch: int) -> int:
    """`epoch` if it may be iterated, before the counter moves past it."""
    if epoch > LAST_EPOCH:
        raise ValueError(f"epoch {epoch} is past the last epoch the dataset counts ({LAST_EPOCH})")
    return epoch
