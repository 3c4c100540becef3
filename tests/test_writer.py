"""StoreWriter (`fastload.store`) under hostile conditions, every test marked `safety`: writers
that share a destination (two processes whose PIDs collide in separate PID namespaces, two
writers in one notebook), killed writers, hostile metadata, huge damage and awkward paths:
nothing is lost, nothing half-written, every cost bounded. Its everyday use: test_store.py."""

import datetime
import gc
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from fastload import Store, StoreError, StoreWriter, _core
from fastload.inspect import verify

pytestmark = pytest.mark.safety

SHAPE = (4, 4, 3)


def records(seed, n=5):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8), np.arange(n) + 100.0 * seed


def partials(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".fastload-partial"))


def assert_holds(path, seed, n=5):
    """The store at `path` is exactly writer `seed`'s records, every checksum intact."""
    images, labels = records(seed, n)
    with Store(path) as s:
        assert s.verify() == [] and len(s) == n
        np.testing.assert_array_equal(s.images, images)
        np.testing.assert_array_equal(s.labels, labels)


def two_writers(path, overwrite=False):
    w1, w2 = StoreWriter(path, SHAPE, overwrite=overwrite), StoreWriter(path, SHAPE, overwrite=overwrite)
    w1.extend(*records(1))
    w2.extend(*records(2))
    assert len(partials(path.parent)) == 2
    return w1, w2


@pytest.mark.parametrize("first", [0, 1])
def test_two_writers_in_one_process_first_commit_wins(tmp_path, first):
    path = tmp_path / "s.fastload"
    writers = two_writers(path)
    writers[first].commit()
    with pytest.raises(FileExistsError, match="already exists"):
        writers[1 - first].commit()
    assert_holds(path, first + 1)
    assert partials(tmp_path) == []


def test_dropping_one_writer_keeps_the_others_records(tmp_path):
    path = tmp_path / "s.fastload"
    w1, w2 = two_writers(path)
    del w1
    gc.collect()
    assert len(partials(tmp_path)) == 1
    w2.commit()
    assert_holds(path, 2)
    assert partials(tmp_path) == []


def test_two_overwriting_writers_publish_one_whole_store(tmp_path):
    path = tmp_path / "s.fastload"
    w1, w2 = two_writers(path, overwrite=True)
    w2.commit()
    w1.commit()
    assert_holds(path, 1)
    assert partials(tmp_path) == []


NAMESPACED_WRITER = """
import os, sys
from test_writer import records, SHAPE
from fastload import StoreWriter
seed, overwrite = int(sys.argv[2]), sys.argv[3] == "1"
w = StoreWriter(sys.argv[1], SHAPE, overwrite=overwrite)
images, labels = records(seed)
w.extend(images[:2], labels[:2])
print("ready", os.getpid(), flush=True)
sys.stdin.readline()
w.extend(images[2:], labels[2:])
try:
    w.commit()
    print("committed", flush=True)
except FileExistsError as e:
    print("refused", e, flush=True)
"""


def pid_namespace_prefix():
    """`unshare` into a new PID namespace (the writer is PID 1 there, as in a container), or [] where not permitted."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    command = [unshare, "--pid", "--fork", "--user", "--map-root-user"]
    ok = subprocess.run([*command, "true"], capture_output=True).returncode == 0
    return command if ok else []


@pytest.mark.parametrize("overwrite", [False, True])
def test_writers_whose_pids_collide_never_share_a_file(tmp_path, overwrite):
    """Two containers on one volume: both writers are PID 1. Each keeps its own locked partial
    file, the second writer's cleanup leaves the first one's alone, and what is published is
    one writer's whole store."""
    path = tmp_path / "s.fastload"
    prefix = pid_namespace_prefix()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]),
    }
    children, pids = [], []
    for seed in (1, 2):
        command = [
            *prefix,
            sys.executable,
            "-c",
            NAMESPACED_WRITER,
            str(path),
            str(seed),
            str(int(overwrite)),
        ]
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = child.stdout.readline().split()
        assert line[0] == "ready", line
        pids.append(int(line[1]))
        children.append(child)
        # The second writer started (and ran its cleanup) while the first one's file was live.
        assert len(partials(tmp_path)) == seed
    if prefix:
        assert pids == [1, 1]
    outcomes = [child.communicate("go\n", timeout=60)[0].split()[0] for child in children]
    assert all(child.returncode == 0 for child in children)
    assert outcomes == (["committed", "committed"] if overwrite else ["committed", "refused"])
    assert_holds(path, 2 if overwrite else 1)
    assert partials(tmp_path) == []


KILLED_WRITER = """
import sys, time
from fastload import StoreWriter
w = StoreWriter(sys.argv[1], (4, 4, 3))
print("ready", flush=True)
time.sleep(60)
"""


def test_a_killed_writers_partial_is_removed_by_the_next_write(tmp_path):
    path = tmp_path / "s.fastload"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert len(partials(tmp_path)) == 1
    with StoreWriter(path, SHAPE) as w:
        w.extend(*records(3))
    assert_holds(path, 3)
    assert sorted(os.listdir(tmp_path)) == [path.name]


def test_a_255_byte_destination_name_commits(tmp_path):
    path = tmp_path / ("n" * 250 + ".fast")
    with StoreWriter(path, SHAPE) as w:
        w.extend(*records(4))
        (partial,) = partials(tmp_path)
        assert len(partial.encode()) <= 255
    assert_holds(path, 4)
    assert partials(tmp_path) == []


def test_a_dangling_link_is_refused_before_any_work(tmp_path):
    link = tmp_path / "s.fastload"
    link.symlink_to("gone.fastload")
    for overwrite in (False, True):
        with pytest.raises(
            ValueError,
            match=re.escape(f"store {link} is a symbolic link to gone.fastload, which does not resolve"),
        ):
            StoreWriter(link, SHAPE, overwrite=overwrite)
    assert sorted(os.listdir(tmp_path)) == ["s.fastload"]


def test_overwrite_through_a_link_replaces_its_target_and_keeps_the_link(tmp_path):
    real = tmp_path / "data" / "real.fastload"
    real.parent.mkdir()
    with StoreWriter(real, SHAPE) as w:
        w.extend(*records(1))
    link = tmp_path / "s.fastload"
    link.symlink_to(real)
    with pytest.raises(FileExistsError, match="already exists"):
        StoreWriter(link, SHAPE)
    with StoreWriter(link, SHAPE, overwrite=True) as w:
        w.extend(*records(2))
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert_holds(real, 2)
    assert sorted(os.listdir(tmp_path)) == ["data", "s.fastload"]
    assert os.listdir(real.parent) == ["real.fastload"]


def cycle():
    meta = {}
    meta["self"] = meta
    return meta


def nested(depth):
    value = 1
    for _ in range(depth):
        value = [value]
    return {"deep": value}


@pytest.mark.parametrize(
    "meta, message",
    [
        ({"loss": math.nan}, r"meta\['loss'\] is nan: JSON has no NaN or infinity"),
        ({"a": {"b": math.inf}}, r"meta\['a'\]\['b'\] is inf"),
        ({"a": [1, -math.inf]}, r"meta\['a'\]\[1\] is -inf"),
        ({"name": "x\ud800"}, r"meta\['name'\] holds a lone surrogate '\\ud800'"),
        ({"\udc80": 1}, r"the key '\\udc80' of meta holds a lone surrogate"),
        (nested(_core.MAX_META_DEPTH), r"meta\['deep'\](\[0\]){63} is nested 65 levels deep, more than 64"),
        (cycle(), r"nested 65 levels deep, more than 64 \(or is a reference cycle\)"),
        (
            {"blob": "x" * _core.MAX_META_LEN},
            r"metadata is \d+ bytes as JSON, more than the 67108864-byte limit",
        ),
    ],
    ids=["nan", "inf", "-inf", "surrogate", "surrogate key", "too deep", "cycle", "too long"],
)
def test_metadata_a_reader_would_refuse_is_refused_at_construction(tmp_path, meta, message):
    with pytest.raises(ValueError, match=message):
        StoreWriter(tmp_path / "s.fastload", SHAPE, meta=meta)
    assert os.listdir(tmp_path) == []


def test_metadata_with_too_many_elements_is_refused_at_construction(tmp_path):
    with pytest.raises(
        ValueError, match=r"metadata has more than 4000000 elements \(at meta\['ids'\]\[\d+\]\)"
    ):
        StoreWriter(tmp_path / "s.fastload", SHAPE, meta={"ids": [0] * _core.MAX_META_VALUES})
    assert os.listdir(tmp_path) == []


def test_the_writer_counts_metadata_elements_as_the_reader_does(tmp_path):
    """Exactly MAX_META_VALUES elements (the metadata object, the writer's two keys, the list
    and its items) are written and read back; one more is refused, naming the first element
    past the bound."""
    items = _core.MAX_META_VALUES - 4
    path = tmp_path / "s.fastload"
    with StoreWriter(path, SHAPE, meta={"ids": [0] * items}) as w:
        w.extend(*records(0, n=1))
    assert len(Store(path).meta["ids"]) == items
    with pytest.raises(
        ValueError, match=rf"^metadata has more than \d+ elements \(at meta\['ids'\]\[{items}\]\)$"
    ):
        StoreWriter(tmp_path / "t.fastload", SHAPE, meta={"ids": [0] * (items + 1)})


def test_metadata_spoilt_after_construction_is_refused_at_commit(tmp_path):
    """`pack` fills in `sources` after the writer exists: commit checks again and writes nothing."""
    path = tmp_path / "s.fastload"
    w = StoreWriter(path, SHAPE)
    w.extend(*records(1))
    w.meta["sources"] = ["a.png", math.nan]
    with pytest.raises(ValueError, match=r"meta\['sources'\]\[1\] is nan"):
        w.commit()
    w.discard()
    assert os.listdir(tmp_path) == []


def meta_section(path):
    """(offset, length) of a store's metadata section, from its header (docs/FORMAT.md)."""
    with open(path, "rb") as f:
        f.seek(96)
        return tuple(int(v) for v in np.frombuffer(f.read(16), dtype="<u8"))


def test_metadata_is_utf8_text_with_its_creation_time_in_utc(tmp_path):
    """docs/FORMAT.md: the section is UTF-8 JSON (a name is its UTF-8 bytes, not escapes, and
    counts as those bytes against MAX_META_LEN); `created` is ISO 8601 in UTC, to the second."""
    path = tmp_path / "s.fastload"
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    with StoreWriter(path, SHAPE, meta={"note": "猫 café"}) as w:
        w.extend(*records(1))
    after = datetime.datetime.now(datetime.timezone.utc)
    offset, length = meta_section(path)
    with open(path, "rb") as f:
        f.seek(offset)
        assert "猫 café".encode() in f.read(length)
    created = Store(path).meta["created"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", created)
    assert before <= datetime.datetime.fromisoformat(created) <= after


def padded_to_the_limit(tmp_path, meta):
    """``meta`` with a ``pad`` string making its JSON, the writer's keys included, exactly
    MAX_META_LEN bytes (measured on a store written with an empty pad)."""
    with StoreWriter(tmp_path / "measure.fastload", SHAPE, meta={**meta, "pad": ""}, overwrite=True) as w:
        w.extend(*records(1))
    return {**meta, "pad": "x" * (_core.MAX_META_LEN - meta_section(tmp_path / "measure.fastload")[1])}


def test_metadata_of_exactly_the_limit_is_taken_and_checked_as_a_reader_would(tmp_path):
    """MAX_META_LEN bytes is within the limit: written and read back; and the reader's checks
    (here its depth) still run on it when the writer is made, not only at commit."""
    path = tmp_path / "s.fastload"
    with StoreWriter(path, SHAPE, meta=padded_to_the_limit(tmp_path, {})) as w:
        w.extend(*records(1))
    assert meta_section(path)[1] == _core.MAX_META_LEN
    assert len(Store(path).meta["pad"]) > _core.MAX_META_LEN - 100
    too_deep = padded_to_the_limit(tmp_path, nested(_core.MAX_META_DEPTH - 2))
    StoreWriter(tmp_path / "t.fastload", SHAPE, meta=too_deep).discard()  # 64 levels with meta's: taken
    too_deep["deep"] = [too_deep["deep"]]
    too_deep["pad"] = too_deep["pad"][2:]  # the added "[" and "]" keep it at the limit
    with pytest.raises(ValueError, match=r"is nested 65 levels deep, more than 64"):
        StoreWriter(tmp_path / "u.fastload", SHAPE, meta=too_deep)


def hostile_store(path, meta_text):
    """A store whose metadata section holds `meta_text`: written with ASCII filler of that
    length, which is then replaced in place (the metadata has no checksum)."""
    with StoreWriter(path, SHAPE, meta={"pad": ""}) as w:
        w.extend(*records(1))
    pad = len(meta_text) - meta_section(path)[1]
    with StoreWriter(path, SHAPE, meta={"pad": "x" * pad}, overwrite=True) as w:
        w.extend(*records(1))
    offset, length = meta_section(path)
    assert length == len(meta_text)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(meta_text.encode())


OPEN_AND_MEASURE = """
import resource, sys
from fastload import Store, StoreError
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
store = Store(sys.argv[1])
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
try:
    store.meta
    print(grown, "no error")
except StoreError as e:
    print(grown, e)
"""


def test_a_store_with_millions_of_tiny_metadata_objects_opens_in_small_memory(tmp_path):
    """16 MiB of `{}`s: 5.6 million objects. Opening streams over them without building a
    tree; `meta` refuses to build one, naming the file."""
    path = tmp_path / "s.fastload"
    objects = (16 << 20) // 3
    hostile_store(path, '{"a":[' + ",".join(["{}"] * objects) + "]}")
    out = subprocess.run(
        [sys.executable, "-c", OPEN_AND_MEASURE, str(path)], capture_output=True, text=True, timeout=120
    ).stdout.split(maxsplit=1)
    grown_kib, message = int(out[0]), out[1].strip()
    # The metadata pages themselves are mapped (16 MiB); a tree of them took gigabytes.
    assert grown_kib < 48 << 10, f"opening grew the peak RSS by {grown_kib} KiB"
    assert message == f"{path}: bad metadata: metadata has more than 4000000 elements ({objects + 2})"
    assert verify(path) == []


def test_metadata_nested_too_deep_opens_but_meta_names_the_problem(tmp_path):
    path = tmp_path / "s.fastload"
    hostile_store(path, json.dumps(nested(70)))
    with Store(path) as s:
        assert len(s) == 5
        with pytest.raises(
            StoreError, match=re.escape(f"{path}: bad metadata: metadata is nested 72 levels deep")
        ):
            _ = s.meta


@pytest.fixture(scope="module")
def all_damaged(tmp_path_factory):
    """2^18 one-byte records whose stored checksums were all zeroed: every record is damaged."""
    path = tmp_path_factory.mktemp("damaged") / "s.fastload"
    n = 1 << 18
    with StoreWriter(
        path, (1, 1, 1), label_dtype="int64", meta={"sources": [f"{i}.png" for i in range(n)]}
    ) as w:
        w.extend(np.zeros((n, 1, 1, 1), dtype=np.uint8), np.arange(n))
    with open(path, "r+b") as f:
        f.seek(80)
        offset, length = (int(v) for v in np.frombuffer(f.read(16), dtype="<u8"))
        f.seek(offset)
        f.write(bytes(length))
    return path, n


def test_verify_lists_at_most_a_limit_in_bounded_memory(all_damaged):
    path, n = all_damaged
    with Store(path) as s:
        tracemalloc.start()
        damaged = s.verify()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert damaged == list(range(1000)) and damaged.total == n
        # Every damaged record as a Python int would take some 9 MB.
        assert peak < 1 << 20, f"verify allocated {peak} bytes at its peak"
        assert s.verify(limit=3) == [0, 1, 2] and s.verify(limit=3).total == n
        assert s.verify(limit=None) == list(range(n))
        with pytest.raises(ValueError, match="limit must be a non-negative integer"):
            s.verify(limit=-1)


def test_cli_verify_prints_a_limit_then_how_many_more(all_damaged):
    path, n = all_damaged
    assert verify(path, limit=2) == [(0, "0.png"), (1, "1.png")]
    result = subprocess.run(
        [sys.executable, "-m", "fastload", "verify", str(path), "--limit", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        "damaged record 0 (0.png)",
        "damaged record 1 (1.png)",
        "damaged record 2 (2.png)",
        f"... and {n - 3:,} more damaged records",
    ]
    assert result.stderr.strip() == f"{path}: {n:,} damaged record(s)"
