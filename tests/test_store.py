"""Store and StoreWriter as a user sees them: round trips, zero-copy views, gather, bad files."""

import gc
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fastload
import fastload.inspect
from fastload import Store, StoreError, StoreWriter


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
        (lambda p: corrupt(p, 8, struct.pack("<I", 2)), "version 2"),
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
    ],
)
def test_class_names_shared_by_two_classes_are_refused(tmp_path, names, shared):
    """A reader counts records per class name: two classes of one name would merge."""
    with pytest.raises(ValueError, match="one name to several classes") as error:
        StoreWriter(tmp_path / "s.bin", (2, 2, 1), label_dtype="int64", meta={"class_names": names})
    assert shared in str(error.value)
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
