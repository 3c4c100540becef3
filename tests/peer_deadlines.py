"""Deadlines for the multi-process test workers (torchrun DDP, Accelerate, Lightning): a stuck
peer or DataLoader worker fails its run within seconds, with every thread's stack, instead of
holding a test for minutes (#42: a rank sat five minutes on a worker that never started)."""

import faulthandler
from datetime import timedelta

#: A collective, or the rendezvous, that waits longer than this for a peer raises.
PEER_TIMEOUT = timedelta(seconds=60)
#: The longest a DataLoader waits for one batch from its worker processes.
WORKER_TIMEOUT_S = 30
#: A worker script still running after this long dumps every thread's stack and exits 1,
#: before the test's own subprocess limit (300 s) would kill it silently.
STALL_DUMP_S = 240


def loader_timeout(num_workers: int) -> int:
    """DataLoader's `timeout` for `num_workers` (it must be 0 without worker processes)."""
    return WORKER_TIMEOUT_S if num_workers else 0


def dump_stacks_if_stalled() -> None:
    faulthandler.dump_traceback_later(STALL_DUMP_S, exit=True)
