"""Writers killed at random moments (SIGKILL, SIGINT): the destination is absent, the old
store or the complete new one, never partial; leftovers are named after the dead writer
and removed by the next write, which succeeds."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from fastload import Store, StoreWriter

pytestmark = pytest.mark.safety

SHAPE = (32, 32, 3)
RECORDS = 240

WRITER = """
import sys, time
import numpy as np
from fastload import StoreWriter
dest, version, records = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
images = np.random.default_rng(version).integers(0, 256, (records, 32, 32, 3), dtype=np.uint8)
print("ready", flush=True)
with StoreWriter(dest, (32, 32, 3), overwrite=True) as w:
    for i in range(0, records, 16):
        w.extend(images[i : i + 16], np.arange(i, min(i + 16, records)) + 1000 * version)
        time.sleep(0.01)
print("done", flush=True)
"""


def expected(version):
    images = np.random.default_rng(version).integers(0, 256, (RECORDS, *SHAPE), dtype=np.uint8)
    return images, np.arange(RECORDS) + 1000.0 * version


def write_in_process(path, version):
    images, labels = expected(version)
    with StoreWriter(path, SHAPE, overwrite=True) as w:
        w.extend(images, labels)


def store_version(path):
    """The version of the complete, intact store at `path` (None when there is none)."""
    if not path.exists():
        return None
    with Store(path) as s:
        assert s.verify() == []
        assert len(s) == RECORDS
        version = int(s.labels[0]) // 1000
        images, labels = expected(version)
        np.testing.assert_array_equal(s.images, images)
        np.testing.assert_array_equal(s.labels, labels)
    return version


def leftovers(path, pid):
    """Files beside `path` other than it; each must be the dead writer's named partial file."""
    others = sorted(p.name for p in path.parent.iterdir() if p != path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.{pid}\.[0-9a-f]{{16}}\.fastload-partial")
    assert all(pattern.fullmatch(name) for name in others), others
    return others


def kill_at_random(command, delay, sig, ready=True, partial_beside=None):
    """Starts `command`, waits for its "ready" line (if `ready`) or for a partial file to
    appear beside `partial_beside`, then sends `sig` after `delay` seconds. Returns the
    child's pid and exit status."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if ready:
        assert child.stdout.readline().strip() == "ready"
    while partial_beside is not None and child.poll() is None:
        if any(p.name.endswith(".fastload-partial") for p in partial_beside.parent.iterdir()):
            break
        time.sleep(0.001)
    time.sleep(delay)
    child.send_signal(sig)
    child.communicate(timeout=60)
    return child.pid, child.returncode


def random_signal(rng):
    return signal.SIGKILL if rng.random() < 0.6 else signal.SIGINT


def writer_trials(tmp_path, trials, seed):
    """Kills StoreWriter processes; even trials start without a store, odd ones replace one."""
    rng = np.random.default_rng(seed)
    path = tmp_path / "s.fastload"
    outcomes = []
    for trial in range(trials):
        old = None
        if trial % 2:
            old = trial
            write_in_process(path, old)
        elif path.exists():
            path.unlink()
        new = trial + 100
        sig = random_signal(rng)
        command = [sys.executable, "-c", WRITER, str(path), str(new), str(RECORDS)]
        pid, _ = kill_at_random(command, rng.uniform(0, 0.25), sig)
        found = store_version(path)
        assert found in (old, new), f"trial {trial}: found version {found}, expected {old} or {new}"
        left = leftovers(path, pid)
        outcomes.append((sig.name, {old: "old", new: "new", None: "absent"}[found], bool(left)))
        write_in_process(path, trial + 200)  # the next write succeeds and cleans up
        assert store_version(path) == trial + 200
        assert sorted(os.listdir(tmp_path)) == [path.name]
    return outcomes


def test_killed_writers_leave_nothing_partial(tmp_path):
    writer_trials(tmp_path, trials=3, seed=0)


@pytest.mark.slow
def test_killed_writers_leave_nothing_partial_many_trials(tmp_path):
    outcomes = writer_trials(tmp_path, trials=30, seed=1)
    print("writer kill outcomes (signal, destination, partial left):", outcomes)


def image_folder(root, per_class=150):
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def pack_trials(tmp_path, trials, seed):
    """Kills `python -m fastload pack` at random moments, from its start or once it has begun
    writing, with and without an existing destination (--overwrite)."""
    from fastload.pack import pack

    rng = np.random.default_rng(seed)
    src = image_folder(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    path = out / "p.fastload"
    command = [sys.executable, "-m", "fastload", "pack", str(src), str(path), "--size", "32"]
    command += ["--workers", "1", "--quiet", "--overwrite"]
    started = time.monotonic()
    subprocess.run(command, check=True, timeout=120)
    duration = time.monotonic() - started
    reference = Store(path)
    outcomes = []
    for trial in range(trials):
        keep_old = trial % 2 == 1
        if not keep_old:
            path.unlink(missing_ok=True)
        elif not path.exists():
            pack(src, path, size=32, quiet=True)
        sig = random_signal(rng)
        if trial % 4 < 2:  # at any moment from the start
            pid, _ = kill_at_random(command, rng.uniform(0.1, 1.1) * duration, sig, ready=False)
        else:  # while the partial file is being written
            pid, _ = kill_at_random(command, rng.uniform(0, 0.05), sig, ready=False, partial_beside=path)
        left = leftovers(path, pid)
        found = "absent"
        if path.exists():
            with Store(path) as s:
                assert s.verify() == []
                np.testing.assert_array_equal(s.images, reference.images)
                np.testing.assert_array_equal(s.labels, reference.labels)
            found = "complete"
        else:
            assert not keep_old, f"trial {trial}: the existing store vanished"
        outcomes.append((sig.name, found, bool(left)))
        pack(src, path, size=32, overwrite=True, quiet=True)  # the next pack succeeds and cleans up
        assert sorted(os.listdir(out)) == [path.name]
    return outcomes


def test_killed_packs_leave_nothing_partial(tmp_path):
    pack_trials(tmp_path, trials=4, seed=0)


@pytest.mark.slow
def test_killed_packs_leave_nothing_partial_many_trials(tmp_path):
    outcomes = pack_trials(tmp_path, trials=20, seed=1)
    print("pack kill outcomes (signal, destination, partial left):", outcomes)
