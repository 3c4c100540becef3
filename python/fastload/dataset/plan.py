"""Which records each batch holds: the epoch order (a function of seed, epoch and the
indices only) and its cut into the batches of one rank, plus the train/val split."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import numpy as np

from fastload._checks import fspath, int_in_range, is_int
from fastload.store import PathLike, Store

ORDERS = ("random", "sequential", "block")

# Default `block` order: blocks of at least this many bytes of consecutive records, shuffled
# as wholes, and records shuffled within windows of this many blocks.
BLOCK_BYTES = 8 << 20
WINDOW_BLOCKS = 8


def split_indices(
    n_or_store: Union[int, Store, PathLike],
    val_fraction: float,
    seed: int = 0,
    stratify: Optional[np.ndarray] = None,
):
    """Splits record numbers 0..n-1 reproducibly into (train, val), disjoint and covering,
    each sorted, with round(n * val_fraction) records in val. `n_or_store` is a count, a
    `Store` or a store's path.

    With `stratify` (one class per record), each class is held out in proportion instead:
    round(its count * val_fraction) of its records, but at least one of every class that has
    two or more, and never a class's last record (a class of one trains), so no class
    vanishes from the validation figures by chance (a random 20% of 35 photos in 4 classes left out whole classes)."""
    if is_int(n_or_store):
        n = int_in_range(n_or_store, "n", minimum=0)
    elif isinstance(n_or_store, Store):
        n = len(n_or_store)
    else:
        with Store(fspath(n_or_store, "n_or_store")) as store:
            n = len(store)
    if not 0.0 <= float(val_fraction) <= 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1, not {val_fraction!r}")
    perm = np.random.Generator(np.random.PCG64(int_in_range(seed, "seed", minimum=0))).permutation(n)
    if stratify is None:
        n_val = int(round(n * float(val_fraction)))
        return np.sort(perm[n_val:]), np.sort(perm[:n_val])
    classes = np.asarray(stratify)
    if classes.shape != (n,):
        raise ValueError(
            f"stratify must hold one class per record ({n}), not an array of shape {classes.shape}"
        )
    # The records grouped by class, each class in the order of the seeded permutation.
    grouped = perm[np.argsort(classes[perm], kind="stable")]
    _, starts, counts = np.unique(classes[grouped], return_index=True, return_counts=True)
    at_least = (counts >= 2) & (float(val_fraction) > 0)
    held = np.clip(np.round(counts * float(val_fraction)).astype(np.int64), at_least, counts - 1)
    rank_in_class = np.arange(n) - np.repeat(starts, counts)
    in_val = rank_in_class < np.repeat(held, counts)
    return np.sort(grouped[~in_val]), np.sort(grouped[in_val])


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

    @property
    def last(self) -> int:
        """Records in this rank's last batch (0 when it has none)."""
        return self.tail or (self.batch_size if self.full else 0)

    def batch(self, order: np.ndarray, k: int) -> np.ndarray:
        """Record numbers of this rank's k-th batch; `order` is padded to `self.padded` records."""
        return self.batches(order, range(k, k + 1))[0]

    def batches(self, order: np.ndarray, ks: range) -> Tuple[np.ndarray, np.ndarray]:
        """The record numbers of this rank's batches `ks` (a DataLoader worker's share from a
        resume position), one after the other in one flat int64 array, and the len(ks) + 1
        bounds of the batches in it: the form the Rust prefetcher takes, made in one indexing
        step. `order` is padded to `self.padded` records."""
        return self._cut(order, np.arange(ks.start, ks.stop, ks.step, dtype=np.int64), self.rank)

    def all_ranks(self, order: np.ndarray, js: range) -> Tuple[np.ndarray, np.ndarray]:
        """As `batches`, over every rank's batches in step order (step k: rank 0's k-th batch,
        then rank 1's, ...; `js` numbers that stream): what one process reads for all when
        Accelerate dispatches from rank 0, which gives each rank its own slice of each step."""
        j = np.arange(js.start, js.stop, js.step, dtype=np.int64)
        return self._cut(order, j // self.world_size, j % self.world_size)

    def _cut(self, order: np.ndarray, k: np.ndarray, r: Any) -> Tuple[np.ndarray, np.ndarray]:
        """The records of batches `k` of ranks `r` (a rank, or one per batch) and their bounds."""
        b, w = self.batch_size, self.world_size
        full = k < self.full
        starts = np.where(full, (k * w + r) * b, self.full * w * b + r * self.tail)
        lengths = np.where(full, b, self.tail)
        bounds = np.zeros(len(k) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        positions = np.repeat(starts - bounds[:-1], lengths) + np.arange(bounds[-1], dtype=np.int64)
        return order[positions], bounds

    def pad(self, order: np.ndarray) -> np.ndarray:
        return np.resize(order, self.padded) if len(order) else order
