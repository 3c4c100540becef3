"""Batch buffers and their lifetime: a buffer is refilled only once nothing built on it is
alive (no tensor, NumPy or DLPack view, no Python storage object; and, when pinned, once the
GPU copy queued on it has finished), and never again once its memory was moved away."""

from __future__ import annotations

import collections
import contextlib
import functools
import sys
import weakref
from typing import Any, Optional, Tuple

import numpy as np
import torch

# Pinned buffers whose GPU copy may still be pending before `take` waits for the oldest instead
# of allocating another: the host may run this many batches ahead of the copies without waiting
# (an event recorded when a buffer is let go finishes only after the copies queued before it).
COPIES_IN_FLIGHT = 4


_STORAGE_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _holders(tensor: torch.Tensor) -> Tuple[int, int]:
    """Who reaches `tensor`'s memory: the tensors sharing its storage (views included, NumPy
    and DLPack views of them too) plus one, and the Python references to its storage object,
    which that count does not see (`images.untyped_storage()` kept alive alone still reaches
    the batch). The use count is 0 where this torch cannot tell, so buffers are then never
    reused."""
    storage = tensor.untyped_storage()
    use = _STORAGE_USE_COUNT(storage._cdata) if _STORAGE_USE_COUNT else 0
    return use, sys.getrefcount(storage)


def _memory(tensor: torch.Tensor) -> Tuple[int, int, bool]:
    """(address, bytes, shared) of `tensor`'s storage: `share_memory_()` (which pickling for a
    torch.multiprocessing queue also does) or a storage `resize_` moves the bytes elsewhere and
    frees the old ones, which the prefetcher would still write through."""
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes(), storage.is_shared()


class Buffer:
    """One batch's images and labels, the flat byte views of them the prefetcher writes
    through, and the prefetcher slot that holds them (if any). `copied` is a CUDA event the
    next fill waits for, so an asynchronous copy to the GPU of the previous contents
    finishes first."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels
        self.image_bytes = images.numpy().reshape(-1)
        self.label_bytes = labels.numpy().view(np.uint8)
        self.copied: Optional[Any] = None
        self.owner: Optional[Any] = None  # the Rust prefetcher that holds the slot
        self.slot = -1
        self.lent = False
        self.baseline = self._references()
        self.memory = self._memory()

    def _references(self) -> Tuple[Tuple[int, int], Tuple[int, int]]:
        return _holders(self.images), _holders(self.labels)

    def _memory(self) -> Tuple[Tuple[int, int, bool], ...]:
        return _memory(self.images), _memory(self.labels)

    def unreferenced(self, dying_images: int = 0) -> bool:
        """No tensor or storage object but ours uses the buffer, apart from `dying_images`
        images tensors whose finalizer is running."""
        (images, image_storages), labels = self._references()
        return self.baseline[0][0] > 0 and ((images - dying_images, image_storages), labels) == self.baseline

    def moved(self) -> bool:
        """Whether the images or labels no longer live in the memory the prefetcher was lent."""
        return self._memory() != self.memory


@functools.cache
def _dying_view_count() -> int:
    """How much a tensor whose weakref finalizer is running still adds to its storage's use
    count: 1 in the torch versions tested (the Python object goes first, then the tensor),
    measured here so that another torch that releases earlier is read right too."""
    base = torch.empty(1)
    view = base[:]
    seen = []
    weakref.finalize(view, lambda: seen.append(_holders(base)[0]))
    alive = _holders(base)[0]
    del view
    return seen[0] - (alive - 1) if seen and alive > 0 else -1


class BufferPool:
    """Batch buffers, reused once no tensor built on them is alive anywhere (and, for pinned
    ones, once the GPU copy queued on them has finished), so a batch the user still holds is
    never overwritten and steady state allocates nothing. The pool is a passive free list with
    the loans' bookkeeping; its one consumer (`prefetch.Pass`) drives it: takes buffers, lends
    them, and, when a lent images tensor dies, asks `let_go` whether the buffer is free (an
    unpinned one the moment the batch's images tensor dies, as in a `for` loop that moves on
    to the next batch) and keeps it or gives it back; `reclaim` frees the rest (a pinned one,
    or one still referenced then, after the GPU copy queued on it has finished). A buffer whose memory the user moved
    while holding it (`share_memory_()`, a torch.multiprocessing queue) is retired instead: the
    prefetcher never writes to it again. In a DataLoader worker the batches travel to the main
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

    def _allocate(self) -> Buffer:
        try:
            return self._new_buffer()
        except RuntimeError as exc:  # torch's allocator: out of memory, or a size it refuses
            n, nbytes = self._images_shape[0], int(np.prod(self._images_shape, dtype=object))
            raise MemoryError(
                f"cannot allocate a batch buffer of {n} images ({nbytes / 1e9:.3g} GB): "
                f"use a smaller batch_size ({exc})"
            ) from None

    def _new_buffer(self) -> Buffer:
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
            return Buffer(images, labels)
        return Buffer(
            torch.empty(self._images_shape, dtype=torch.uint8, pin_memory=self._pin),
            torch.empty(n, dtype=self._label_dtype, pin_memory=self._pin),
        )

    def take(self) -> Buffer:
        """A buffer free to fill: a reclaimed one, the oldest whose GPU copy has finished, a
        new one while fewer than COPIES_IN_FLIGHT copies are pending, else the oldest once its
        copy has finished (only then does the host wait: it is that far ahead of the GPU)."""
        if not self._free and self._copying:
            oldest = self._copying[0]
            if not oldest.copied.query():
                if len(self._copying) < COPIES_IN_FLIGHT:
                    return self._allocate()
                oldest.copied.synchronize()
            self._copying.popleft()
            oldest.copied = None
            self._free.append(oldest)
        # Last freed, first reused: its lines are the likeliest to be still in the CPU cache.
        return self._free.pop() if self._free else self._allocate()

    def lend(self, buf: Buffer) -> None:
        """Counts `buf` as handed to the user (as a tensor over its images and views of it)
        until `let_go` or `reclaim` finds nothing holds it any more. A worker's buffers leave
        for the main process and are never reused."""
        if self.worker:
            return
        buf.lent = True
        self._lent.append(buf)

    def give_back(self, buf: Buffer) -> None:
        """Keeps a buffer free to fill, for the next `take`."""
        if not self.worker:
            self._free.append(buf)

    def _end_loan(self, buf: Buffer) -> bool:
        """Takes back a buffer the user has let go of. False when its memory was moved away
        while lent: then the buffer is retired, and nothing writes to it again."""
        buf.lent = False
        self._lent.remove(buf)
        if not buf.moved():
            return True
        if buf.owner is not None:
            with contextlib.suppress(ValueError):  # a closed prefetcher has let go of it already
                buf.owner.retire(buf.slot)
            buf.owner = None
        return False

    def let_go(self, buf: Buffer) -> bool:
        """The images tensor `buf` was lent as is going (called from its finalizer): whether
        nothing else holds the buffer, which is then free to fill now and the caller's to keep
        or give back. A pinned buffer is never free here: `reclaim` frees it after its copy."""
        return (
            buf.lent
            and not self._pin
            and buf.unreferenced(dying_images=_dying_view_count())
            and self._end_loan(buf)
        )

    def reclaim(self) -> None:
        """Frees lent buffers the user has let go of (called by the consumer thread, whose
        current CUDA stream is the one the user's copies were queued on)."""
        let_go = [buf for buf in self._lent if buf.unreferenced()]
        for buf in let_go:
            if not self._end_loan(buf):
                continue
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
