"""`FastLoadDataset`: the epochs of one store for one rank (and DataLoader worker), their
bookkeeping across processes (set_epoch, state_dict) and the loop that yields the batches."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Iterator, Optional, Tuple, Union

import numpy as np
import torch

from fastload._checks import fspath, int_in_range
from fastload.dataset.buffers import BufferPool
from fastload.dataset.cursor import EpochCursor, Walk
from fastload.dataset.dispatch import DISPATCHED, NOT_ITERATED, accelerate_loader
from fastload.dataset.plan import BLOCK_BYTES, ORDERS, WINDOW_BLOCKS, RankPlan
from fastload.dataset.prefetch import Pass
from fastload.store import PathLike, Store, StoreError, as_indices


class FastLoadDataset(torch.utils.data.IterableDataset):
    """Batches `(images, labels)` (uint8 N×H×W×C, labels float64 or int64) from a store, plus
    the int64 record numbers when `return_indices=True`.

    Use it with `DataLoader(ds, batch_size=None)` at `num_workers=0` (fastest: a Rust
    thread keeps the next `prefetch` batches gathered while the training step runs), with worker
    processes, or directly (`for images, labels in ds`). `len(ds)` is the number of batches
    this rank yields per epoch.

    Order per epoch: "random" (a fresh permutation from (seed, epoch)), "sequential" (store
    order; the default when shuffle=False) or "block" (blocks of `block_size` consecutive
    records shuffled, records shuffled within windows of `window` blocks: for stores larger
    than RAM, where random page-cache misses dominate). The order depends only on (seed,
    epoch, indices), never on the number of ranks or workers. Each new iteration advances the
    epoch unless `set_epoch` is called, also in DataLoader workers (persistent or not); call
    `set_epoch` each epoch anyway if you re-seed torch's random generator to the same value
    before every epoch (workers tell epochs apart by the DataLoader's base seed).

    Distributed: rank and world size come from `torch.distributed` when it is initialized
    (create the dataset after `init_process_group`). Ranks get disjoint shares (apart from
    padding records) and the same number of batches; see `RankPlan` for padding
    (drop_last=False) and dropping (drop_last=True). DataLoader workers split the rank's
    batches round-robin. Under Hugging Face Accelerate's `prepare`, which dispatches the batches
    from rank 0, rank 0 yields every rank's batch of each step and each rank gets its own
    (`fastload.dataset.dispatch`); `len` and `state_dict` count steps there as elsewhere.

    Where loading stands has one owner, `self.cursor` (`fastload.dataset.cursor.EpochCursor`):
    a DeviceLoader or resident loader over this dataset reads and moves the same cursor, so
    set_epoch, state_dict and load_state_dict answer alike on each of them.

    Resume: `state_dict()` is (seed, epoch, position = batches of that epoch already yielded
    in this rank: `len(ds)` after its last batch, and (next epoch, 0) once the loop over it
    has ended); `load_state_dict` makes the next iteration continue with exactly the batches
    not yet seen. torchdata's `StatefulDataLoader` does this by itself, with or without workers:
    inside a worker, the state is that worker's own progress through its share. A plain
    DataLoader with workers makes batches in other processes, so this object cannot count
    what the loop consumed: pass your own `{"seed": ds.seed, "epoch": epoch, "position":
    batches_consumed}` to `load_state_dict`, which resumes exactly with workers too, since
    the split among workers is deterministic.

    Buffers: batches land in pinned memory when CUDA is available (or pin_memory=True), so
    `.to("cuda", non_blocking=True)` is asynchronous, and buffers are reused only after every
    tensor built on them is gone (and, for pinned ones, after the GPU copy queued on the
    current stream has finished). In workers batches go to shared memory and are not pinned
    (use the DataLoader's pin_memory there).

    Prefetch: while the training step is slower than the gather, the next `prefetch` batches
    are gathered during each step; while the loop waits for every batch, one is gathered
    ahead (enough to keep the gather busy), so fewer buffers rotate through the CPU cache.
    """

    def __init__(
        self,
        store: Union[Store, PathLike],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        order: Optional[str] = None,
        drop_last: bool = False,
        indices: Any = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        prefetch: int = 2,
        pin_memory: Optional[bool] = None,
        return_indices: bool = False,
        block_size: Optional[int] = None,
        window: int = WINDOW_BLOCKS,
    ):
        if isinstance(store, Store):
            self._store: Optional[Store] = store
            self.path = str(store.path)
        else:
            self.path = fspath(store, "store")
            self._store = Store(self.path)
        self._identity = self._store.identity
        self._store_pid = os.getpid()
        self._pool: Optional[BufferPool] = None
        self.batch_size = int_in_range(batch_size, "batch_size")
        if order is None:
            order = "random" if shuffle else "sequential"
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
        if not shuffle and order != "sequential":
            raise ValueError(f"shuffle=False asks for sequential order, but order={order!r}")
        self.order = order
        seed = int_in_range(seed, "seed", minimum=0)
        self.drop_last = bool(drop_last)
        count = len(self._store)
        if indices is None:
            self.indices = np.arange(count, dtype=np.int64)
        else:
            self.indices = as_indices(indices)
            bad = self.indices[(self.indices < 0) | (self.indices >= count)]
            if len(bad):
                raise IndexError(
                    f"indices out of range for {self.path} ({count} records): {bad[:5].tolist()}"
                )
        self.rank, self.world_size = self._distributed(rank, world_size)
        # Made outside a process group, with no rank given: checked against one when used.
        self._alone = world_size is None and not _process_group_size()
        self.prefetch = int_in_range(prefetch, "prefetch")
        cuda = torch.cuda.is_available()
        if pin_memory and not cuda:
            raise ValueError("pin_memory=True needs CUDA, which is not available")
        self.pin_memory = cuda if pin_memory is None else bool(pin_memory)
        self.return_indices = bool(return_indices)
        self.block_size = (
            max(1, -(-BLOCK_BYTES // self._store.image_nbytes))
            if block_size is None
            else int_in_range(block_size, "block_size")
        )
        self.window = int_in_range(window, "window")
        plan = RankPlan(len(self.indices), self.batch_size, self.rank, self.world_size, self.drop_last)
        self.cursor = EpochCursor(self.indices, self.order, seed, self.block_size, self.window, plan)

    @property
    def seed(self) -> int:
        """The seed of the epoch orders: the cursor's, which a loaded state may change."""
        return self.cursor.seed

    @staticmethod
    def _distributed(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
        dist = torch.distributed
        initialized = dist.is_available() and dist.is_initialized()
        if world_size is None:
            world_size = dist.get_world_size() if initialized else 1
        if rank is None:
            rank = dist.get_rank() if initialized else 0
        world_size = int_in_range(world_size, "world_size")
        rank = int_in_range(rank, "rank", minimum=0)
        if rank >= world_size:
            raise ValueError(f"rank must be < world_size, not rank={rank} with world_size={world_size}")
        return rank, world_size

    def __len__(self) -> int:
        """Batches per epoch: this rank's, or every rank's when Accelerate dispatches them from
        rank 0 (its loader's length is then this rank's, as without Accelerate)."""
        if accelerate_loader(self, sys._getframe(1)) == DISPATCHED:
            return len(self.cursor.plan) * self.world_size
        self._check_made_in_the_process_group()
        return len(self.cursor.plan)

    def _check_made_in_the_process_group(self) -> None:
        """A dataset made before torch.distributed started takes itself for the only rank: used
        by the ranks of a process group, each would read the whole store (a DataModule's
        __init__ runs before Lightning starts the group). Refused, unless Accelerate dispatches
        it from rank 0, which splits what it reads."""
        ranks = _process_group_size() if self._alone else 0
        if ranks > 1:
            raise ValueError(
                f"this FastLoadDataset of {self.path} was made before torch.distributed started, so it "
                f"reads the whole store, but it is used by rank {torch.distributed.get_rank()} of {ranks}: "
                "each rank would train on every record. Make it once the process group is up (in a "
                "LightningDataModule: in setup(); with Accelerate: after Accelerator(); else after "
                "init_process_group), or pass rank= and world_size="
            )

    @property
    def last_batch_size(self) -> int:
        """Records in this rank's last batch of an epoch (0 when it has none): the only batch
        that can hold fewer than `batch_size`. The same on every rank."""
        return self.cursor.plan.last

    def __repr__(self) -> str:
        return (
            f"FastLoadDataset({self.path!r}, {len(self.indices)} records, batch_size={self.batch_size}, "
            f"order={self.order!r}, rank {self.rank}/{self.world_size}, {len(self.cursor.plan)} batches)"
        )

    def __getstate__(self) -> dict:
        # Pickles by path: each process maps the store itself.
        state = self.__dict__.copy()
        state["_store"] = state["_pool"] = None
        return state

    def _open(self) -> Store:
        """This process's handle on the store the dataset was made on. A DataLoader worker
        opens it by path: a store replaced there since (by rename, the safe way to replace one)
        is another store, so it is refused rather than read beside the main process's."""
        if self._store is None or self._store.closed or self._store_pid != os.getpid():
            store = Store(self.path)
            if store.identity != self._identity:
                store.close()
                raise StoreError(
                    f"{self.path}: the store was replaced or rewritten after this dataset was made, "
                    "so this process would read another store than the dataset's: make the dataset "
                    "again to read the new store"
                )
            self._store, self._store_pid = store, os.getpid()
            self._pool = None
        return self._store

    def _buffers(self, store: Store, worker: bool) -> BufferPool:
        """A worker's fresh pool, or the main process's pool, kept across epochs so that
        steady state allocates (and pins) nothing. Buffers hold the largest batch, which is
        smaller than batch_size when the rank's share is."""
        capacity = max(1, self.cursor.plan.largest)
        if worker:
            return BufferPool(capacity, store.shape, store.label_dtype, pin=False, worker=True)
        if self._pool is None:
            self._pool = BufferPool(capacity, store.shape, store.label_dtype, self.pin_memory, worker=False)
        return self._pool

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration epoch `epoch`, from its start (as `DistributedSampler.set_epoch`).
        Accelerate's loaders call it at the start of every iteration: from them, the epoch a
        loaded state continues keeps that state's position until the epoch starts."""
        driver = accelerate_loader(self, sys._getframe(1))
        self.cursor.set_epoch(epoch, driver)

    def state_dict(self) -> dict:
        """{"seed", "epoch", "position"}: where the next iteration would start to continue this
        rank's batches, counting the batches handed out by the loader over this dataset if
        one is iterating it; exact at num_workers=0 and, per worker, inside DataLoader workers
        (see the class docstring). Under Accelerate's dispatch only rank 0 iterates: another
        rank's state is marked as such, and load_state_dict refuses it."""
        state = self.cursor.get_state(in_worker=torch.utils.data.get_worker_info() is not None)
        if self.rank and accelerate_loader(self, sys._getframe(1)) == DISPATCHED:
            return {**state, NOT_ITERATED: self.rank}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Makes the next iteration continue epoch `state["epoch"]` after `position` batches;
        a state refused changes nothing."""
        driver = accelerate_loader(self, sys._getframe(1))
        in_worker = torch.utils.data.get_worker_info() is not None
        self.cursor.reset(state, in_worker, driver)

    def __iter__(self) -> Iterator[tuple]:
        caller = sys._getframe(1)
        _warn_if_batched_again(self, caller)
        worker = torch.utils.data.get_worker_info()
        store = self._open()
        store.check_unchanged()
        if worker is None:
            dispatched = accelerate_loader(self, caller) == DISPATCHED
            if not dispatched:
                self._check_made_in_the_process_group()
            return self._claimed_on_first_batch(store, dispatched)
        # A worker learns it from the main process, where Accelerate's loader called set_epoch.
        return self._iteration(store, worker, self.cursor.dispatched)

    def _claimed_on_first_batch(self, store: Store, dispatched: bool) -> Iterator[tuple]:
        """The main process claims its epoch when the first batch is asked for, not at
        `iter()`: torchdata's StatefulDataLoader, restoring a state saved after an epoch
        ended, makes an iterator it never uses before the one it does."""
        yield from self._iteration(store, None, dispatched)

    def _iteration(self, store: Store, worker: Optional[Any], dispatched: bool) -> Iterator[tuple]:
        walk = self.cursor.claim(worker, dispatched)
        return self._batches(store, walk, self._buffers(store, worker is not None), worker is None)

    def walk(self) -> Walk:
        """The batches the next iteration would yield, decided (record numbers, batch bounds) and
        claimed as iterating claims them (the epoch and position move on), but nothing gathered:
        what a store already on the device (`fastload.DeviceStore`) gathers there itself,
        counting the batches it hands out in the walk's progress. Main process only."""
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("walk() runs in the main process, not in a DataLoader worker")
        self._open().check_unchanged()
        return self.cursor.claim(None, dispatched=False)

    def _batches(self, store: Store, walk: Walk, pool: BufferPool, main: bool) -> Iterator[tuple]:
        """Yields the batches, counting them in the walk's progress. In the main process an
        iteration that ran to its end hands the state back to the cursor's next epoch
        (position 0); a worker keeps reporting its finished share (its restored iteration is
        empty)."""
        records, bounds, progress = walk.records, walk.bounds, walk.progress
        prefetched = Pass(store, records, bounds, pool, self.prefetch)
        try:
            for _ in range(len(walk)):
                # Held only in a list popped by the yield, so this suspended frame keeps no
                # reference to the batch: once the caller drops it, its buffer goes straight back.
                ready = [prefetched.next()]
                k, ready[0] = ready[0][0], ready[0][1:]
                progress.position += walk.step
                if self.return_indices:
                    ready[0] += (torch.from_numpy(records[bounds[k] : bounds[k + 1]].copy()),)
                yield ready.pop()
            if main:
                self.cursor.finish(progress)
        finally:
            prefetched.close()


def _process_group_size() -> int:
    """The size of torch.distributed's default process group, 0 when there is none."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 0


def _warn_if_batched_again(dataset: FastLoadDataset, caller) -> None:
    """`DataLoader(ds)` without `batch_size=None` stacks the batches this dataset already
    yields into 5-D tensors, silently. The DataLoader's fetcher (torch's or torchdata's)
    calls `iter(ds)`: a caller frame whose `self` fetches for this dataset with automatic
    batching on gives the mistake away."""
    for _ in range(3):
        if caller is None:
            return
        fetcher = caller.f_locals.get("self")
        if getattr(fetcher, "dataset", None) is dataset and getattr(fetcher, "auto_collation", False):
            warnings.warn(
                "FastLoadDataset yields whole batches, and this DataLoader batches them again into "
                "5-D tensors: pass batch_size=None, as in DataLoader(ds, batch_size=None)",
                UserWarning,
                stacklevel=2,
            )
            return
        caller = caller.f_back
