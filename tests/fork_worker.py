"""Run by tests/dataset/test_dataset_store.py: DataLoader workers forked EPOCHS x 2 times while
fastload's Rust threads are busy in the same process (a thread gathering batches without the
GIL, and the main process's own prefetcher of a second dataset). Prints one line per epoch;
a worker that hangs makes the DataLoader raise after its 20 s timeout, and faulthandler dumps
every thread's stack if the whole run stalls."""

import faulthandler
import sys
import threading

import numpy as np
from torch.utils.data import DataLoader

from fastload import FastLoadDataset, Store

# Python's own hazard, not fastload's: a module still being imported by another thread when
# the process forks stays locked in the child. Nothing below imports once the threads start.
np.random.default_rng(0)


def main(path: str, epochs: int) -> None:
    faulthandler.dump_traceback_later(240, exit=True)
    store, stop = Store(path), threading.Event()
    picks = np.random.default_rng(1).integers(0, len(store), (64, 32))

    def gather_until_stopped() -> None:
        while not stop.is_set():
            for indices in picks:
                store.gather(indices)

    busy = threading.Thread(target=gather_until_stopped, daemon=True)
    busy.start()
    loader = DataLoader(FastLoadDataset(path, 16), batch_size=None, num_workers=2, timeout=20)
    in_process = iter(FastLoadDataset(path, 8, seed=7))  # its prefetch threads stay alive meanwhile
    for epoch in range(epochs):
        batches = sum(1 for _ in loader)
        next(in_process, None)
        print(epoch, batches, flush=True)
    stop.set()
    busy.join()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
