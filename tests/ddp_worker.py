"""Run by tests/test_distributed.py under torchrun: one rank of a DDP job fed by FastLoadDataset.

Writes what this rank saw (record numbers per batch, per mode) and its trained weights as JSON.
"""

import json
import sys

import torch
import torch.distributed as dist
from peer_deadlines import PEER_TIMEOUT, dump_stacks_if_stalled, loader_timeout
from torch.utils.data import DataLoader

from fastload import FastLoadDataset, to_device


def seen(ds, num_workers):
    return [
        batch[2].tolist()
        for batch in DataLoader(
            ds, batch_size=None, num_workers=num_workers, timeout=loader_timeout(num_workers)
        )
    ]


def main(store_path, out_prefix):
    dump_stacks_if_stalled()
    dist.init_process_group("gloo", timeout=PEER_TIMEOUT)
    rank = dist.get_rank()
    report = {"rank": rank, "world_size": dist.get_world_size()}
    for drop_last in (False, True):
        ds = FastLoadDataset(store_path, 8, drop_last=drop_last, return_indices=True)
        report[f"len drop_last={drop_last}"] = len(ds)
        report[f"batches drop_last={drop_last}"] = seen(ds, 0)
    ds = FastLoadDataset(store_path, 8, return_indices=True)
    ds.set_epoch(0)
    report["batches workers=2"] = seen(ds, 2)

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4 * 3 * 3, 1).double())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train = FastLoadDataset(store_path, 8, seed=1)
    steps = 0
    for epoch in range(2):
        train.set_epoch(epoch)
        for images, labels in DataLoader(train, batch_size=None):
            x = to_device(images, "cpu", dtype=torch.float64).flatten(1)
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), labels.double() / 1000)
            optimizer.zero_grad()
            loss.backward()  # all-reduces gradients: hangs if ranks ran unequal batch counts
            optimizer.step()
            steps += 1
    report["steps"] = steps
    report["weights"] = [p.detach().flatten().tolist() for p in model.parameters()]
    dist.barrier()
    dist.destroy_process_group()
    with open(f"{out_prefix}.{rank}.json", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
