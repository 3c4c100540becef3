"""Every public function and CLI command given a plain user mistake answers with a clear
exception naming the problem (or a message and a non-zero exit status), never a crash.

Each row here is a row of the bad-input table in docs/RELIABILITY.md."""

import os
import re
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

from fastload import Augment, Store, StoreError, StoreWriter
from fastload.dataset import FastLoadDataset, split_indices
from fastload.device import DeviceLoader, to_device
from fastload.inspect import device_plan, info, verify
from fastload.pack import pack
from fastload.preview import save_preview

AS_ROOT = os.geteuid() == 0


class Files:
    """Paths a user might pass by mistake, beside a valid 5-record 4×4×3 store and an empty folder."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.store = tmp_path / "s.fastload"
        with StoreWriter(self.store, (4, 4, 3)) as w:
            w.extend(np.zeros((5, 4, 4, 3), np.uint8), np.arange(5.0))
        self.missing = tmp_path / "missing.fastload"
        self.empty = tmp_path / "empty.fastload"
        self.empty.write_bytes(b"")
        self.text = tmp_path / "notes.txt"
        self.text.write_text("not a store\n" * 1000)
        self.fifo = tmp_path / "fifo"
        os.mkfifo(self.fifo)
        self.locked = tmp_path / "locked.fastload"
        self.locked.write_bytes(self.store.read_bytes())
        self.locked.chmod(0)
        self.new = tmp_path / "new.fastload"
        self.folder = tmp_path / "folder"
        self.folder.mkdir()

    @property
    def images(self):
        """A folder of two tiny class-labelled images, made on first use."""
        from PIL import Image

        folder = self.dir / "images"
        if not folder.exists():
            for name in ("cat", "dog"):
                (folder / name).mkdir(parents=True)
                Image.new("RGB", (8, 8)).save(folder / name / "0.png")
        return folder

    @property
    def zero(self):
        """A copy of /dev/zero (a character device: mknod needs root)."""
        if not AS_ROOT:
            pytest.skip("mknod of a character device needs root")
        path = self.dir / "zero"
        if not path.exists():
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))
        return path

    @property
    def deep(self):
        """A JSON file nested 100,000 levels deep."""
        path = self.dir / "deep.json"
        path.write_text("[" * 100_000 + "]" * 100_000)
        return path

    @property
    def big(self):
        """A 2 MiB runs file (sparse)."""
        path = self.dir / "big.json"
        with open(path, "wb") as f:
            f.truncate(2 << 20)
        return path

    def csv(self, text):
        path = self.dir / "labels.csv"
        path.write_text(text + "\n")
        return path

    def writer(self):
        return StoreWriter(self.new, (2, 2, 3), label_dtype="int64")

    def opened(self):
        return Store(self.store)

    def closed(self):
        s = Store(self.store)
        s.close()
        return s


IMG = np.zeros((2, 2, 3), np.uint8)
BIG = 10**26  # beyond any machine word


def fit(*args, **kwargs):
    from fastload.train import fit

    return fit(*args, **kwargs)


def fit_many(*args, **kwargs):
    from fastload.train import fit_many

    return fit_many(*args, **kwargs)


def read_runs_file(path):
    from fastload.train import read_runs_file

    return read_runs_file(path)


def bench_run(**kwargs):
    from fastload import bench

    return bench.run(**kwargs)


def demo_run(**kwargs):
    from fastload.demo import run

    return run(**kwargs)


# (what the user does, call, exception, fragment of the message)
ROWS = [
    # Store(path)
    ("Store(None)", lambda f: Store(None), TypeError, "str or os.PathLike"),
    ("Store(b'bytes path')", lambda f: Store(b"/tmp"), TypeError, "str or os.PathLike"),
    ("Store(missing path)", lambda f: Store(f.missing), StoreError, "No such file"),
    ("Store(directory)", lambda f: Store(f.dir), StoreError, "not a regular file"),
    ("Store(empty file)", lambda f: Store(f.empty), StoreError, "truncated"),
    ("Store(/dev/null)", lambda f: Store("/dev/null"), StoreError, "not a regular file"),
    ("Store(FIFO)", lambda f: Store(f.fifo), StoreError, "not a regular file"),
    ("Store(text file)", lambda f: Store(f.text), StoreError, "magic"),
    ("Store(file without read permission)", lambda f: Store(f.locked), StoreError, "Permission denied"),
    # store[i]
    ("store[5] of 5 records", lambda f: f.opened()[5], IndexError, "out of range"),
    ("store[-6] of 5 records", lambda f: f.opened()[-6], IndexError, "out of range"),
    ("store[2**64 - 1]", lambda f: f.opened()[2**64 - 1], IndexError, "out of range"),
    ("store[1.0]", lambda f: f.opened()[1.0], TypeError, "integers"),
    ("store['a']", lambda f: f.opened()["a"], TypeError, "integers"),
    ("store[True]", lambda f: f.opened()[True], TypeError, "integers"),
    ("store[1:3]", lambda f: f.opened()[1:3], TypeError, "integers"),
    # store.gather(indices, out, labels_out)
    ("gather([5])", lambda f: f.opened().gather([5]), IndexError, "out of range"),
    ("gather([2**64 - 1])", lambda f: f.opened().gather([2**64 - 1]), IndexError, "out of range"),
    ("gather([2**63])", lambda f: f.opened().gather([2**63]), IndexError, "out of range"),
    ("gather([2**70])", lambda f: f.opened().gather([2**70]), IndexError, "out of range"),
    (
        "gather(uint64 array [2**64 - 1])",
        lambda f: f.opened().gather(np.array([2**64 - 1], np.uint64)),
        IndexError,
        "out of range",
    ),
    ("gather([1.5])", lambda f: f.opened().gather([1.5]), TypeError, "integers"),
    ("gather([True])", lambda f: f.opened().gather([True]), TypeError, "integers"),
    ("gather(None)", lambda f: f.opened().gather(None), TypeError, "integers"),
    ("gather('abc')", lambda f: f.opened().gather("abc"), TypeError, "integers"),
    ("gather(3) (a scalar)", lambda f: f.opened().gather(3), ValueError, "one-dimensional"),
    ("gather([[1]])", lambda f: f.opened().gather([[1]]), ValueError, "one-dimensional"),
    (
        "gather(out=list)",
        lambda f: f.opened().gather([1], out=[0]),
        TypeError,
        "NumPy array or a torch tensor",
    ),
    (
        "gather(out=float32 array)",
        lambda f: f.opened().gather([1], out=np.zeros((1, 4, 4, 3), np.float32)),
        TypeError,
        "uint8",
    ),
    (
        "gather(out=wrong shape)",
        lambda f: f.opened().gather([1], out=np.zeros((2, 4, 4, 3), np.uint8)),
        ValueError,
        "shape",
    ),
    (
        "gather(out=non-contiguous)",
        lambda f: f.opened().gather([1], out=np.zeros((1, 4, 8, 3), np.uint8)[:, :, ::2]),
        ValueError,
        "contiguous",
    ),
    (
        "gather(out=read-only view)",
        lambda f: f.opened().gather([1], out=f.opened().images[:1]),
        ValueError,
        "writable",
    ),
    (
        "gather(out=tensor on another device)",
        lambda f: f.opened().gather([1], out=torch.zeros((1, 4, 4, 3), dtype=torch.uint8, device="meta")),
        ValueError,
        "CPU tensor",
    ),
    (
        "gather(out=tensor requiring grad)",
        lambda f: f.opened().gather([1], out=torch.zeros((1, 4, 4, 3), requires_grad=True)),
        ValueError,
        "grad",
    ),
    (
        "gather(labels_out=int64 for float64 labels)",
        lambda f: f.opened().gather([1], labels_out=np.zeros(1, np.int64)),
        TypeError,
        "float64",
    ),
    ("will_need([9])", lambda f: f.opened().will_need([9]), IndexError, "out of range"),
    ("will_need(['a'])", lambda f: f.opened().will_need(["a"]), TypeError, "integers"),
    # a closed store
    ("closed store.gather", lambda f: f.closed().gather([0]), ValueError, "closed"),
    ("closed store.images", lambda f: f.closed().images, ValueError, "closed"),
    ("closed store[0]", lambda f: f.closed()[0], ValueError, "closed"),
    ("closed store.verify()", lambda f: f.closed().verify(), ValueError, "closed"),
    # StoreWriter(path, shape, label_dtype, meta)
    ("StoreWriter(None, ...)", lambda f: StoreWriter(None, (2, 2, 3)), TypeError, "str or os.PathLike"),
    ("StoreWriter('', ...)", lambda f: StoreWriter("", (2, 2, 3)), ValueError, "not a file path"),
    ("StoreWriter(directory, ...)", lambda f: StoreWriter(f.dir, (2, 2, 3)), ValueError, "is a directory"),
    (
        "StoreWriter(existing store, ...)",
        lambda f: StoreWriter(f.store, (2, 2, 3)),
        FileExistsError,
        "overwrite",
    ),
    (
        "StoreWriter(path in a missing folder, ...)",
        lambda f: StoreWriter(f.dir / "no" / "x", (2, 2, 3)),
        StoreError,
        "cannot create a temporary file beside it: No such file",
    ),
    (
        "StoreWriter(path under a file, ...)",
        lambda f: StoreWriter(f.store / "x", (2, 2, 3)),
        StoreError,
        "Not a directory",
    ),
    (
        "StoreWriter(path in a folder without write access: /sys)",
        lambda f: StoreWriter("/sys/x.fastload", (2, 2, 3)),
        StoreError,
        "cannot create a temporary file",
    ),
    ("StoreWriter(shape=5)", lambda f: StoreWriter(f.new, 5), TypeError, "not iterable"),
    ("StoreWriter(shape=(2, 2, 2))", lambda f: StoreWriter(f.new, (2, 2, 2)), ValueError, "channels"),
    ("StoreWriter(shape=(0, 2, 3))", lambda f: StoreWriter(f.new, (0, 2, 3)), ValueError, "positive"),
    ("StoreWriter(shape=(-1, 2, 3))", lambda f: StoreWriter(f.new, (-1, 2, 3)), ValueError, "positive"),
    ("StoreWriter(shape=(2**32, 2, 3))", lambda f: StoreWriter(f.new, (2**32, 2, 3)), ValueError, "positive"),
    (
        "StoreWriter(shape=(2.0, 2, 3))",
        lambda f: StoreWriter(f.new, (2.0, 2, 3)),
        ValueError,
        "height, width, channels",
    ),
    (
        "StoreWriter(shape=(True, True, 3))",
        lambda f: StoreWriter(f.new, (True, True, 3)),
        ValueError,
        "height, width, channels",
    ),
    (
        "StoreWriter(shape=(2, 2, 3, 1))",
        lambda f: StoreWriter(f.new, (2, 2, 3, 1)),
        ValueError,
        "height, width, channels",
    ),
    (
        "StoreWriter(label_dtype='int32')",
        lambda f: StoreWriter(f.new, (2, 2, 3), label_dtype="int32"),
        ValueError,
        "label_dtype",
    ),
    (
        "StoreWriter(meta=[1])",
        lambda f: StoreWriter(f.new, (2, 2, 3), meta=[1]),
        TypeError,
        "meta must be a dict, not list",
    ),
    (
        "StoreWriter(meta={'a': object()})",
        lambda f: StoreWriter(f.new, (2, 2, 3), meta={"a": object()}),
        TypeError,
        "JSON serializable",
    ),
    (
        "StoreWriter(meta={'class_names': ['cat', 'cat', '7']})",
        lambda f: StoreWriter(
            f.new, (2, 2, 3), label_dtype="int64", meta={"class_names": ["cat", "cat", "7"]}
        ),
        ValueError,
        "one name to several classes",
    ),
    # writer.append / extend / commit
    (
        "append(float32 image)",
        lambda f: f.writer().append(np.zeros((2, 2, 3), np.float32), 1),
        TypeError,
        "uint8",
    ),
    (
        "append(image of another shape)",
        lambda f: f.writer().append(np.zeros((2, 3, 3), np.uint8), 1),
        ValueError,
        "does not match",
    ),
    ("append(None, 1)", lambda f: f.writer().append(None, 1), TypeError, "uint8"),
    ("append(image, 'a')", lambda f: f.writer().append(IMG, "a"), TypeError, "numbers"),
    ("append(image, None)", lambda f: f.writer().append(IMG, None), TypeError, "numbers"),
    ("append(image, True)", lambda f: f.writer().append(IMG, True), TypeError, "numbers"),
    ("append(image, [1, 2])", lambda f: f.writer().append(IMG, [1, 2]), ValueError, "one number"),
    (
        "append(image, 1.5) to int64 labels",
        lambda f: f.writer().append(IMG, 1.5),
        ValueError,
        "whole numbers",
    ),
    (
        "append(image, nan) to int64 labels",
        lambda f: f.writer().append(IMG, float("nan")),
        ValueError,
        "whole numbers",
    ),
    (
        "append(image, 1e30) to int64 labels",
        lambda f: f.writer().append(IMG, 1e30),
        ValueError,
        "int64 range",
    ),
    (
        "append(image, 2**63) to int64 labels",
        lambda f: f.writer().append(IMG, 2**63),
        ValueError,
        "int64 range",
    ),
    (
        "extend(2 images, 1 label)",
        lambda f: f.writer().extend(np.zeros((2, 2, 2, 3), np.uint8), [1]),
        ValueError,
        "labels of shape",
    ),
    (
        "extend(images, 2-D labels)",
        lambda f: f.writer().extend(np.zeros((2, 2, 2, 3), np.uint8), [[1], [2]]),
        ValueError,
        "labels of shape",
    ),
    ("extend([], [])", lambda f: f.writer().extend([], []), TypeError, "uint8"),
    ("commit() twice", lambda f: [w.commit() for w in [f.writer()] * 2], ValueError, "already committed"),
    (
        "append after commit",
        lambda f: [w.commit() and w.append(IMG, 1) for w in [f.writer()]],
        ValueError,
        "already committed",
    ),
    # fastload.inspect.info / verify
    ("info(missing path)", lambda f: info(f.missing), StoreError, "No such file"),
    ("info(None)", lambda f: info(None), TypeError, "str or os.PathLike"),
    ("verify(directory)", lambda f: verify(f.dir), StoreError, "not a regular file"),
    ("verify(text file)", lambda f: verify(f.text), StoreError, "magic"),
    # FastLoadDataset
    ("FastLoadDataset(None, 2)", lambda f: FastLoadDataset(None, 2), TypeError, "str or os.PathLike"),
    ("FastLoadDataset(missing path, 2)", lambda f: FastLoadDataset(f.missing, 2), StoreError, "No such file"),
    ("FastLoadDataset(directory, 2)", lambda f: FastLoadDataset(f.dir, 2), StoreError, "not a regular file"),
    ("FastLoadDataset(store, batch_size=0)", lambda f: FastLoadDataset(f.store, 0), ValueError, "batch_size"),
    (
        "FastLoadDataset(store, batch_size=2.0)",
        lambda f: FastLoadDataset(f.store, 2.0),
        ValueError,
        "batch_size",
    ),
    ("FastLoadDataset(order='x')", lambda f: FastLoadDataset(f.store, 2, order="x"), ValueError, "order"),
    (
        "FastLoadDataset(indices=[9]) of 5 records",
        lambda f: FastLoadDataset(f.store, 2, indices=[9]),
        IndexError,
        "out of range",
    ),
    (
        "FastLoadDataset(indices=[-1])",
        lambda f: FastLoadDataset(f.store, 2, indices=[-1]),
        IndexError,
        "out of range",
    ),
    (
        "FastLoadDataset(indices=[2**64 - 1])",
        lambda f: FastLoadDataset(f.store, 2, indices=[2**64 - 1]),
        IndexError,
        "out of range",
    ),
    (
        "FastLoadDataset(indices=[1.0])",
        lambda f: FastLoadDataset(f.store, 2, indices=[1.0]),
        TypeError,
        "integers",
    ),
    (
        "FastLoadDataset(rank=3, world_size=2)",
        lambda f: FastLoadDataset(f.store, 2, rank=3, world_size=2),
        ValueError,
        "rank",
    ),
    (
        "FastLoadDataset(world_size=0)",
        lambda f: FastLoadDataset(f.store, 2, rank=0, world_size=0),
        ValueError,
        "world_size",
    ),
    (
        "FastLoadDataset(prefetch=0)",
        lambda f: FastLoadDataset(f.store, 2, prefetch=0),
        ValueError,
        "prefetch",
    ),
    ("FastLoadDataset(seed=-1)", lambda f: FastLoadDataset(f.store, 2, seed=-1), ValueError, "seed"),
    ("dataset.set_epoch(-1)", lambda f: FastLoadDataset(f.store, 2).set_epoch(-1), ValueError, "epoch"),
    ("dataset.set_epoch(2**63)", lambda f: FastLoadDataset(f.store, 2).set_epoch(2**63), ValueError, "epoch"),
    (
        "dataset.load_state_dict({})",
        lambda f: FastLoadDataset(f.store, 2).load_state_dict({}),
        ValueError,
        "the dataset state is missing ['epoch', 'position', 'seed']",
    ),
    (
        "dataset.load_state_dict(None)",
        lambda f: FastLoadDataset(f.store, 2).load_state_dict(None),
        TypeError,
        "state must be a dict from state_dict(), not NoneType",
    ),
    (
        "dataset.load_state_dict(position beyond the epoch)",
        lambda f: FastLoadDataset(f.store, 2).load_state_dict({"seed": 0, "epoch": 0, "position": 99}),
        ValueError,
        "beyond",
    ),
    # to_device
    (
        "to_device(NumPy array)",
        lambda f: to_device(np.zeros((1, 2, 2, 3), np.uint8), "cpu"),
        TypeError,
        "uint8 tensor",
    ),
    (
        "to_device(float tensor)",
        lambda f: to_device(torch.zeros((1, 2, 2, 3)), "cpu"),
        TypeError,
        "uint8 tensor",
    ),
    (
        "to_device(3-D tensor)",
        lambda f: to_device(torch.zeros((2, 2, 3), dtype=torch.uint8), "cpu"),
        TypeError,
        "uint8 tensor",
    ),
    (
        "to_device(dtype=torch.int32)",
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "cpu", dtype=torch.int32),
        TypeError,
        "floating-point",
    ),
    (
        "to_device(mean of 2 values for 3 channels)",
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "cpu", mean=[1, 2]),
        ValueError,
        "mean",
    ),
    (
        "to_device(std with a zero)",
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "cpu", std=[0, 1, 1]),
        ValueError,
        "std",
    ),
    (
        'to_device(dtype="float64x")',
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "cpu", dtype="float64x"),
        TypeError,
        "floating-point",
    ),
    (
        "to_device(unknown device)",
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "nodevice"),
        RuntimeError,
        "device",
    ),
    (
        "to_device(mean=NaN)",
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "cpu", mean=float("nan")),
        ValueError,
        "mean must be finite",
    ),
    (
        "to_device(std with an infinity)",
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "cpu", std=[1, float("inf"), 1]),
        ValueError,
        "std must be finite",
    ),
    (
        "to_device(std=-0.2)",
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "cpu", std=-0.2),
        ValueError,
        "std must be positive",
    ),
    (
        "to_device(float16, std=1e-6)",
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "cpu", torch.float16, std=1e-6),
        ValueError,
        "range",
    ),
    (
        "to_device(epoch=-1)",
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "cpu", epoch=-1),
        ValueError,
        "epoch",
    ),
    # DeviceLoader
    ("DeviceLoader(3, 'cpu')", lambda f: DeviceLoader(3, "cpu"), TypeError, "source"),
    ("DeviceLoader(depth=0)", lambda f: DeviceLoader([], "cpu", depth=0), ValueError, "depth"),
    ("DeviceLoader(std=NaN)", lambda f: DeviceLoader([], "cpu", std=float("nan")), ValueError, "std"),
    ("DeviceLoader(device='gpu0')", lambda f: DeviceLoader([], "gpu0"), ValueError, "device"),
    # pack
    ("pack(None, dest)", lambda f: pack(None, f.new), TypeError, "str or os.PathLike"),
    ("pack(missing folder, dest)", lambda f: pack(f.missing, f.new), FileNotFoundError, "no such folder"),
    ("pack(a file, dest)", lambda f: pack(f.text, f.new), NotADirectoryError, "not a folder"),
    ("pack(empty folder, dest)", lambda f: pack(f.folder, f.new), ValueError, "no images found"),
    ("pack(src, None)", lambda f: pack(f.images, None), TypeError, "str or os.PathLike"),
    (
        "pack(src, dest inside src)",
        lambda f: pack(f.images, f.images / "x.fastload"),
        ValueError,
        "inside the source folder",
    ),
    ("pack(src, existing store)", lambda f: pack(f.images, f.store), FileExistsError, "overwrite"),
    ("pack(src, existing directory)", lambda f: pack(f.images, f.folder), ValueError, "is a directory"),
    (
        "pack(src, path in a missing folder)",
        lambda f: pack(f.images, f.dir / "no" / "x"),
        StoreError,
        "No such file",
    ),
    ("pack(size=0)", lambda f: pack(f.images, f.new, size=0), ValueError, "size"),
    ("pack(size=2.5)", lambda f: pack(f.images, f.new, size=2.5), ValueError, "size"),
    ("pack(progress=5)", lambda f: pack(f.images, f.new, progress=5), TypeError, "progress"),
    ("pack(size=100000)", lambda f: pack(f.images, f.new, size=100000), ValueError, "size"),
    ("pack(size=(1, 2, 3))", lambda f: pack(f.images, f.new, size=(1, 2, 3)), ValueError, "size"),
    ("pack(resize='x')", lambda f: pack(f.images, f.new, resize="x"), ValueError, "resize"),
    ("pack(fill=300)", lambda f: pack(f.images, f.new, fill=300), ValueError, "fill"),
    (
        "pack(labels=missing CSV)",
        lambda f: pack(f.images, f.new, labels=f.missing),
        FileNotFoundError,
        "No such file",
    ),
    (
        "pack(labels=CSV naming a missing image)",
        lambda f: pack(f.images, f.new, labels=f.csv("x.png,1")),
        ValueError,
        "does not exist",
    ),
    (
        "pack(label_dtype='int8')",
        lambda f: pack(f.images, f.new, label_dtype="int8"),
        ValueError,
        "label_dtype",
    ),
    ("pack(workers=0)", lambda f: pack(f.images, f.new, workers=0), ValueError, "workers"),
    # Augment, save_preview
    (
        "Augment(brightness=inf)",
        lambda f: Augment(brightness=float("inf")),
        ValueError,
        "brightness must be a finite",
    ),
    ("Augment(hflip=nan)", lambda f: Augment(hflip=float("nan")), ValueError, "hflip must be a finite"),
    (
        "Augment(scale=(nan, 1))",
        lambda f: Augment(scale=(float("nan"), 1)),
        ValueError,
        "scale must be a finite",
    ),
    ("Augment(brightness=1e39)", lambda f: Augment(brightness=1e39), ValueError, "between 0 and 100"),
    ("Augment(hflip='0.5')", lambda f: Augment(hflip="0.5"), ValueError, "hflip must be a number"),
    ("Augment(size=True)", lambda f: Augment(size=True), ValueError, "size must be a positive int"),
    ("Augment(seed=True)", lambda f: Augment(seed=True), ValueError, "seed must be a non-negative int"),
    (
        "Augment().apply(scale=inf)",
        lambda f: Augment().apply(
            torch.zeros((1, 2, 2, 3), dtype=torch.uint8), [0], 0, scale=torch.full((1, 3, 1, 1), float("inf"))
        ),
        ValueError,
        "not finite",
    ),
    (
        "to_device(CPU float32, std=[1e-41])",
        lambda f: to_device(torch.zeros((1, 2, 2, 3), dtype=torch.uint8), "cpu", std=[1e-41]),
        ValueError,
        "std",
    ),
    (
        "save_preview(records=nan)",
        lambda f: save_preview(f.store, f.new, Augment(), records=float("nan")),
        ValueError,
        "records must be an int",
    ),
    (
        "save_preview(epochs=True)",
        lambda f: save_preview(f.store, f.new, Augment(), epochs=True),
        ValueError,
        "epochs must be an int",
    ),
    (
        "pack(workers=10**26)",
        lambda f: pack(f.images, f.new, workers=BIG),
        ValueError,
        "workers must be between 1",
    ),
    ("pack(labels='')", lambda f: pack(f.images, f.new, labels=""), ValueError, "labels is an empty path"),
    (
        "pack(labels=a directory)",
        lambda f: pack(f.images, f.new, labels=f.folder),
        ValueError,
        "not a regular file (a directory)",
    ),
    # train and the other commands' API
    ("fit(seed=10**26)", lambda f: fit(f.store, seed=BIG), ValueError, "seed must be between 0 and"),
    (
        "fit(data_seed=-1)",
        lambda f: fit(f.store, data_seed=-1),
        ValueError,
        "data_seed must be between 0 and",
    ),
    (
        "fit_many(runs=[{'seed': 10**26}])",
        lambda f: fit_many(f.store, [{"seed": BIG}]),
        ValueError,
        "seed must be between 0 and",
    ),
    (
        "read_runs_file(a copy of /dev/zero)",
        lambda f: read_runs_file(f.zero),
        ValueError,
        "not a regular file (a character device)",
    ),
    (
        "read_runs_file(JSON nested 100,000 deep)",
        lambda f: read_runs_file(f.deep),
        ValueError,
        "nested too deeply",
    ),
    ("read_runs_file(a 2 MiB file)", lambda f: read_runs_file(f.big), ValueError, "over the 1 MiB limit"),
    ("read_runs_file(a directory)", lambda f: read_runs_file(f.folder), ValueError, "not a regular file"),
    ("Augment(size=10**26)", lambda f: Augment(size=BIG), ValueError, "size must be a positive int"),
    (
        "save_preview(epochs=10**26)",
        lambda f: save_preview(f.store, f.dir / "p.png", Augment(), epochs=BIG),
        ValueError,
        "between 1 and 256",
    ),
    (
        "demo.run(seed=10**26)",
        lambda f: demo_run(seed=BIG, quick=True, quiet=True),
        ValueError,
        "seed must be between 0 and",
    ),
    (
        "demo.run(images=10**26)",
        lambda f: demo_run(images=BIG, quiet=True),
        ValueError,
        "images must be between",
    ),
    (
        "device_plan(1 record of 0 bytes)",
        lambda f: device_plan(1, 0, torch.device("cpu")),
        ValueError,
        "record_bytes >= 1 and reserve_bytes >= 0, not 1, 0 and",
    ),
    (
        "device_plan(reserve_bytes=nan)",
        lambda f: device_plan(1, 10, torch.device("cpu"), reserve_bytes=float("nan")),
        ValueError,
        "not 1, 10 and nan",
    ),
    (
        "bench.run(size_gb=inf)",
        lambda f: bench_run(size_gb=float("inf"), quick=True),
        ValueError,
        "size_gb must be a finite number of GB above 0, not inf",
    ),
    (
        "bench.run(size_gb=1e30)",
        lambda f: bench_run(size_gb=1e30, quick=True),
        ValueError,
        "GB free in",
    ),
    (
        "bench.run(images=5, size=3037000500)",
        lambda f: bench_run(quick=True, images=5, size=3_037_000_500),
        ValueError,
        "size must be between 1 and 65535 pixels (as pack takes), not 3037000500",
    ),
    # split_indices
    ("split_indices(-1, 0.1)", lambda f: split_indices(-1, 0.1), ValueError, "n must be"),
    ("split_indices(10, 2.0)", lambda f: split_indices(10, 2.0), ValueError, "val_fraction"),
    ("split_indices(10, nan)", lambda f: split_indices(10, float("nan")), ValueError, "val_fraction"),
    ("split_indices(missing path, 0.1)", lambda f: split_indices(f.missing, 0.1), StoreError, "No such file"),
]

NEEDS_NON_ROOT = {"Store(file without read permission)"}


@pytest.fixture
def files(tmp_path):
    return Files(tmp_path)


@pytest.mark.parametrize("call,error,fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_raises_a_clear_error(request, files, call, error, fragment):
    if request.node.callspec.id in NEEDS_NON_ROOT and AS_ROOT:
        pytest.skip("root ignores file permissions")
    with pytest.raises(error) as info_:
        call(files)
    assert fragment in str(info_.value)


def test_rows_name_distinct_inputs():
    names = [r[0] for r in ROWS]
    assert len(names) == len(set(names))


def test_a_failed_call_leaves_no_partial_file(files):
    with pytest.raises(ValueError):
        files.writer().append(IMG, 1.5)
    import gc

    gc.collect()
    assert sorted(p.name for p in files.dir.iterdir() if "partial" in p.name) == []


# (arguments of `python -m fastload`, exit status, fragment of stderr)
CLI_ROWS = [
    (["info", "{missing}"], 1, "No such file"),
    (["info", "{dir}"], 1, "not a regular file"),
    (["info", "{empty}"], 1, "truncated"),
    (["info", "{fifo}"], 1, "not a regular file"),
    (["info", "/dev/null"], 1, "not a regular file"),
    (["info", "{text}"], 1, "magic"),
    (["verify", "{missing}"], 1, "No such file"),
    (["verify", "{text}"], 1, "magic"),
    (["verify", "{dir}"], 1, "not a regular file"),
    (["pack", "{missing}", "{new}"], 1, "no such folder"),
    (["pack", "{images}", "{store}"], 1, "already exists"),
    (["pack", "{images}", "{dir}/no/x.fastload"], 1, "No such file"),
    (["pack", "{images}", "{new}", "--size", "0"], 2, "--size"),
    (["pack", "{images}", "{new}", "--fill", "red"], 2, "--fill"),
    (["train", "{missing}"], 1, "No such file"),
    (["bench", "{missing}", "--quick"], 1, "No such file"),
    (["demo", "--images", "-5", "--quick"], 1, "images must be"),
    (["demo", "--seed", str(BIG), "--quick"], 1, "seed must be between 0 and"),
    (["train", "{store}", "--runs-file", "{zero}"], 1, "not a regular file (a character device)"),
    (["train", "{store}", "--runs-file", "{deep}"], 1, "nested too deeply"),
    (["train", "{store}", "--seed", str(BIG)], 2, "argument --seed: must be between 0 and"),
    (["train", "{store}", "--runs", "2", "--seed", f"1,{BIG}"], 2, "argument --seed: must be between 0 and"),
    (
        ["train", "{store}", "--runs", "2", "--data-seed", str(BIG)],
        2,
        "argument --data-seed: must be between",
    ),
    (["pack", "{images}", "{new}", "--labels", ""], 1, "labels is an empty path"),
    (["pack", "{images}", "{new}", "--labels", "{folder}"], 1, "not a regular file (a directory)"),
    (["pack", "{images}", "{new}", "--workers", str(BIG)], 1, "workers must be between 1 and"),
    (
        ["augment-preview", "{store}", "-o", "{dir}/p.png", "--size", str(BIG)],
        1,
        "size must be a positive int",
    ),
    (["augment-preview", "{store}", "-o", "{dir}/p.png", "--epochs", str(BIG)], 1, "between 1 and 256"),
    (["bench", "--quick", "--size-gb", "inf"], 1, "size_gb must be a finite number of GB above 0, not inf"),
    (["bench", "--quick", "--size-gb", "nan"], 1, "size_gb must be a finite number of GB above 0, not nan"),
    (
        ["bench", "--quick", "--only", "memcpy", "--images", "5", "--size", "3037000500"],
        1,
        "size must be between 1 and 65535 pixels",
    ),
    ([], 2, "usage"),
    (["nosuchcommand"], 2, "invalid choice"),
    (["info"], 2, "required"),
    (["verify", "a", "b"], 2, "unrecognized arguments"),
]


def run_cli(args):
    return subprocess.run(
        [sys.executable, "-m", "fastload", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("args,status,fragment", CLI_ROWS, ids=[" ".join(r[0]) or "(none)" for r in CLI_ROWS])
def test_cli_bad_input_exits_with_a_message(files, args, status, fragment):
    paths = {name: getattr(files, name) for arg in args for name in re.findall(r"{(\w+)}", arg)}
    result = run_cli([a.format(**paths) for a in args])
    assert result.returncode == status, result.stderr
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr


def test_a_verify_limit_beyond_a_machine_word_lists_every_record(files):
    """`--limit 10**26` asks for every damaged record, not an OverflowError traceback."""
    assert len(verify(files.store, limit=BIG)) == 0
    result = run_cli(["verify", str(files.store), "--limit", str(BIG)])
    assert result.returncode == 0 and "every record matches" in result.stdout, result.stderr
