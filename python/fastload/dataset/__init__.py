"""Feeding a PyTorch training loop from a store: `FastLoadDataset` yields ready batches
gathered ahead by a Rust thread (GIL released), split across DDP ranks and DataLoader
workers. The parts: `plan` (epoch order and each rank's batches), `buffers` (batch buffer
lifetime), `prefetch` (driving the Rust prefetcher), `dispatch` (Hugging Face Accelerate's
loaders, recognised), `dataset` (the dataset itself)."""

from fastload.dataset.dataset import FastLoadDataset
from fastload.dataset.plan import BLOCK_BYTES, ORDERS, WINDOW_BLOCKS, RankPlan, epoch_order, split_indices

__all__ = [
    "FastLoadDataset",
    "RankPlan",
    "epoch_order",
    "split_indices",
    "ORDERS",
    "BLOCK_BYTES",
    "WINDOW_BLOCKS",
]
