"""What the tests of `fastload.train` (tests/train/) share: a 200-record store whose label is
each image's brightness (`store_path`, a module fixture wherever a test module imports it), the
options that keep a run fast on two busy cores, and a disk that fills during a `torch.save`
(used by tests/monotonic/test_persistence.py too)."""

from __future__ import annotations

import errno
import hashlib
import io
import math
import os

import numpy as np
import pytest
import torch

from fastload import cli
from fastload.store import StoreWriter

COUNT, SIDE = 200, 16

# One intra-op thread: the model is tiny, and on a busy 2-core machine every OpenMP region
# otherwise waits for a descheduled thread (tens of times slower).
FAST = dict(batch_size=16, lr=3e-2, device="cpu", threads=1)


STEPS_PER_EPOCH = math.ceil(180 / 16)  # 10% of the 200 records are held out for validation


ONE_STEP = dict(epochs=1, max_steps=1, **FAST)


def images_and_labels(seed: int = 0, count: int = COUNT, side: int = SIDE):
    rng = np.random.default_rng(seed)
    gain = rng.uniform(0.1, 1.0, count)
    images = (rng.uniform(0, 255, (count, side, side, 3)) * gain[:, None, None, None]).astype(np.uint8)
    return images, images.reshape(count, -1).mean(1) / 255.0  # label: mean brightness


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("train") / "bright.fastload"
    images, labels = images_and_labels()
    with StoreWriter(path, (SIDE, SIDE, 3)) as writer:
        writer.extend(images, labels)
    return path


@pytest.fixture(scope="module")
def exposure_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("inputs") / "exposure.npy"
    np.save(path, np.random.default_rng(1).uniform(0, 1, COUNT))
    return path


def parameter_copies(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


class FullDisk(io.RawIOBase):
    """A file on a disk that fills after ``room`` bytes: later writes raise ENOSPC, as the
    kernel's write does."""

    def __init__(self, file, room: int):
        self.file, self.room = file, room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)


def disk_full_at(monkeypatch, call: int) -> None:
    """The real torch.save, whose ``call``-th file (counting from 1) fills the disk midway."""
    real, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) != call:
            return real(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)):  # torch.save given a path opens it itself
            with open(f, "wb") as file:
                return real(obj, FullDisk(file, 1000), *args, **kwargs)
        return real(obj, FullDisk(f, 1000), *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


# A folder that takes no new file, even for root: sysfs refuses it (EACCES, or EROFS read-only).
UNWRITABLE_DIR = "/sys"


def run_cli(argv, capsys):
    """(exit status, stderr, stdout) of `fastload` with ``argv``, usage errors (SystemExit) included."""
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, err, out


def train_argv(store, *extra):
    return ["train", os.fspath(store), "--device", "cpu", "--threads", "1", "--batch-size", "16", *extra]
