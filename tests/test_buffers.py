"""Batch buffer lifetime (`fastload.dataset.buffers`): no byte of a batch the user can still
reach is ever rewritten by the prefetcher, whatever way the batch is kept, and a batch whose
memory the user moved (shared memory, a torch.multiprocessing queue) is never written again."""

import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastload import FastLoadDataset, StoreWriter

RECORDS = 48


@pytest.fixture(scope="module")
def marked_store(tmp_path_factory):
    """Records whose every byte is their record number, so a batch's pixels name its records."""
    path = tmp_path_factory.mktemp("buffers") / "marked.bin"
    with StoreWriter(path, shape=(8, 8, 3), label_dtype="int64") as writer:
        for i in range(RECORDS):
            writer.append(np.full((8, 8, 3), i, np.uint8), i)
    return path


def _records_in(images) -> list:
    return torch.as_tensor(np.asarray(images)).reshape(len(images), -1)[:, 0].tolist()


def _torch_dlpack(images):
    return torch.from_dlpack(images)


def _numpy_dlpack(images):
    return np.from_dlpack(images)


def _storage(images):
    """Only the Python storage object, re-viewed as a batch when checked."""
    return (images.untyped_storage(), images.shape)


def _shared(images):
    return images.share_memory_()


def _pickled(images):
    return pickle.loads(pickle.dumps(images))


def _cloned_then_dropped(images):
    return images.clone()


KEEPERS = {
    "tensor": lambda images: images,
    "view": lambda images: images[:, 1:],
    "numpy": lambda images: images.numpy(),
    "torch_dlpack": _torch_dlpack,
    "numpy_dlpack": _numpy_dlpack,
    "storage": _storage,
    "share_memory_": _shared,
    "pickle": _pickled,
    "clone": _cloned_then_dropped,
}


def _as_batch(kept):
    if isinstance(kept, tuple):  # a storage object and the batch's shape
        storage, shape = kept
        return torch.empty(0, dtype=torch.uint8).set_(storage)[: int(np.prod(shape))].view(shape)
    return kept


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=st.lists(st.tuples(st.sampled_from(sorted(KEEPERS)), st.booleans()), min_size=1, max_size=14),
    batch_size=st.integers(1, 5),
    prefetch=st.integers(1, 3),
)
def test_a_batch_kept_any_way_keeps_its_bytes(marked_store, plan, batch_size, prefetch):
    """Over epochs, batches kept in every way a user can keep one (views, NumPy, DLPack, the
    storage alone, shared memory, pickling, a clone) keep the records they were yielded with,
    while the loop goes on and later batches are gathered."""
    ds = FastLoadDataset(marked_store, batch_size, prefetch=prefetch, seed=1)
    held = []
    steps = iter(plan * 50)
    for _ in range(2):
        for images, labels in ds:
            keeper, keep = next(steps, ("tensor", False))
            if keep:
                held.append((KEEPERS[keeper](images), labels.tolist(), keeper))
            assert _records_in(images) == labels.tolist()
            del images, labels
    for kept, expected, keeper in held:
        assert _records_in(_as_batch(kept)) == expected, keeper


def test_a_batch_moved_to_shared_memory_is_never_written_again(marked_store):
    """`share_memory_()` moves the batch and frees its old memory: the buffer is retired, so
    later batches carry their own pixels and nothing writes to freed memory (on main before
    this rule: old pixels under new labels, then heap corruption)."""
    ds = FastLoadDataset(marked_store, 3, shuffle=False, prefetch=2)
    recent = []
    for _ in range(3):
        for images, labels in ds:
            images.share_memory_()
            assert _records_in(images) == labels.tolist()
            recent = [*recent[-3:], (images, labels.tolist())]
    for images, expected in recent:
        assert _records_in(images) == expected


def test_a_batch_kept_only_through_its_storage_is_not_overwritten(marked_store):
    ds = FastLoadDataset(marked_store, 4, shuffle=False, prefetch=2)
    kept = [(images.untyped_storage(), images.shape, labels.tolist()) for images, labels in ds]
    for storage, shape, expected in kept:
        assert _records_in(_as_batch((storage, shape))) == expected


CONSUMER = """
import sys
import numpy as np
import torch
import torch.multiprocessing as mp
from fastload import FastLoadDataset


def consume(queue, results):
    bad = 0
    while True:
        item = queue.get()
        if item is None:
            break
        images, labels = item
        if images.reshape(len(images), -1)[:, 0].tolist() != labels.tolist():
            bad += 1
    results.put(bad)


if __name__ == "__main__":
    context = mp.get_context(sys.argv[2])
    queue, results = context.Queue(), context.Queue()
    consumer = context.Process(target=consume, args=(queue, results))
    consumer.start()
    bad = 0
    ds = FastLoadDataset(sys.argv[1], 3, shuffle=False, prefetch=2)
    for _ in range(4):
        for k, (images, labels) in enumerate(ds):
            if images.reshape(len(images), -1)[:, 0].tolist() != labels.tolist():
                bad += 1
            if k % 10 == 0:
                queue.put((images, labels))
    queue.put(None)
    consumer_bad = results.get(timeout=60)
    consumer.join(timeout=60)
    print("bad", bad, consumer_bad)
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_batches_sent_through_a_torch_multiprocessing_queue(marked_store, tmp_path, start_method):
    """Every 10th batch goes to a consumer process through a torch.multiprocessing queue (which
    moves it into shared memory): the producer's later batches and the consumer's batches all
    carry their own records, and neither process crashes."""
    script = tmp_path / "consumer.py"
    script.write_text(textwrap.dedent(CONSUMER))
    done = subprocess.run(
        [sys.executable, str(script), str(marked_store), start_method],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["bad", "0", "0"], done.stdout
