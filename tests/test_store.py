"""Store and StoreWriter (`fastload.store`) as a user sees them: round trips, zero-copy views,
gather, bad files; then, marked `safety`, hostile store files, damaged records, stores replaced
or truncated under readers, and many readers at once: every failure is a clean StoreError,
nothing leaks, nothing crashes (docs/RELIABILITY.md states the guarantees). StoreWriter's own
hostile cases (shared destinations, killed writers, hostile metadata): test_writer.py."""

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
from hypothesis import given, settings
from hypothesis import strategies as st

import fastload
import fastload.inspect
from fastload import Store, StoreError, StoreWriter, cli
from fastload.dataset import FastLoadDataset
from fastload.inspect import info as info_store
from fastload.inspect import verify as verify_store


def write_store(path, images, labels, label_dtype="float64", **kwargs):
    with StoreWriter(path, images.shape[1:], label_dtype=label_dtype, **kwargs) as w:
        w.extend(images, labels)
    return path


def random_images(n, shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)


@pytest.fixture
def store_path(tmp_path):
    images = random_images(20, (6, 5, 3))
    return write_store(tmp_path / "s.bin", images, np.arange(20) * 1.5), images


@pytest.mark.parametrize("shape", [(6, 5, 3), (7, 7, 1), (16, 16, 4), (1, 1, 3), (384, 384, 3)])
@pytest.mark.parametrize("label_dtype", ["float64", "int64"])
def test_round_trip(tmp_path, shape, label_dtype):
    n = 2 if shape[0] == 384 else 9
    images = random_images(n, shape)
    labels = np.arange(n) * 3 - 7
    write_store(tmp_path / "s.bin", images, labels, label_dtype=label_dtype, meta={"note": "ü"})
    with Store(tmp_path / "s.bin") as s:
        assert len(s) == n
        assert s.shape == shape
        assert s.label_dtype == np.dtype(label_dtype)
        assert s.meta["note"] == "ü"
        assert s.meta["fastload_version"] == fastload.__version__
        np.testing.assert_array_equal(s.images, images)
        np.testing.assert_array_equal(s.labels, labels)
        assert s.labels.dtype == np.dtype(label_dtype)
        image, label = s[-1]
        np.testing.assert_array_equal(image, images[-1])
        assert label == labels[-1]
        assert s.verify() == []


def test_single_channel_accepts_2d_images(tmp_path):
    with StoreWriter(tmp_path / "g.bin", (4, 3, 1)) as w:
        w.append(np.full((4, 3), 7, np.uint8), 1.0)
        w.append(np.full((4, 3, 1), 9, np.uint8), 2.0)
    s = Store(tmp_path / "g.bin")
    assert s.images.shape == (2, 4, 3, 1)
    assert s.images[1].max() == 9


def test_a_shape_of_two_sides_is_one_channel(tmp_path):
    with StoreWriter(tmp_path / "g.bin", (4, 3)) as w:
        assert w.shape == (4, 3, 1) and w.path == tmp_path / "g.bin"
        w.append(np.full((4, 3), 7, np.uint8), 1.0)
    assert Store(tmp_path / "g.bin").shape == (4, 3, 1)


def test_records_are_page_aligned_for_384(tmp_path):
    images = random_images(3, (384, 384, 3))
    path = write_store(tmp_path / "s.bin", images, [0.0, 1.0, 2.0])
    s = Store(path)
    base = s.images.__array_interface__["data"][0]
    assert base % 4096 == 0
    assert s.images.strides[0] == 384 * 384 * 3
    assert s.file_size == os.path.getsize(path)


def test_views_are_zero_copy_and_read_only(store_path):
    path, images = store_path
    s = Store(path)
    a, _ = s[3]
    b = s.images[3]
    assert np.shares_memory(a, b)
    assert np.shares_memory(s.images, Store(path).images) is False  # separate mappings
    with pytest.raises(ValueError):
        a[0, 0, 0] = 1
    with pytest.raises(ValueError):
        s.images.flags.writeable = True
    with pytest.raises(ValueError):
        s.labels[0] = 2.0


def test_views_outlive_close_and_the_store(store_path):
    path, images = store_path
    s = Store(path)
    view = s.images
    first, label = s[0]
    labels = s.labels
    s.close()
    assert s.closed
    with pytest.raises(ValueError, match="closed"):
        s.gather([0])
    del s
    gc.collect()
    np.testing.assert_array_equal(view, images)
    np.testing.assert_array_equal(first, images[0])
    assert labels[19] == 19 * 1.5


def test_getitem_bounds_and_types(store_path):
    path, images = store_path
    s = Store(path)
    np.testing.assert_array_equal(s[-20][0], images[0])
    for bad in (20, -21, 10**12):
        with pytest.raises(IndexError):
            s[bad]
    for bad in (1.0, "1", None, True):
        with pytest.raises(TypeError):
            s[bad]
    assert [float(label) for _, label in s][:3] == [0.0, 1.5, 3.0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-20, 19), max_size=50))
def test_gather_matches_numpy(tmp_path_factory, indices):
    path = tmp_path_factory.getbasetemp() / "gather.bin"
    if not path.exists():
        write_store(path, random_images(20, (6, 5, 3), seed=1), np.arange(20.0))
    s = Store(path)
    reference = np.asarray(s.images)[indices] if indices else np.empty((0, 6, 5, 3), np.uint8)
    images, labels = s.gather(indices)
    assert images.shape == (len(indices), 6, 5, 3) and images.flags.c_contiguous
    np.testing.assert_array_equal(images, reference)
    np.testing.assert_array_equal(labels, np.arange(20.0)[indices])


def test_gather_duplicates_reversed_and_into_buffers(store_path):
    path, images = store_path
    s = Store(path)
    idx = np.array([19, 19, 0, 5, 5, 1])[::-1]
    got, labels = s.gather(idx)
    np.testing.assert_array_equal(got, images[idx])
    out = np.zeros((6, 6, 5, 3), np.uint8)
    lab = np.zeros(6)
    got, labels = s.gather(idx, out=out, labels_out=lab)
    assert got is out and labels is lab
    np.testing.assert_array_equal(out, images[idx])
    np.testing.assert_array_equal(lab, idx * 1.5)
    tensor = torch.zeros((6, 6, 5, 3), dtype=torch.uint8)
    got, labels = s.gather(idx, out=tensor)
    assert got is tensor and isinstance(labels, torch.Tensor)
    np.testing.assert_array_equal(tensor.numpy(), images[idx])


@pytest.mark.parametrize(
    "out, error, match",
    [
        (np.zeros((2, 6, 5, 3), np.float32), TypeError, "dtype"),
        (np.zeros((3, 6, 5, 3), np.uint8), ValueError, "shape"),
        (np.zeros((2, 5, 6, 3), np.uint8), ValueError, "shape"),
        (np.zeros((2, 6, 5, 3, 2), np.uint8)[..., 0], ValueError, "contiguous"),
        (np.frombuffer(bytes(180), np.uint8).reshape(2, 6, 5, 3), ValueError, "writable"),
        (torch.zeros((2, 6, 5, 3), dtype=torch.float32), TypeError, "dtype"),
        (torch.zeros((2, 3, 5, 6), dtype=torch.uint8).permute(0, 3, 2, 1), ValueError, "contiguous"),
        ([[0]], TypeError, "NumPy array or a torch tensor"),
    ],
)
def test_gather_rejects_wrong_out(store_path, out, error, match):
    s = Store(store_path[0])
    with pytest.raises(error, match=match):
        s.gather([0, 1], out=out)


def test_copy_in_order_copies_consecutive_records_into_one_reused_batch(store_path):
    # fastload bench's copy limit: gather's copy of records first.. in order, a batch at a time.
    path, images = store_path
    s = Store(path)
    batch = np.zeros((3, 6, 5, 3), np.uint8)
    s.copy_in_order(2, 3, batch)
    np.testing.assert_array_equal(batch, images[2:5])
    s.copy_in_order(15, 5, batch)  # batches 15-17, then 18-19 over the first two slots
    np.testing.assert_array_equal(batch, images[[18, 19, 17]])
    for first, count, out, match in [
        (18, 3, batch, "run past the store's 20 records"),
        (-1, 3, batch, "non-negative integers"),
        (0, 1, np.zeros(89, np.uint8), "whole number of 90-byte images"),
        (0, 1, np.zeros((1, 6, 5, 3), np.float32), "uint8"),
        (0, 1, np.frombuffer(bytes(90), np.uint8), "writable"),
    ]:
        with pytest.raises(ValueError, match=match):
            s.copy_in_order(first, count, out)


def test_gather_rejects_bad_indices(store_path):
    s = Store(store_path[0])
    with pytest.raises(IndexError, match="out of range"):
        s.gather([0, 20])
    with pytest.raises(TypeError):
        s.gather([0.5])
    with pytest.raises(TypeError):
        s.gather([True, False])
    with pytest.raises(ValueError):
        s.gather([[0, 1]])


def test_writer_refuses_to_overwrite_and_discards_on_error(store_path, tmp_path):
    path, images = store_path
    with pytest.raises(FileExistsError, match="already exists"):
        StoreWriter(path, (6, 5, 3))
    with pytest.raises(RuntimeError, match="boom"), StoreWriter(tmp_path / "new.bin", (6, 5, 3)) as w:
        w.extend(images[:3], [1, 2, 3])
        raise RuntimeError("boom")
    assert sorted(os.listdir(tmp_path)) == ["s.bin"]
    write_store(path, images[:2], [5.0, 6.0], overwrite=True)
    assert len(Store(path)) == 2


def test_overwrite_leaves_open_readers_on_the_old_data(store_path):
    path, images = store_path
    old = Store(path)
    view = old.images
    write_store(path, random_images(4, (6, 5, 3), seed=9), np.zeros(4), overwrite=True)
    np.testing.assert_array_equal(view, images)
    np.testing.assert_array_equal(old.gather([19])[0][0], images[19])
    assert len(Store(path)) == 4


@pytest.mark.parametrize(
    "images, labels, error",
    [
        (np.zeros((2, 6, 5, 3), np.float32), [1, 2], TypeError),
        (np.zeros((2, 6, 5, 4), np.uint8), [1, 2], ValueError),
        (np.zeros((2, 6, 5, 3), np.uint8), [1], ValueError),
        (np.zeros((2, 6, 5, 3), np.uint8), ["a", "b"], TypeError),
    ],
)
def test_writer_rejects_bad_records(tmp_path, images, labels, error):
    with StoreWriter(tmp_path / "w.bin", (6, 5, 3)) as w, pytest.raises(error):
        w.extend(images, labels)


def test_int64_writer_rejects_fractional_labels(tmp_path):
    w = StoreWriter(tmp_path / "w.bin", (2, 2, 3), label_dtype="int64")
    with pytest.raises(ValueError, match="whole"):
        w.append(np.zeros((2, 2, 3), np.uint8), 1.5)
    w.discard()
    assert not os.listdir(tmp_path)


def test_single_channel_batches_may_leave_out_the_channel_axis(tmp_path):
    images = np.arange(3 * 2 * 2, dtype=np.uint8).reshape(3, 2, 2)
    with StoreWriter(tmp_path / "s.bin", (2, 2, 1)) as w:
        w.extend(images, np.arange(3.0))
    np.testing.assert_array_equal(Store(tmp_path / "s.bin").images[..., 0], images)


def test_labels_of_any_numeric_dtype_are_stored_exactly_when_they_fit(tmp_path):
    """Whole floats go into an int64 store, float32 included, and int64's own bounds fit;
    fractional labels are refused whatever their float type; a float64 store takes labels
    of every float width."""
    images = np.zeros((2, 2, 2, 3), np.uint8)
    path = tmp_path / "int.bin"
    with StoreWriter(path, (2, 2, 3), label_dtype="int64") as w:
        w.extend(images, np.array([1.0, -3.0]))
        w.extend(images, np.array([2.0, 5.0], np.float32))
        w.extend(images, np.array([2**63 - 1, -(2**63)], np.int64))
        w.extend(images, np.array([1e6, -(2.0**62)]))
        w.extend(images, np.array([7, 2**63 - 1], np.uint64))
        w.extend(images, np.array([200, 0], np.uint8))
        refused = [np.array([1.5, 2.0], np.float32), np.array([0.5, 2.0], np.float16), np.array([2.0**63, 0])]
        for labels in refused:
            with pytest.raises(
                ValueError, match="^int64 labels must be whole numbers within the int64 range$"
            ):
                w.extend(images, labels)
        with pytest.raises(ValueError, match="^int64 label 9223372036854775808 is beyond the int64 range$"):
            w.extend(images, np.array([2**63, 0], np.uint64))
    expected = [1, -3, 2, 5, 2**63 - 1, -(2**63), 10**6, -(2**62), 7, 2**63 - 1, 200, 0]
    assert Store(path).labels.tolist() == expected
    path = tmp_path / "float.bin"
    with StoreWriter(path, (2, 2, 3)) as w:
        for dtype in (np.float16, np.float32, np.float64, np.int32, np.uint8):
            w.extend(images, np.array([0.5 if dtype().dtype.kind == "f" else 3, 2], dtype))
    assert Store(path).labels.tolist() == [0.5, 2.0] * 3 + [3.0, 2.0] * 2


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"shape": (0, 4, 3)}, ValueError),
        ({"shape": (4, 4, 2)}, ValueError),
        ({"shape": (4,)}, ValueError),
        ({"shape": (4, 4, 3), "label_dtype": "float32"}, ValueError),
        ({"shape": (4, 4, 3), "meta": {"x": object()}}, TypeError),
    ],
)
def test_writer_rejects_bad_arguments(tmp_path, kwargs, error):
    with pytest.raises(error):
        StoreWriter(tmp_path / "w.bin", **kwargs)
    assert not os.listdir(tmp_path)


def corrupt(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda p: p.write_bytes(b""), "truncated"),
        (lambda p: os.truncate(p, 4000), "truncated"),
        (lambda p: os.truncate(p, os.path.getsize(p) - 1), "truncated"),
        (lambda p: corrupt(p, os.path.getsize(p), b"x"), "trailing"),
        (lambda p: corrupt(p, 0, b"NOTASTOR"), "magic"),
        (lambda p: corrupt(p, 8, struct.pack("<I", 3)), "version 3"),
        (lambda p: corrupt(p, 16, struct.pack("<Q", 7)), "checksum"),
        (lambda p: p.write_bytes(os.urandom(10000)), "magic"),
    ],
)
def test_bad_files_raise_store_error(store_path, damage, match):
    path = store_path[0]
    damage(path)
    with pytest.raises(StoreError, match=match) as info:
        Store(path)
    assert str(path) in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(StoreError, match="No such file"):
        Store(tmp_path / "nope.bin")
    with pytest.raises(StoreError, match=str(tmp_path)):
        Store(tmp_path)
    with pytest.raises(TypeError):
        Store(42)


def test_verify_finds_damaged_records(store_path):
    path, images = store_path
    stride = Store(path).images.strides[0]
    corrupt(path, 4096 + 7 * stride + 11, b"\xff\x00")
    assert Store(path).verify() == [7]


def test_fork_safe_gather_in_dataloader_workers(store_path):
    """A rayon pool inherited across fork() deadlocks unless rebuilt per process."""
    path, images = store_path
    store = Store(path)
    store.gather([0, 1])  # start the pool in the parent before forking

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            idx = [(i * 3 + k) % 20 for k in range(4)]
            return store.gather(idx)[0], torch.tensor(idx)

    loader = torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=2)
    seen = 0
    for batch, idx in loader:
        np.testing.assert_array_equal(np.asarray(batch), images[idx.numpy()])
        seen += 1
    assert seen == 8


@pytest.mark.parametrize(
    "names, shared",
    [
        (["cat", "cat", "7"], "'cat' (labels 0, 1)"),
        (("a", "b", "a", "b"), "'a' (labels 0, 2); 'b' (labels 1, 3)"),
        ([7, "7"], "'7' (labels 0, 1)"),  # a reader shows names as text
        (["\u00e9", "e\u0301"], "labels 0 as '\\xe9', 1 as 'e\\u0301': one text in different Unicode forms"),
        (["dog", "cat", "cat"], "'cat' (labels 1, 2)"),  # after a name of one class
    ],
)
def test_class_names_shared_by_two_classes_are_refused(tmp_path, names, shared):
    """A reader counts records per class name: two classes of one name would merge."""
    with pytest.raises(ValueError, match="one name to several classes") as error:
        StoreWriter(tmp_path / "s.bin", (2, 2, 1), label_dtype="int64", meta={"class_names": names})
    assert shared in str(error.value) and str(error.value).endswith("; each class needs a name of its own")
    writer = StoreWriter(tmp_path / "s.bin", (2, 2, 1), label_dtype="int64", meta={"class_names": ["x", "y"]})
    writer.append(np.zeros((2, 2, 1), np.uint8), 0)
    writer.meta["class_names"] = names  # spoilt after construction: refused at commit, nothing written
    with pytest.raises(ValueError, match="one name to several classes"):
        writer.commit()
    assert not (tmp_path / "s.bin").exists()
    writer.discard()


def test_info_counts_every_class_of_a_store_whose_names_repeat(tmp_path):
    """A store written before names were checked (or edited by hand) still reports every record:
    when two labels share a name, each class shows with its label."""
    labels = [0] * 3 + [1] * 6 + [2] * 4 + [7]
    path = write_store(
        tmp_path / "s.bin",
        random_images(len(labels), (2, 2, 1)),
        labels,
        label_dtype="int64",
        meta={"class_names": ["cat", "cau", "7"]},
    )
    data = path.read_bytes()
    assert data.count(b'"cau"') == 1  # the metadata has no checksum: the edit opens as a valid store
    path.write_bytes(data.replace(b'"cau"', b'"cat"'))
    assert Store(path).meta["class_names"] == ["cat", "cat", "7"]
    classes = fastload.inspect.info(path)["labels"]["classes"]
    assert classes == {"cat (0)": 3, "cat (1)": 6, "7 (2)": 4, "unnamed (7)": 1}
    assert sum(classes.values()) == len(labels)
    shown = subprocess.run(
        [sys.executable, "-m", "fastload", "info", str(path)], capture_output=True, text=True, timeout=60
    )
    assert "classes    cat (0): 3, cat (1): 6, 7 (2): 4, unnamed (7): 1\n" in shown.stdout, shown.stderr


def test_info_counts_classes_by_name_when_names_are_distinct(tmp_path):
    path = write_store(
        tmp_path / "s.bin",
        random_images(5, (2, 2, 1)),
        [0, 1, 1, 4, 4],
        label_dtype="int64",
        meta={"class_names": ["cat", "dog"]},
    )
    assert fastload.inspect.info(path)["labels"]["classes"] == {"cat": 1, "dog": 2, "4": 2}


def test_info_and_memory_plan(store_path):
    path, _ = store_path
    summary = fastload.inspect.info(path)
    assert summary["records"] == 20 and summary["shape"] == [6, 5, 3]
    assert summary["labels"]["max"] == 19 * 1.5
    assert 0 <= summary["resident_bytes"] <= summary["file_bytes"] == os.path.getsize(path)
    plan = fastload.inspect.memory_plan(250_000, (384, 384, 3), ram_bytes=192 * 10**9)
    assert plan["uint8_bytes"] == 110_594_000_000
    assert plan["fit_in_ram_float32"] == 192 * 10**9 // (384 * 384 * 12 + 8)


@pytest.mark.safety
def test_memory_plans_of_shapes_past_int64_count_in_python_ints(tmp_path, capsys):
    """np.prod wrapped: `bench --images 5 --size 3037000500` planned -46,116,860,182 GB, and
    `info` said an empty store of 2**31 x 2**31 x 3 records holds -1 images."""
    plan = fastload.inspect.memory_plan(5, (3_037_000_500, 3_037_000_500, 3), ram_bytes=10**12)
    assert plan["uint8_bytes"] == 5 * (3 * 3_037_000_500**2 + 8) and plan["fit_in_ram_uint8"] == 0
    path = tmp_path / "wide.fastload"
    with StoreWriter(path, (2**31, 2**31, 3)):
        pass  # no record: a valid store whose records no machine could hold
    assert cli.main(["info", os.fspath(path)]) == 0
    out = capsys.readouterr().out
    assert "holds 0 images as uint8, 0 as float32" in out and "-" not in out.split("RAM holds")[1]


def test_fingerprint_is_the_records_not_the_file(tmp_path):
    images = random_images(6, (4, 4, 3))
    labels = np.arange(6, dtype=np.float64)
    write_store(tmp_path / "a.bin", images, labels)
    (tmp_path / "copy.bin").write_bytes((tmp_path / "a.bin").read_bytes())
    write_store(tmp_path / "relabelled.bin", images, labels + 1)
    changed = images.copy()
    changed[5, 0, 0, 0] ^= 1
    write_store(tmp_path / "one-pixel.bin", changed, labels)
    with Store(tmp_path / "a.bin") as a, Store(tmp_path / "copy.bin") as copy:
        assert a.fingerprint() == copy.fingerprint()
        assert len(a.fingerprint()) == 64
        for other in ("relabelled.bin", "one-pixel.bin"):
            with Store(tmp_path / other) as different:
                assert different.fingerprint() != a.fingerprint(), other


def test_repr_names_the_file_its_records_and_whether_it_is_closed(store_path):
    path, _ = store_path
    store = Store(path)
    assert repr(store) == f"Store({str(path)!r}, 20 records, 6x5x3 uint8, labels float64)"
    store.close()
    assert repr(store) == f"Store({str(path)!r}, closed, 6x5x3 uint8, labels float64)"


def test_identity_is_the_file_as_opened(store_path, tmp_path):
    """(device, inode, length, modification time): equal for two opens of one file, different
    once the file was replaced (what a DataLoader worker compares with the main process's)."""
    path, images = store_path
    identity = Store(path).identity
    assert len(identity) == 4 and all(isinstance(part, int) for part in identity)
    assert Store(path).identity == identity and identity[2] == os.path.getsize(path)
    write_store(tmp_path / "other.bin", images, np.arange(20) * 1.5)
    os.replace(tmp_path / "other.bin", path)
    assert Store(path).identity != identity


def test_indices_of_any_integer_dtype_gather_the_same_records(store_path):
    path, images = store_path
    store = Store(path)
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32):
        got, labels = store.gather(np.array([19, 0, 7], dtype))
        np.testing.assert_array_equal(got, images[[19, 0, 7]])
        np.testing.assert_array_equal(labels, [28.5, 0.0, 10.5])
    with pytest.raises(IndexError, match=r"^index 9223372036854775807 is out of range for a store of 20"):
        store.gather(np.array([2**63 - 1], np.uint64))  # the last int64: the store's bound, not the type's
    with pytest.raises(IndexError, match=r"^index 9223372036854775808 is out of range \(beyond int64\)$"):
        store.gather(np.array([2**63], np.uint64))
    with pytest.raises(
        IndexError, match=r"^index -1180591620717411303424 is out of range \(beyond 64 bits\)$"
    ):
        store.gather([5, -(2**70), 2**69])  # the one furthest out is named


def test_an_index_beyond_64_bits_is_an_index_error_both_ways(store_path):
    store = Store(store_path[0])
    for index in (2**63, -(2**63) - 1, 2**64, -(2**70)):
        with pytest.raises(IndexError, match=f"^index {index} is out of range for a store of 20 records$"):
            store[index]
    with pytest.raises(TypeError, match="^store indices must be integers, not str$"):
        store["3"]


class Foreign:
    """An array of another library: it has a `numpy()` method, as TensorFlow's tensors do."""

    def numpy(self):
        return np.zeros(3)


def test_output_buffers_of_another_library_are_refused_by_name(store_path):
    store = Store(store_path[0])
    with pytest.raises(TypeError, match="^out must be a NumPy array or a torch tensor, not Foreign$"):
        store.gather([0, 1], out=Foreign())
    with pytest.raises(TypeError, match="^labels_out must be a NumPy array or a torch tensor, not Foreign$"):
        store.gather([0, 1], labels_out=Foreign())
    with pytest.raises(TypeError, match=r"^out must have dtype uint8, not float32$"):
        store.gather([0, 1], out=np.zeros((2, 6, 5, 3), np.float32))
    with pytest.raises(ValueError, match=r"^labels_out must have shape \(2,\), not \(3,\)$"):
        store.gather([0, 1], labels_out=np.zeros(3))


def test_copy_in_order_of_no_records_writes_nothing_and_errors_are_exact(store_path):
    store = Store(store_path[0])
    batch = np.full((2, 6, 5, 3), 7, np.uint8)
    store.copy_in_order(4, 0, batch)
    assert (batch == 7).all()
    with pytest.raises(ValueError, match="^out must be a C-contiguous uint8 NumPy array$"):
        store.copy_in_order(0, 1, batch[:, :3])
    with pytest.raises(ValueError, match="^out must be writable$"):
        store.copy_in_order(0, 1, np.frombuffer(bytes(90), np.uint8))


def test_verify_with_limit_zero_counts_without_listing(store_path):
    path, _ = store_path
    stride = Store(path).images.strides[0]
    corrupt(path, 4096 + 3 * stride, b"\xff")
    corrupt(path, 4096 + 9 * stride, b"\xff")
    damaged = Store(path).verify(limit=0)
    assert damaged == [] and damaged.total == 2
    assert Store(path).verify(limit=1) == [3]
    with pytest.raises(ValueError, match="^limit must be a non-negative integer or None, not -1$"):
        Store(path).verify(limit=-1)


def test_a_label_that_is_not_one_number_is_refused_naming_its_shape(tmp_path):
    with StoreWriter(tmp_path / "s.bin", (2, 2, 3)) as writer:
        with pytest.raises(ValueError, match=r"^label must be one number, not of shape \(2,\)$"):
            writer.append(np.zeros((2, 2, 3), np.uint8), [1.0, 2.0])
        writer.append(np.zeros((2, 2, 3), np.uint8), 1.0)
    assert len(Store(tmp_path / "s.bin")) == 1


# Hostile files, damaged records, stores changed under readers, many readers at once
# (docs/RELIABILITY.md states the guarantees): every failure a clean StoreError, no leak, no crash.


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


def expected_header_error(position):
    if position < 8:
        return "magic"
    if position < 12:
        return "version"
    return "checksum"


@pytest.mark.safety
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


@pytest.mark.safety
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


@pytest.mark.safety
@pytest.mark.parametrize("extra", [b"\0", b"x" * 63, bytes(range(256)) * 16], ids=["1", "63", "4096"])
def test_appended_bytes_are_rejected(store, extra):
    path = store[0]
    with open(path, "ab") as f:
        f.write(extra)
    assert "trailing bytes" in open_error(path)


def test_the_image_section_is_where_the_header_says_for_readers_that_map_the_file(tmp_path):
    path = tmp_path / "s.fastload"
    images, _ = write(path, n=4)
    with Store(path) as store:
        assert store.images_offset == sections(path)["images"][0]
        mapped = np.memmap(path, np.uint8, "r", store.images_offset, (len(store), store.stride))
        assert np.array_equal(mapped[:, : images[0].size].reshape(images.shape), images)


@pytest.mark.safety
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


@pytest.mark.safety
def test_damaged_metadata_is_rejected_when_no_longer_json(store):
    path = store[0]
    offset, length = sections(path)["meta"]
    patch(path, offset, b"[")
    assert "bad metadata" in open_error(path)
    patch(path, offset, b"\xff")
    assert "UTF-8" in open_error(path)


@pytest.mark.safety
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


@pytest.mark.safety
def test_a_fifo_is_rejected_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = f"import fastload\ntry:\n    fastload.Store({str(fifo)!r})\nexcept fastload.StoreError as e:\n    print(e)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "not a regular file" in result.stdout


@pytest.mark.safety
@pytest.mark.parametrize("target", ["dir", "empty", "/dev/null", "/dev/zero"])
def test_special_files_are_rejected(tmp_path, target):
    path = {"dir": tmp_path, "empty": tmp_path / "empty"}.get(target, target)
    if target == "empty":
        path.write_bytes(b"")
    message = open_error(path)
    assert ("not a regular file" if target != "empty" else "truncated") in message


@pytest.mark.safety
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


@pytest.mark.safety
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


@pytest.mark.safety
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


@pytest.mark.safety
def test_truncation_under_a_reader_is_detected_before_touching_pages(store):
    path, images, _ = store
    s = Store(path)
    s.gather([0, 1])
    os.truncate(path, HEADER + 128)
    with pytest.raises(StoreError, match="changed length from .* to 4224 bytes"):
        s.check_unchanged()


@pytest.mark.safety
def test_rewrite_in_place_under_a_reader_is_detected(store):
    path, images, _ = store
    os.utime(path, (1_000_000_000, 1_000_000_000))  # a clearly older mtime than the rewrite
    s = Store(path)
    s.check_unchanged()
    xor(path, HEADER + 3, 0xFF)
    with pytest.raises(StoreError, match="modified in place"):
        s.check_unchanged()


@pytest.mark.safety
def test_dataset_stops_at_the_next_epoch_after_truncation(store):
    path, images, _ = store
    ds = FastLoadDataset(path, batch_size=2, shuffle=False, pin_memory=False)
    batches = list(ds)
    np.testing.assert_array_equal(np.concatenate([b[0].numpy() for b in batches]), images)
    os.truncate(path, HEADER)
    with pytest.raises(StoreError, match="changed length"):
        next(iter(ds))


@pytest.mark.safety
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


@pytest.mark.safety
def test_metadata_printed_by_info_and_verify_cannot_drive_the_terminal(tmp_path, capsys):
    """A source name holding `\\r\\x1b[2K...every record matches its checksum\\x1b[8m` made a failed
    verify read as a pass on a terminal; class names reach `info` the same way."""
    fake_pass = "\r\x1b[2Kevery record matches its checksum\x1b[8m"
    path = tmp_path / "hostile.fastload"
    with StoreWriter(
        path,
        (2, 2, 3),
        label_dtype="int64",
        meta={"sources": [fake_pass, "b.png"], "class_names": ["\x1b[31mcat", "dog\nrecords    999 images"]},
    ) as writer:
        writer.extend(np.zeros((2, 2, 2, 3), np.uint8), np.array([0, 1]))
    with Store(path) as store:
        offset = store.images_offset
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff")  # record 0 damaged
    assert cli.main(["verify", os.fspath(path)]) == 1
    assert cli.main(["info", os.fspath(path)]) == 0
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\r" not in out + err
    assert "damaged record 0 (\\r\\x1b[2Kevery record matches its checksum\\x1b[8m)" in out
    assert "classes    \\x1b[31mcat: 1, dog\\nrecords    999 images: 1" in out  # no line of its own


def test_info_on_a_csv_says_it_is_not_a_store(tmp_path, capsys):
    """A short file that is no store was reported as "truncated"; an empty one still is."""
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\na.png,1\n")
    assert cli.main(["info", os.fspath(csv)]) == 1
    assert capsys.readouterr().err == f"fastload info: error: {csv}: bad magic bytes: not a fastload store\n"


def test_info_counts_nan_labels_apart_from_the_numbers(tmp_path, capsys):
    """It printed "min nan max nan mean nan", whatever the other labels were."""
    path = tmp_path / "nan.fastload"
    with StoreWriter(path, (2, 2, 3)) as writer:
        writer.extend(np.zeros((4, 2, 2, 3), np.uint8), np.array([1.0, np.nan, 3.0, np.nan]))
    assert cli.main(["info", os.fspath(path)]) == 0
    assert "labels     min 1  max 3  mean 2; 2 NaN (not a number)\n" in capsys.readouterr().out
    assert fastload.inspect.info(path)["labels"] == {"min": 1.0, "max": 3.0, "mean": 2.0, "nan": 2}
