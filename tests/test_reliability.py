"""Hostile store files, damaged records, stores replaced or truncated under readers, and
many readers at once: every failure is a clean StoreError, nothing leaks, nothing crashes.
docs/RELIABILITY.md states the guarantees these tests check."""

import gc
import multiprocessing
import os
import queue
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
import torch

from fastload import Store, StoreError, StoreWriter
from fastload.dataset import FastLoadDataset
from fastload.inspect import info as info_store
from fastload.inspect import verify as verify_store

HEADER = 4096
SHAPE = (5, 7, 3)  # 105 bytes: records padded to a 128-byte stride


def pattern(n, shape=SHAPE, version=0):
    """Images whose bytes depend on (record, version, position), so any mix-up shows."""
    rng = np.random.default_rng(version)
    return rng.integers(0, 256, (n, *shape), dtype=np.uint8)


def write(path, n=6, shape=SHAPE, version=0, label_dtype="float64", overwrite=False):
    images = pattern(n, shape, version)
    labels = np.arange(n) + 1000 * version
    with StoreWriter(path, shape, label_dtype=label_dtype, overwrite=overwrite) as w:
        w.extend(images, labels)
    return images, labels


def sections(path):
    """{name: (offset, length)} of a store's sections, read from its header (docs/FORMAT.md)."""
    with open(path, "rb") as f:
        head = f.read(120)
    values = struct.unpack_from("<8Q", head, 48)
    names = ("images", "labels", "checksums", "meta")
    return {name: values[2 * k : 2 * k + 2] for k, name in enumerate(names)}


def patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def xor(path, offset, mask):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s.fastload"
    images, labels = write(path)
    return path, images, labels


def open_error(path):
    with pytest.raises(StoreError) as info:
        Store(path)
    message = str(info.value)
    assert str(path) in message
    return message


# ---------------------------------------------------------------- hostile store files


def expected_header_error(position):
    if position < 8:
        return "magic"
    if position < 12:
        return "version"
    return "checksum"


def test_every_header_byte_flip_is_rejected_by_the_failed_check(store):
    path = store[0]
    original = path.read_bytes()
    rng = np.random.default_rng(1)
    masks = {p: 0xFF for p in range(HEADER)}
    masks.update({p: int(rng.integers(1, 256)) for p in range(128)})
    for position, mask in masks.items():
        xor(path, position, mask)
        assert expected_header_error(position) in open_error(path), position
        xor(path, position, mask)
    assert path.read_bytes() == original
    assert Store(path).verify() == []


def test_truncation_at_every_section_boundary_is_rejected(store):
    path = store[0]
    size = path.stat().st_size
    cuts = {0, 1, 8, 120, HEADER - 1, HEADER, size - 1}
    for offset, length in sections(path).values():
        cuts |= {offset, offset + 1, offset + length, offset + length - 1}
    rng = np.random.default_rng(2)
    cuts |= set(rng.integers(0, size, 10).tolist())
    original = path.read_bytes()
    for cut in sorted(c for c in cuts if 0 <= c < size):
        path.write_bytes(original[:cut])
        message = open_error(path)
        assert "truncated" in message, (cut, message)
        if cut < HEADER:
            assert "shorter than the 4096-byte header" in message


@pytest.mark.parametrize("extra", [b"\0", b"x" * 63, bytes(range(256)) * 16], ids=["1", "63", "4096"])
def test_appended_bytes_are_rejected(store, extra):
    path = store[0]
    with open(path, "ab") as f:
        f.write(extra)
    assert "trailing bytes" in open_error(path)


def test_damaged_records_are_each_reported_and_intact_ones_are_not(tmp_path):
    path = tmp_path / "s.fastload"
    n = 40
    write(path, n=n)
    sec = sections(path)
    image_offset, stride = sec["images"][0], 128
    image_bytes = int(np.prod(SHAPE))
    rng = np.random.default_rng(3)
    damaged = set()
    for record in rng.choice(n, 12, replace=False).tolist():
        if rng.random() < 0.5:
            at = image_offset + record * stride + int(rng.integers(0, image_bytes))
        else:
            at = sec["labels"][0] + record * 8 + int(rng.integers(0, 8))
        xor(path, at, 1 << int(rng.integers(0, 8)))
        damaged.add(record)
    # Stride padding is not part of a record: damage there changes nothing a reader sees.
    xor(path, image_offset + 3 * stride + image_bytes + 5, 0xFF)
    with Store(path) as s:
        assert s.verify() == sorted(damaged)
    assert [i for i, _ in verify_store(path)] == sorted(damaged)
    result = subprocess.run(
        [sys.executable, "-m", "fastload", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    reported = [int(line.split()[2]) for line in result.stdout.splitlines() if line.startswith("damaged")]
    assert reported == sorted(damaged)
    assert f"{len(damaged)} damaged record(s)" in result.stderr


def test_damaged_metadata_is_rejected_when_no_longer_json(store):
    path = store[0]
    offset, length = sections(path)["meta"]
    patch(path, offset, b"[")
    assert "bad metadata" in open_error(path)
    patch(path, offset, b"\xff")
    assert "UTF-8" in open_error(path)


@pytest.mark.parametrize(
    "meta", [{"class_names": 5}, {"class_names": {"a": 1}}, {"sources": {"a": 1}}, {"sources": 7}]
)
def test_known_metadata_keys_of_the_wrong_type_are_ignored(tmp_path, meta):
    """Metadata is free-form JSON: `info` and `verify` must not trust its shape."""
    path = tmp_path / "s.fastload"
    with StoreWriter(path, SHAPE, label_dtype="int64", meta=meta) as w:
        w.extend(pattern(3), [0, 1, 2])
    xor(path, HEADER, 1)
    assert info_store(path)["labels"]["values"] == {"0": 1, "1": 1, "2": 1}  # no class names: numbers
    assert verify_store(path) == [(0, None)]
    for command in ("info", "verify"):
        result = subprocess.run(
            [sys.executable, "-m", "fastload", command, str(path)], capture_output=True, text=True, timeout=60
        )
        assert "Traceback" not in result.stderr
        assert result.returncode == (command == "verify")


def test_a_fifo_is_rejected_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = f"import fastload\ntry:\n    fastload.Store({str(fifo)!r})\nexcept fastload.StoreError as e:\n    print(e)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "not a regular file" in result.stdout


@pytest.mark.parametrize("target", ["dir", "empty", "/dev/null", "/dev/zero"])
def test_special_files_are_rejected(tmp_path, target):
    path = {"dir": tmp_path, "empty": tmp_path / "empty"}.get(target, target)
    if target == "empty":
        path.write_bytes(b"")
    message = open_error(path)
    assert ("not a regular file" if target != "empty" else "truncated") in message


def test_unreadable_file_is_a_store_error_for_an_unprivileged_user(store):
    """Root ignores permissions, so as root the open runs in a child that drops to user
    `nobody` after importing fastload."""
    if os.geteuid() != 0:
        store[0].chmod(0)
        assert "Permission denied" in open_error(store[0])
        return
    code = (
        "import os, sys, fastload\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try:\n    fastload.Store(sys.argv[1])\n"
        "except fastload.StoreError as e:\n    print('StoreError', e)\n"
    )
    with tempfile.TemporaryDirectory() as reachable:  # in /tmp, which `nobody` can traverse
        os.chmod(reachable, 0o711)
        path = shutil.copy(store[0], reachable)
        os.chmod(path, 0)
        result = subprocess.run(
            [sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60
        )
    assert result.stdout.startswith("StoreError") and "Permission denied" in result.stdout, result.stderr


# ---------------------------------------------------------------- replaced or truncated under readers


def test_replacing_a_store_under_readers_keeps_them_on_the_old_data(tmp_path):
    path = tmp_path / "s.fastload"
    versions = {0: write(path, version=0)}
    old = Store(path)
    old_view, old_first = old.images, old[0][0]
    errors = []
    stop = threading.Event()

    def reader():
        """Opens the store again and again: each open sees exactly one complete version."""
        try:
            while not stop.is_set():
                with Store(path) as s:
                    images, labels = s.gather(range(len(s)))
                version = int(labels[0]) // 1000
                if version not in versions:
                    continue  # written after versions was updated: checked next time
                np.testing.assert_array_equal(images, versions[version][0])
                np.testing.assert_array_equal(labels, versions[version][1])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for version in range(1, 6):
        images, labels = pattern(6, version=version), np.arange(6) + 1000 * version
        versions[version] = (images, labels)
        with StoreWriter(path, SHAPE, overwrite=True) as w:
            w.extend(images, labels)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    np.testing.assert_array_equal(old.images, versions[0][0])
    np.testing.assert_array_equal(old_view, versions[0][0])
    np.testing.assert_array_equal(old_first, versions[0][0][0])
    np.testing.assert_array_equal(old.gather([5, 0])[0], versions[0][0][[5, 0]])
    old.check_unchanged()  # a replaced file is not a changed one: the old mapping is intact
    np.testing.assert_array_equal(Store(path).images, versions[5][0])
    assert sorted(os.listdir(tmp_path)) == ["s.fastload"]


def test_closing_a_store_while_threads_gather_from_it(store):
    """Each gather holds the mapping it copies from: a concurrent close() makes later calls
    raise ValueError("closed"), never return wrong bytes or crash."""
    path, images, _ = store
    s = Store(path)
    outcomes = []

    def reader():
        try:
            for k in range(100_000):
                idx = [k % 6, 5 - k % 6, 3]
                np.testing.assert_array_equal(s.gather(idx)[0], images[idx])
            outcomes.append("never closed")
        except ValueError as exc:
            outcomes.append("closed" if "closed" in str(exc) else exc)
        except BaseException as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    threading.Event().wait(0.05)
    s.close()
    for t in threads:
        t.join()
    assert outcomes == ["closed"] * 3


def test_truncation_under_a_reader_is_detected_before_touching_pages(store):
    path, images, _ = store
    s = Store(path)
    s.gather([0, 1])
    os.truncate(path, HEADER + 128)
    with pytest.raises(StoreError, match="changed length from .* to 4224 bytes"):
        s.check_unchanged()


def test_rewrite_in_place_under_a_reader_is_detected(store):
    path, images, _ = store
    os.utime(path, (1_000_000_000, 1_000_000_000))  # a clearly older mtime than the rewrite
    s = Store(path)
    s.check_unchanged()
    xor(path, HEADER + 3, 0xFF)
    with pytest.raises(StoreError, match="modified in place"):
        s.check_unchanged()


def test_dataset_stops_at_the_next_epoch_after_truncation(store):
    path, images, _ = store
    ds = FastLoadDataset(path, batch_size=2, shuffle=False, pin_memory=False)
    batches = list(ds)
    np.testing.assert_array_equal(np.concatenate([b[0].numpy() for b in batches]), images)
    os.truncate(path, HEADER)
    with pytest.raises(StoreError, match="changed length"):
        next(iter(ds))


def test_reading_truncated_pages_is_sigbus_as_documented(store):
    """The behaviour docs/RELIABILITY.md describes: no check can stop a read of a page that
    another process cut off; the reader dies of SIGBUS. Runs in a child."""
    path = store[0]
    code = (
        "import os, sys, fastload\n"
        "s = fastload.Store(sys.argv[1])\n"
        "view = s.images\n"
        "os.truncate(sys.argv[1], 4096)\n"
        "print('read', int(view[-1].sum()))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=60)
    assert result.returncode == -signal.SIGBUS


# ---------------------------------------------------------------- load and leaks


def process_state(path):
    """(open descriptors, mappings of `path`, RssAnon in kB) of this process."""
    gc.collect()
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/maps") as f:
        maps = sum(str(path) in line for line in f)
    with open("/proc/self/status") as f:
        rss_anon = next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))
    return fds, maps, rss_anon


class GatherBatches(torch.utils.data.Dataset):
    """Map-style dataset: item i is a batch gathered from the store."""

    def __init__(self, path, batches):
        self.path, self.batches = path, batches
        self.store = None

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        if self.store is None:
            self.store = Store(self.path)
        idx = self.batches[i]
        images, labels = self.store.gather(idx)
        return torch.from_numpy(images), torch.from_numpy(labels), torch.from_numpy(idx)


def load_worker(path, worker, epochs, results):
    """One of several processes hammering one store; reports problems, never raises."""
    try:
        torch.set_num_threads(1)
        reference = np.load(str(path) + ".npy")
        n = len(reference)
        rng = np.random.default_rng(worker)
        checked = 0

        def check(images, labels, idx):
            nonlocal checked
            np.testing.assert_array_equal(np.asarray(images), reference[np.asarray(idx)])
            np.testing.assert_array_equal(np.asarray(labels), np.asarray(idx, dtype=np.float64))
            checked += 1

        # A spawned process would spawn its DataLoader workers too (re-importing torch in
        # each); a training script started from a shell forks them, so fork here as well.
        workers = dict(
            batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context="fork"
        )
        batches = [rng.integers(0, n, 8) for _ in range(6)]
        gathers = torch.utils.data.DataLoader(GatherBatches(path, batches), **workers)
        ds = FastLoadDataset(path, batch_size=16, seed=worker, pin_memory=False, return_indices=True)
        fastloads = torch.utils.data.DataLoader(ds, **workers)

        def epoch(e, ds, loaders):
            ds.set_epoch(e)
            with Store(path) as s:
                for _ in range(8):
                    idx = rng.integers(0, n, 16)
                    check(*s.gather(idx), idx)
            for loader in loaders:
                for images, labels, idx in loader:
                    check(images, labels, idx)

        epoch(0, ds, (gathers, fastloads))
        before = process_state(path)
        for e in range(1, epochs):
            epoch(e, ds, (gathers, fastloads))
        after = process_state(path)
        del gathers, fastloads, ds
        final_maps = process_state(path)[1]
        results.put((worker, checked, before, after, final_maps, None))
    except BaseException:
        import traceback

        results.put((worker, 0, None, None, None, traceback.format_exc()))


def run_load(tmp_path, processes, epochs):
    path = tmp_path / "s.fastload"
    n = 96
    images = pattern(n, (16, 16, 3))
    with StoreWriter(path, (16, 16, 3)) as w:
        w.extend(images, np.arange(n, dtype=np.float64))
    np.save(str(path) + ".npy", images)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=load_worker, args=(path, k, epochs, results)) for k in range(processes)]
    for p in procs:
        p.start()
    reports = []
    while len(reports) < len(procs):
        try:
            reports.append(results.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"load processes died with exit codes {dead}"
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for worker, checked, before, after, final_maps, error in reports:
        assert error is None, error
        assert checked >= epochs * (8 + 6 + 6)
        assert after[0] == before[0], f"worker {worker} leaked descriptors: {before} -> {after}"
        assert after[1] == before[1], f"worker {worker} leaked mappings: {before} -> {after}"
        assert final_maps == 0, f"worker {worker} kept {final_maps} mappings after dropping its stores"
        assert after[2] - before[2] < 16 * 1024, f"worker {worker} RssAnon grew: {before} -> {after} kB"


def test_four_processes_with_dataloaders_share_one_store(tmp_path):
    run_load(tmp_path, processes=4, epochs=3)


@pytest.mark.slow
def test_four_processes_with_dataloaders_many_epochs(tmp_path):
    run_load(tmp_path, processes=4, epochs=12)


def churn(path, rounds):
    """Opens stores, takes every kind of view, gathers, drops everything."""
    for i in range(rounds):
        s = Store(path)
        image, label = s[i % len(s)]
        views = s.images, s.labels
        s.gather([0, -1])
        if i % 2:
            s.close()
        del s, image, label, views


@pytest.mark.parametrize("rounds", [pytest.param(100_000, marks=pytest.mark.slow), 5_000])
def test_stores_and_views_created_and_dropped_do_not_leak(store, rounds):
    path = store[0]
    churn(path, 500)
    before = process_state(path)
    churn(path, rounds)
    after = process_state(path)
    assert after[:2] == before[:2] == (before[0], 0)
    assert after[2] - before[2] < 8 * 1024, f"RssAnon grew from {before[2]} to {after[2]} kB"
