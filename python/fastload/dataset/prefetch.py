"""One iteration's drive of the Rust prefetcher: lending it batch buffers from the pool and
taking back each filled batch, in order."""

from __future__ import annotations

import weakref
from typing import Tuple

import numpy as np
import torch

from fastload.dataset.buffers import Buffer, BufferPool
from fastload.store import Store


class Pass:
    """One iteration: a Rust prefetcher (a thread gathering the batches in order, GIL
    released, and one giving read-ahead hints) and the buffers it holds for the batches
    after the user's current one: `prefetch` of them while batches are ready before they are
    asked for (the training step is the slower side: depth absorbs the loader's jitter),
    one while the user has to wait for each batch (the loader is the slower side and is
    never idle with one: then fewer buffers keep the ring of buffers in the CPU cache,
    and every copy is faster)."""

    def __init__(
        self, store: Store, records: np.ndarray, bounds: np.ndarray, pool: BufferPool, prefetch: int
    ):
        """`records`: the int64 record numbers of every batch, one batch after the other, and
        `bounds` where each starts (see `RankPlan.batches`); the prefetcher checks them."""
        self.prefetcher = store.prefetcher(records, np.diff(bounds).tolist())
        self.pool, self.prefetch = pool, prefetch
        self.taken = 0  # batches returned so far: the number of the next one
        self.held: dict = {}  # slot -> buffer, for the buffers the prefetcher holds
        self.depth = prefetch
        self.closed = False

    def short(self) -> bool:
        """Whether the prefetcher holds fewer buffers than it should."""
        return not self.closed and len(self.held) < min(self.depth, self.prefetcher.remaining)

    def adopt(self, buf: Buffer) -> bool:
        """Lends a free buffer to the prefetcher if it is short of them."""
        if not self.short():
            return False
        if buf.owner is self.prefetcher:
            self.prefetcher.release(buf.slot)
        else:
            buf.owner, buf.slot = self.prefetcher, self.prefetcher.add_slot(buf.image_bytes, buf.label_bytes)
        self.held[buf.slot] = buf
        return True

    def next(self) -> Tuple[int, torch.Tensor, torch.Tensor]:
        """The next batch's number, images and labels, lent to the caller. In a `for` loop the
        finalizer has already handed the last batch's buffer back (`_let_go`), so the pool is
        polled only when the prefetcher is short of buffers and taking a ready batch costs
        little more than the Rust call."""
        if self.short():
            self.pool.reclaim()
            while self.short():
                self.adopt(self.pool.take())
        slot, batch, n, waited = self.prefetcher.next()
        if batch != self.taken:
            raise RuntimeError(f"the prefetcher returned batch {batch} where batch {self.taken} was due")
        self.taken += 1
        self.depth = 1 if waited else self.prefetch
        buf = self.held.pop(slot)
        if self.pool.worker:
            self.prefetcher.retire(slot)  # the batch leaves for the main process
        images = buf.images[:n]
        if not self.pool.worker:
            self.pool.lend(buf)
            weakref.finalize(images, self._let_go, buf).atexit = False
        return batch, images, buf.labels[:n]

    def _let_go(self, buf: Buffer) -> None:
        """The images tensor of a lent batch is going: a buffer nothing else holds goes straight
        to the prefetcher if it is short of buffers (it gathers ahead during the user's step),
        else back to the pool, where this pass or a later one takes it."""
        if self.pool.let_go(buf) and not self.adopt(buf):
            self.pool.give_back(buf)

    def close(self) -> None:
        """Joins the threads, then returns the buffers they held (never handed out) to the pool."""
        self.closed = True
        self.prefetcher.close()
        held, self.held = list(self.held.values()), {}
        for buf in held:
            self.pool.give_back(buf)
