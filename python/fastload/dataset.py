"""Feeding a PyTorch training loop from a store: `FastLoadDataset` yields ready batches
gathered ahead by a Rust thread (GIL released), split across DDP ranks and DataLoader
workers; `to_device` moves a uint8 batch to the GPU and converts it only there."""

from __future__ import annotations

import collections
import functools
import os
import weakref
from typing import Any, Iterator, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from fastload import _core
from fastload.store import PathLike, Store, _fspath, as_indices

ORDERS = ("random", "sequential", "block")

# Default `block` order: blocks of at least this many bytes of consecutive records, shuffled
# as wholes, and records shuffled within windows of this many blocks.
BLOCK_BYTES = 8 << 20
WINDOW_BLOCKS = 8

# Slots of the control block shared with DataLoader workers (see `_claim_epoch`).
_NEXT_EPOCH, _RESUME_EPOCH, _RESUME_POSITION, _GENERATION, _GENERATION_EPOCH = range(5)


def _positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """`value` as an int in [minimum, 2**62): the bound keeps it inside the int64 state slots."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, not {value!r}")
    if value >= 2**62:
        raise ValueError(f"{name} must be below 2**62, not {value!r}")
    return int(value)


def split_indices(n_or_store: Union[int, Store, PathLike], val_fraction: float, seed: int = 0):
    """Splits record numbers 0..n-1 reproducibly into (train, val), disjoint and covering,
    each sorted, with round(n * val_fraction) records in val. `n_or_store` is a count, a
    `Store` or a store's path."""
    if isinstance(n_or_store, (int, np.integer)) and not isinstance(n_or_store, bool):
        n = _positive_int(n_or_store, "n", minimum=0)
    elif isinstance(n_or_store, Store):
        n = len(n_or_store)
    else:
        with Store(_fspath(n_or_store, "n_or_store")) as store:
            n = len(store)
    if not 0.0 <= float(val_fraction) <= 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1, not {val_fraction!r}")
    perm = np.random.Generator(np.random.PCG64(_positive_int(seed, "seed", minimum=0))).permutation(n)
    n_val = int(round(n * float(val_fraction)))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def epoch_order(
    indices: np.ndarray, order: str, seed: int, epoch: int, block_size: int, window: int
) -> np.ndarray:
    """The order in which one epoch visits `indices`, across all ranks and workers: a
    function of (seed, epoch, indices) and the order's parameters only."""
    if order == "sequential":
        return np.sort(indices)
    rng = np.random.Generator(np.random.PCG64([seed, epoch]))
    if order == "random":
        return indices[rng.permutation(len(indices))]
    # block: consecutive records stay together in blocks so cold reads stay long and
    # sequential; blocks are shuffled, then records within each window of blocks.
    ordered = np.sort(indices)
    block_of = np.arange(len(ordered)) // block_size
    block_rank = np.argsort(rng.permutation(int(block_of[-1]) + 1 if len(ordered) else 0))
    window_of = block_rank[block_of] // window
    return ordered[np.lexsort((rng.random(len(ordered)), window_of))]


class RankPlan:
    """The batches one rank yields in one epoch. Every rank gets the same number of batches
    (unequal counts hang DDP): with drop_last=False the epoch order is padded by wrapping
    around to ceil(M / world_size) records per rank, the last batch of each rank possibly
    partial; with drop_last=True only full batches are kept and up to
    world_size * batch_size - 1 records of the tail are dropped. Batches are cut so that all
    ranks together read consecutive runs of the epoch order."""

    def __init__(self, count: int, batch_size: int, rank: int, world_size: int, drop_last: bool):
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        if drop_last:
            self.full, self.tail = count // (world_size * batch_size), 0
        else:
            self.full, self.tail = divmod(-(-count // world_size), batch_size)
        self.padded = world_size * (self.full * batch_size + self.tail)

    def __len__(self) -> int:
        return self.full + (self.tail > 0)

    @property
    def largest(self) -> int:
        """Records in this rank's largest batch: what a batch buffer must hold."""
        return self.batch_size if self.full else self.tail

    def batch(self, order: np.ndarray, k: int) -> np.ndarray:
        """Record numbers of this rank's k-th batch; `order` is padded to `self.padded` records."""
        b, w, r = self.batch_size, self.world_size, self.rank
        if k < self.full:
            return order[(k * w + r) * b : (k * w + r + 1) * b]
        start = self.full * w * b + r * self.tail
        return order[start : start + self.tail]

    def pad(self, order: np.ndarray) -> np.ndarray:
        return np.resize(order, self.padded) if len(order) else order


def _use_count(tensor: torch.Tensor) -> int:
    """Tensors (views included, NumPy views of them too) sharing `tensor`'s memory, plus one;
    0 where this torch cannot tell, so buffers are then never reused."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return count(tensor.untyped_storage()._cdata) if count else 0


class _Buffer:
    """One batch's images and labels, the flat byte views of them the prefetcher writes
    through, and the prefetcher slot that holds them (if any). `copied` is a CUDA event the
    next fill waits for, so an asynchronous copy to the GPU of the previous contents
    finishes first."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels
        self.image_bytes = images.numpy().reshape(-1)
        self.label_bytes = labels.numpy().view(np.uint8)
        self.copied: Optional[Any] = None
        self.owner: Optional[_core.Prefetcher] = None
        self.slot = -1
        self.lent = False
        self.baseline = self._references()

    def _references(self) -> Tuple[int, int]:
        return (_use_count(self.images), _use_count(self.labels))

    def unreferenced(self, dying_images: int = 0) -> bool:
        """No tensor but ours uses the buffer, apart from `dying_images` images tensors whose
        finalizer is running."""
        images, labels = self._references()
        return self.baseline[0] > 0 and (images - dying_images, labels) == self.baseline


@functools.cache
def _dying_view_count() -> int:
    """How much a tensor whose weakref finalizer is running still adds to its storage's use
    count: 1 in the torch versions tested (the Python object goes first, then the tensor),
    measured here so that another torch that releases earlier is read right too."""
    base = torch.empty(1)
    view = base[:]
    seen = []
    weakref.finalize(view, lambda: seen.append(_use_count(base)))
    alive = _use_count(base)
    del view
    return seen[0] - (alive - 1) if seen and alive > 0 else -1


class _BufferPool:
    """Batch buffers, reused once no tensor built on them is alive anywhere (and, for pinned
    ones, once the GPU copy queued on them has finished), so a batch the user still holds is
    never overwritten and steady state allocates nothing. An unpinned buffer comes back the
    moment the batch's images tensor dies, as in a `for` loop that moves on to the next
    batch; a pinned one (or one still referenced then) when the prefetcher next needs a
    buffer, after the GPU copy queued on it has finished. In a DataLoader worker the batches travel to the main
    process through shared memory, where this process cannot see who holds them: there every
    batch gets a fresh shared-memory buffer."""

    def __init__(
        self, batch_size: int, shape: Tuple[int, ...], label_dtype: np.dtype, pin: bool, worker: bool
    ):
        self._images_shape = (batch_size, *shape)
        self._label_dtype = torch.from_numpy(np.empty(0, dtype=label_dtype)).dtype
        self._pin, self.worker = pin, worker
        self._free: collections.deque = collections.deque()
        self._copying: collections.deque = collections.deque()
        self._lent: list = []
        self.active: Optional[_Pass] = None  # the iteration under way, which takes free buffers first

    def _allocate(self) -> _Buffer:
        try:
            return self._new_buffer()
        except RuntimeError as exc:  # torch's allocator: out of memory, or a size it refuses
            n, nbytes = self._images_shape[0], int(np.prod(self._images_shape, dtype=object))
            raise MemoryError(
                f"cannot allocate a batch buffer of {n} images ({nbytes / 1e9:.3g} GB): "
                f"use a smaller batch_size ({exc})"
            ) from None

    def _new_buffer(self) -> _Buffer:
        n = self._images_shape[0]
        if self.worker:
            images = (
                torch.empty(0, dtype=torch.uint8)
                .set_(torch.UntypedStorage._new_shared(int(np.prod(self._images_shape))))
                .view(self._images_shape)
            )
            labels = (
                torch.empty(0, dtype=self._label_dtype).set_(torch.UntypedStorage._new_shared(n * 8)).view(n)
            )
            return _Buffer(images, labels)
        return _Buffer(
            torch.empty(self._images_shape, dtype=torch.uint8, pin_memory=self._pin),
            torch.empty(n, dtype=self._label_dtype, pin_memory=self._pin),
        )

    def take(self) -> _Buffer:
        """A buffer free to fill: a reclaimed one, one whose GPU copy is waited for, or a new one."""
        if not self._free and self._copying:
            buf = self._copying.popleft()
            buf.copied.synchronize()
            buf.copied = None
            self._free.append(buf)
        # Last freed, first reused: its lines are the likeliest to be still in the CPU cache.
        return self._free.pop() if self._free else self._allocate()

    def lend(self, buf: _Buffer, images: torch.Tensor) -> None:
        """Hands `buf` to the user as the tensor `images` (and views of it)."""
        if self.worker:
            return
        buf.lent = True
        self._lent.append(buf)
        weakref.finalize(images, self._let_go, buf).atexit = False

    def give_back(self, buf: _Buffer) -> None:
        """Takes back a buffer free to fill: the iteration under way gets it if it is short
        of buffers, the pool keeps it otherwise."""
        if self.worker:
            return
        if self.active is None or not self.active.adopt(buf):
            self._free.append(buf)

    def _let_go(self, buf: _Buffer) -> None:
        """The yielded images tensor is going; if nothing else holds the buffer, it is free now."""
        if buf.lent and not self._pin and buf.unreferenced(dying_images=_dying_view_count()):
            buf.lent = False
            self._lent.remove(buf)
            self.give_back(buf)

    def reclaim(self) -> None:
        """Frees lent buffers the user has let go of (called by the consumer thread, whose
        current CUDA stream is the one the user's copies were queued on)."""
        let_go = [buf for buf in self._lent if buf.unreferenced()]
        for buf in let_go:
            buf.lent = False
            self._lent.remove(buf)
            if self._pin and torch.cuda.is_initialized():
                buf.copied = torch.cuda.Event()
                buf.copied.record()
                self._copying.append(buf)
            else:
                self.give_back(buf)
        while self._copying and self._copying[0].copied.query():
            buf = self._copying.popleft()
            buf.copied = None
            self.give_back(buf)


class _Pass:
    """One iteration: a Rust prefetcher (a thread gathering the batches in order, GIL
    released, and one giving read-ahead hints) and the buffers it holds for the batches
    after the user's current one: `prefetch` of them while batches are ready before they are
    asked for (the training step is the slower side: depth absorbs the loader's jitter),
    one while the user has to wait for each batch (the loader is the slower side and is
    never idle with one: then fewer buffers keep the ring of buffers in the CPU cache,
    and every copy is faster)."""

    def __init__(self, store: Store, batches: Sequence[np.ndarray], pool: _BufferPool, prefetch: int):
        flat = np.concatenate(batches) if len(batches) else np.empty(0, dtype=np.int64)
        self.prefetcher = _core.Prefetcher(
            store._core, flat.astype(np.int64, copy=False), [len(b) for b in batches]
        )
        self.pool, self.prefetch = pool, prefetch
        self.held: dict = {}  # slot -> buffer, for the buffers the prefetcher holds
        self.depth = prefetch
        self.closed = False
        pool.active = self

    def short(self) -> bool:
        """Whether the prefetcher holds fewer buffers than it should."""
        return not self.closed and len(self.held) < min(self.depth, self.prefetcher.remaining)

    def adopt(self, buf: _Buffer) -> bool:
        """Lends a free buffer to the prefetcher if it is short of them."""
        if not self.short():
            return False
        if buf.owner is self.prefetcher:
            self.prefetcher.release(buf.slot)
        else:
            buf.owner, buf.slot = self.prefetcher, self.prefetcher.add_slot(buf.image_bytes, buf.label_bytes)
        self.held[buf.slot] = buf
        return True

    def next(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The next batch's images and labels, lent to the caller. In a `for` loop the
        finalizer has already handed the last batch's buffer back, so the pool is polled only
        when the prefetcher is short of buffers and taking a ready batch costs little more
        than the Rust call."""
        if self.short():
            self.pool.reclaim()
            while self.short():
                self.adopt(self.pool.take())
        slot, n, waited = self.prefetcher.next()
        self.depth = 1 if waited else self.prefetch
        buf = self.held.pop(slot)
        if self.pool.worker:
            self.prefetcher.retire(slot)  # the batch leaves for the main process
        images = buf.images[:n]
        self.pool.lend(buf, images)
        return images, buf.labels[:n]

    def close(self) -> None:
        """Joins the threads, then returns the buffers they held (never handed out) to the pool."""
        self.closed = True
        self.prefetcher.close()
        if self.pool.active is self:
            self.pool.active = None
        held, self.held = list(self.held.values()), {}
        for buf in held:
            self.pool.give_back(buf)


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
    batches round-robin.

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
            self.path = _fspath(store, "store")
            self._store = Store(self.path)
        self._store_pid = os.getpid()
        self._pool: Optional[_BufferPool] = None
        self.batch_size = _positive_int(batch_size, "batch_size")
        if order is None:
            order = "random" if shuffle else "sequential"
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
        if not shuffle and order != "sequential":
            raise ValueError(f"shuffle=False asks for sequential order, but order={order!r}")
        self.order = order
        self.seed = _positive_int(seed, "seed", minimum=0)
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
        self.prefetch = _positive_int(prefetch, "prefetch")
        cuda = torch.cuda.is_available()
        if pin_memory and not cuda:
            raise ValueError("pin_memory=True needs CUDA, which is not available")
        self.pin_memory = cuda if pin_memory is None else bool(pin_memory)
        self.return_indices = bool(return_indices)
        self.block_size = (
            max(1, -(-BLOCK_BYTES // self._store.image_nbytes))
            if block_size is None
            else _positive_int(block_size, "block_size")
        )
        self.window = _positive_int(window, "window")
        self._plan = RankPlan(len(self.indices), self.batch_size, self.rank, self.world_size, self.drop_last)
        # Epoch bookkeeping lives in shared memory so set_epoch/load_state_dict reach
        # DataLoader workers, persistent ones included, and workers can advance the epoch.
        self._control = torch.tensor([0, -1, 0, 0, 0], dtype=torch.int64).share_memory_()
        self._iterations = 0  # iterations started by this copy (worker generations)
        # [epoch, position] of this copy's latest iteration; in a worker, position is where
        # the worker's share continues (its next batch is position + worker id).
        self._progress: Optional[list] = None
        # A state loaded inside a DataLoader worker: that worker's alone, for its next iteration.
        self._worker_resume: Optional[Tuple[int, int]] = None

    @staticmethod
    def _distributed(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
        dist = torch.distributed
        initialized = dist.is_available() and dist.is_initialized()
        if world_size is None:
            world_size = dist.get_world_size() if initialized else 1
        if rank is None:
            rank = dist.get_rank() if initialized else 0
        world_size = _positive_int(world_size, "world_size")
        rank = _positive_int(rank, "rank", minimum=0)
        if rank >= world_size:
            raise ValueError(f"rank must be < world_size, not rank={rank} with world_size={world_size}")
        return rank, world_size

    def __len__(self) -> int:
        return len(self._plan)

    def __repr__(self) -> str:
        return (
            f"FastLoadDataset({self.path!r}, {len(self.indices)} records, batch_size={self.batch_size}, "
            f"order={self.order!r}, rank {self.rank}/{self.world_size}, {len(self)} batches)"
        )

    def __getstate__(self) -> dict:
        # Pickles by path: each process maps the store itself.
        state = self.__dict__.copy()
        state["_store"] = state["_pool"] = None
        state["_progress"] = None
        return state

    def _open(self) -> Store:
        if self._store is None or self._store.closed or self._store_pid != os.getpid():
            self._store, self._store_pid = Store(self.path), os.getpid()
            self._pool = None
        return self._store

    def _buffers(self, store: Store, worker: bool) -> _BufferPool:
        """A worker's fresh pool, or the main process's pool, kept across epochs so that
        steady state allocates (and pins) nothing. Buffers hold the largest batch, which is
        smaller than batch_size when the rank's share is."""
        capacity = max(1, self._plan.largest)
        if worker:
            return _BufferPool(capacity, store.shape, store.label_dtype, pin=False, worker=True)
        if self._pool is None:
            self._pool = _BufferPool(capacity, store.shape, store.label_dtype, self.pin_memory, worker=False)
        return self._pool

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration epoch `epoch`, from its start (as `DistributedSampler.set_epoch`)."""
        ctl = self._control.numpy()
        ctl[_NEXT_EPOCH] = _positive_int(epoch, "epoch", minimum=0)
        ctl[_RESUME_EPOCH] = -1
        ctl[_GENERATION] = 0  # no worker generation can mistake the next one for itself
        self._progress = None

    def state_dict(self) -> dict:
        """{"seed", "epoch", "position"}: where the next iteration would start to continue this
        rank's batches; exact at num_workers=0 and, per worker, inside DataLoader workers (see
        the class docstring)."""
        if self._progress is not None:
            epoch, position = self._progress[0], min(self._progress[1], len(self))
        else:
            ctl = self._control.numpy()
            epoch = int(ctl[_NEXT_EPOCH])
            position = int(ctl[_RESUME_POSITION]) if ctl[_RESUME_EPOCH] == epoch else 0
        return {"seed": self.seed, "epoch": int(epoch), "position": int(position)}

    def load_state_dict(self, state: dict) -> None:
        """Makes the next iteration continue epoch `state["epoch"]` after `position` batches."""
        missing = {"seed", "epoch", "position"} - set(state)
        if missing:
            raise KeyError(f"state is missing {sorted(missing)}")
        position = _positive_int(state["position"], "position", minimum=0)
        if position > len(self):
            raise ValueError(f"position {position} is beyond the {len(self)} batches of an epoch")
        self.seed = _positive_int(state["seed"], "seed", minimum=0)
        epoch = _positive_int(state["epoch"], "epoch", minimum=0)
        if torch.utils.data.get_worker_info() is not None:
            # A worker restoring its own progress (StatefulDataLoader): the other workers
            # share the control block and restore theirs, so it stays out of it.
            self._worker_resume, self._progress = (epoch, position), None
            return
        self.set_epoch(epoch)
        ctl = self._control.numpy()
        ctl[_RESUME_POSITION] = position
        ctl[_RESUME_EPOCH] = ctl[_NEXT_EPOCH]

    def _claim_epoch(self, worker: Optional[Any]) -> Tuple[int, int]:
        """(epoch, first batch) of the iteration starting now, advancing the shared epoch.

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
            self._iterations += 1
            ctl[_NEXT_EPOCH] = epoch + 1  # every resumed worker writes the same value
            return epoch, start
        if worker is None:
            epoch = int(ctl[_NEXT_EPOCH])
            ctl[_NEXT_EPOCH] = epoch + 1
        else:
            generation = hash((worker.seed - worker.id, self._iterations)) or 1
            self._iterations += 1
            if worker.id == 0:
                epoch = int(ctl[_NEXT_EPOCH])
                ctl[_GENERATION_EPOCH] = epoch
                ctl[_GENERATION] = generation
                ctl[_NEXT_EPOCH] = epoch + 1
            else:
                epoch = int(ctl[_NEXT_EPOCH])
                if ctl[_GENERATION] == generation:
                    epoch = int(ctl[_GENERATION_EPOCH])
        start = int(ctl[_RESUME_POSITION]) if ctl[_RESUME_EPOCH] == epoch else 0
        return epoch, start

    def __iter__(self) -> Iterator[tuple]:
        worker = torch.utils.data.get_worker_info()
        store = self._open()
        store.check_unchanged()
        if worker is None:
            return self._claimed_on_first_batch(store)
        return self._iteration(store, worker)

    def _claimed_on_first_batch(self, store: Store) -> Iterator[tuple]:
        """The main process claims its epoch when the first batch is asked for, not at
        `iter()`: torchdata's StatefulDataLoader, restoring a state saved after an epoch
        ended, makes an iterator it never uses before the one it does."""
        yield from self._iteration(store, None)

    def _iteration(self, store: Store, worker: Optional[Any]) -> Iterator[tuple]:
        epoch, start = self._claim_epoch(worker)
        order = self._plan.pad(
            epoch_order(self.indices, self.order, self.seed, epoch, self.block_size, self.window)
        )
        worker_id, num_workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        batches = [self._plan.batch(order, k) for k in range(start + worker_id, len(self._plan), num_workers)]
        pool = self._buffers(store, worker is not None)
        self._progress = [epoch, start]
        return self._batches(store, batches, pool, self._progress, num_workers, worker is None)

    def _batches(
        self, store: Store, batches: list, pool: _BufferPool, progress: list, step: int, main: bool
    ) -> Iterator[tuple]:
        """Yields the batches, counting them in `progress`. In the main process an iteration
        that ran to its end hands the state back to the control block (next epoch, position
        0); a worker keeps reporting its finished share (its restored iteration is empty)."""
        prefetched = _Pass(store, batches, pool, self.prefetch)
        try:
            for idx in batches:
                # Yielded out of a list, so this suspended frame keeps no reference to the
                # batch: once the caller drops it, its buffer goes straight back.
                ready = [prefetched.next()]
                progress[1] += step
                if self.return_indices:
                    ready[0] += (torch.from_numpy(np.array(idx)),)
                yield ready.pop()
            if main and self._progress is progress:
                self._progress = None
        finally:
            prefetched.close()


def to_device(
    images: torch.Tensor,
    device: Union[str, torch.device],
    dtype: torch.dtype = torch.float32,
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    channels_last: bool = True,
) -> torch.Tensor:
    """Moves a uint8 N×H×W×C batch to `device` and only there makes it N×C×H×W `dtype`,
    scaled to [0, 1] and normalized per channel with `mean`/`std` (in 0–1 units) when given.

    Why: the host-to-device link is a real bottleneck (Thunderbolt ~5 GB/s, PCIe 4.0 x16
    ~25 GB/s), and uint8 is a quarter of the bytes of float32. The copy is asynchronous
    when the batch is in pinned memory. With channels_last=True the result keeps the
    channels_last memory format that NHWC data has anyway (no transpose copy; fast for
    convolutions on GPUs); otherwise it is made contiguous NCHW.
    """
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
        raise TypeError("images must be a uint8 tensor of shape N×H×W×C")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None) if dtype.isidentifier() else None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch dtype such as torch.float32, not {dtype!r}")
    channels = images.shape[3]
    mean_v = (0.0,) if mean is None else tuple(torch.as_tensor(mean, dtype=torch.float64).flatten().tolist())
    std_v = (1.0,) if std is None else tuple(torch.as_tensor(std, dtype=torch.float64).flatten().tolist())
    for name, value in (("mean", mean_v), ("std", std_v)):
        if len(value) not in (1, channels):
            raise ValueError(f"{name} must have 1 or {channels} values, not {len(value)}")
    if 0.0 in std_v:
        raise ValueError("std must not be zero")
    x = images.to(device, non_blocking=images.is_pinned()).permute(0, 3, 1, 2).to(dtype)
    scale, shift = _normalization(x.device, dtype, mean_v, std_v)
    x.mul_(scale).sub_(shift)
    return x if channels_last else x.contiguous()


@functools.lru_cache(maxsize=64)
def _normalization(device: torch.device, dtype: torch.dtype, mean: tuple, std: tuple) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-channel scale and shift on `device`, made once per (device, dtype, mean, std): a
    fresh small tensor per batch would be a synchronous host-to-device copy, queued behind the
    batch's asynchronous one, so the host would wait for every batch to arrive."""
    mean_t, std_t = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
    scale = (1.0 / (255.0 * std_t)).to(device=device, dtype=dtype).view(1, -1, 1, 1)
    shift = (mean_t / std_t).to(device=device, dtype=dtype).view(1, -1, 1, 1)
    return scale, shift
