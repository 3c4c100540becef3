"""Compressed stores (#47) as a user sees them: `StoreWriter(encoding="jpeg")` and its size
budget, reading (`store[i]`, `gather`, `stored`, the refused `images`), the dataset and
DeviceLoader on such a store, `pack --encoding/--max-size`, `info` and `verify --decode`, and a
damaged JPEG record met as a clean StoreError naming it. The format's bounds are fuzzed in
`rust/fuzz_tests.rs` and `rust/table.rs`."""

import json
import subprocess
import sys

import numpy as np
import pytest

from fastload import Store, StoreError, StoreWriter
from fastload.dataset import FastLoadDataset
from fastload.inspect import info as info_store

SHAPE = (48, 64, 3)


def photos(n, shape=SHAPE, seed=0):
    """Photo-like records (smooth waves with a little noise): JPEG keeps them at 35-45 dB."""
    h, w, c = shape
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    out = np.empty((n, h, w, c), dtype=np.uint8)
    for i in range(n):
        for k in range(c):
            wave = 128 + 90 * np.sin((xx + 7 * i) / (9 + 3 * k)) * np.cos((yy + i) / (11 + k))
            out[i, ..., k] = np.clip(wave + rng.normal(0, 3, (h, w)), 0, 255)
    return out


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 100.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def write(path, images, labels, **kwargs):
    with StoreWriter(path, images.shape[1:], "int64", **kwargs) as w:
        w.extend(images, labels)
    return path


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    images = photos(40)
    path = write(tmp_path_factory.mktemp("c") / "c.fastload", images, np.arange(40) % 4, encoding="jpeg")
    return path, images


def test_records_read_back_decoded_within_the_quality_and_labels_exactly(compressed):
    path, images = compressed
    with Store(path) as s:
        assert (s.compressed, s.version, s.encodings) == (True, 2, {"raw": 0, "jpeg": 40})
        assert "40 JPEG-encoded" in repr(s)
        recorded = s.meta["encoding"]
        assert recorded["format"] == "jpeg" and recorded["quality"] == 90 and recorded["encoded"] == 40
        assert 35 < recorded["psnr_min"] <= recorded["psnr_mean"]
        image, label = s[7]
        assert image.shape == SHAPE and label == 3
        assert psnr(image, images[7]) >= recorded["psnr_min"] - 1e-6
        batch, labels = s.gather([39, 0, 7, 7])
        assert labels.tolist() == [3, 0, 3, 3]
        assert np.array_equal(batch[2], image) and np.array_equal(batch[2], batch[3])
        encoding, data = s.stored(7)
        assert encoding == "jpeg" and bytes(data[:2]) == b"\xff\xd8" and not data.flags.writeable
        assert s.file_size < images.nbytes / 4
        with pytest.raises(ValueError, match=r"stored compressed \(40 of 40 as JPEG\).*store\[i\]"):
            s.images  # noqa: B018 (the property refuses)
        assert s.verify(decode=True) == []


def test_quality_trades_size_for_psnr(tmp_path):
    images = photos(12)
    sizes, psnrs = [], []
    for quality in (50, 90, 100):
        path = write(
            tmp_path / f"q{quality}.fastload", images, np.zeros(12), encoding="jpeg", quality=quality
        )
        with Store(path) as s:
            sizes.append(s.file_size)
            psnrs.append(s.meta["encoding"]["psnr_mean"])
    assert sizes[0] < sizes[1] < sizes[2] and psnrs[0] < psnrs[1] < psnrs[2]


def test_a_budget_keeps_records_raw_spread_over_the_store_and_is_never_exceeded(tmp_path):
    images = photos(200)
    labels = np.arange(200) // 50  # four classes, in blocks
    with Store(write(tmp_path / "j.fastload", images, labels, encoding="jpeg")) as s:
        all_jpeg, mean_jpeg = s.file_size, s.meta["encoding"]["encoded_bytes"] / 200
    budget = all_jpeg + 60 * images[0].nbytes
    fit = 60 * images[0].nbytes / (images[0].nbytes - mean_jpeg)  # raw records the room holds
    path = write(
        tmp_path / "m.fastload", images, labels, encoding="jpeg", max_size=budget, expected_count=200, seed=5
    )
    with Store(path) as s:
        assert s.file_size <= budget
        raw = [i for i in range(200) if s.stored(i)[0] == "raw"]
        assert 0.8 * fit <= len(raw) <= fit and s.encodings["raw"] == len(raw)
        assert s.meta["encoding"]["raw_by_budget"] == len(raw)
        # Every class keeps some raw records: the draws do not follow the record order.
        assert {i // 50 for i in raw} == {0, 1, 2, 3}
        for i in raw:  # raw records are the pixels, bit for bit
            assert np.array_equal(s[i][0], images[i])
        assert s.verify(decode=True) == []


def test_a_budget_too_small_fails_at_commit_and_leaves_nothing(tmp_path):
    dest = tmp_path / "small.fastload"
    # The records already pass the bound after the first chunk: refused then, not at commit.
    with pytest.raises(
        ValueError, match="the first 20 records already take .* beyond the 5000 bytes allowed"
    ):
        write(dest, photos(20), np.zeros(20), encoding="jpeg", max_size=5000, expected_count=20)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"encoding": "png"}, "encoding must be one of raw, jpeg"),
        ({"encoding": "jpeg", "quality": 0}, "quality must be an integer from 1 to 100"),
        ({"encoding": "jpeg", "quality": 90.0}, "quality must be an integer from 1 to 100"),
        ({"max_size": 10**6, "expected_count": 3}, "give encoding='jpeg'"),
        ({"encoding": "jpeg", "max_size": 10**6}, "needs expected_count"),
        ({"encoding": "jpeg", "max_size": 0, "expected_count": 3}, "max_size must be an integer >= 1"),
    ],
)
def test_bad_encoding_options_are_refused_before_anything_is_written(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        StoreWriter(tmp_path / "s.fastload", SHAPE, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_four_channel_records_cannot_be_jpeg(tmp_path):
    with pytest.raises(ValueError, match="4 channels cannot be stored as JPEG"):
        StoreWriter(tmp_path / "s.fastload", (8, 8, 4), encoding="jpeg")


def test_grayscale_records_round_trip(tmp_path):
    images = photos(6, (32, 32, 1))
    with Store(write(tmp_path / "g.fastload", images, np.zeros(6), encoding="jpeg")) as s:
        assert s.encodings["jpeg"] == 6 and psnr(s[3][0], images[3]) > 30


# SHA-256 of a small raw store as the writer before compressed records (commit 228563c) wrote it:
# raw stores are written, and so read, byte for byte as before.
RAW_STORE_BEFORE_47 = "18c3fdc1f45832bd34d2b1d67226f8ff52fa063baf49b488f54b33b0d8445c21"


def test_a_raw_store_is_written_byte_for_byte_as_before_compressed_records(tmp_path):
    import hashlib

    from fastload import _core

    path = tmp_path / "golden.fastload"
    writer = _core.StoreWriter(path, (5, 7, 3), "int64", False)
    images = (np.arange(4 * 5 * 7 * 3) * 37 % 251).astype(np.uint8)
    writer.append_many(images, (np.arange(4, dtype=np.int64) * 3 - 5).view(np.uint8))
    writer.commit('{"note": "v1 golden"}')
    assert hashlib.sha256(path.read_bytes()).hexdigest() == RAW_STORE_BEFORE_47
    with Store(path) as s:
        assert s.version == 1 and np.array_equal(s.images.reshape(-1), images)
        assert s.labels.tolist() == [-5, -2, 1, 4]


def test_raw_stores_are_still_format_1(tmp_path):
    with Store(write(tmp_path / "r.fastload", photos(3), np.zeros(3))) as s:
        assert (s.version, s.compressed, s.encodings) == (1, False, {"raw": 3, "jpeg": 0})
        assert s.images.shape == (3, *SHAPE)
    header = (tmp_path / "r.fastload").read_bytes()[:16]
    assert header[:8] == b"FASTLOAD" and int.from_bytes(header[8:12], "little") == 1


def damage_record(path, index):
    """Overwrites the middle of record `index`'s JPEG bytes in the file (as a bad disk would)."""
    with Store(path) as s:
        _, data = s.stored(index)
        start = data.__array_interface__["data"][0] - s.stored(0)[1].__array_interface__["data"][0]
        offset = s.images_offset + start + len(data) // 2
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * 64)


@pytest.mark.safety
def test_a_damaged_jpeg_record_is_a_store_error_naming_it_and_verify_lists_it(tmp_path):
    path = write(tmp_path / "d.fastload", photos(10), np.arange(10), encoding="jpeg")
    damage_record(path, 4)
    with Store(path) as s:
        s.gather([0, 3, 5])  # the others still read
        with pytest.raises(StoreError, match=r"d\.fastload.*record 4 does not decode"):
            s.gather([3, 4])
        with pytest.raises(StoreError, match="record 4"):
            s[4]
        assert s.verify() == [4] and s.verify(decode=True) == [4]
        loader = FastLoadDataset(s, 5, order="sequential")
        with pytest.raises(StoreError, match="record 4 does not decode"):
            list(loader)
    proc = subprocess.run(
        [sys.executable, "-m", "fastload", "verify", "--decode", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "damaged record 4" in proc.stdout


def test_the_dataset_and_device_loader_read_every_record_of_a_compressed_store(compressed):
    from fastload import DeviceLoader

    path, images = compressed
    with Store(path) as s:
        decoded = s.gather(np.arange(40))[0]
    dataset = FastLoadDataset(path, 8, return_indices=True, seed=3)
    seen = []
    for batch, labels, indices in DeviceLoader(dataset, "cpu"):
        idx = indices.numpy()
        seen += idx.tolist()
        assert labels.numpy().tolist() == (idx % 4).tolist()
        expected = decoded[idx].transpose(0, 3, 1, 2) / 255.0
        assert np.allclose(batch.numpy(), expected, atol=1e-6)
    assert sorted(seen) == list(range(40))
    # A resume continues exactly as on a raw store: the order is the plan's, not the encoding's.
    raw = path.parent / "raw.fastload"
    if not raw.exists():
        write(raw, images, np.arange(40) % 4)
    orders = []
    for store in (path, raw):
        ds = FastLoadDataset(store, 8, return_indices=True, seed=3)
        it = iter(ds)
        next(it)
        state = ds.state_dict()
        resumed = FastLoadDataset(store, 8, return_indices=True, seed=3)
        resumed.load_state_dict(state)
        orders.append([b[2].tolist() for b in resumed])
    assert orders[0] == orders[1] and len(orders[0]) == 4


def test_pack_encodes_reports_psnr_and_info_and_verify_say_so(tmp_path):
    from PIL import Image

    src = tmp_path / "src"
    for i, image in enumerate(photos(12, (90, 120, 3))):
        (src / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(src / f"c{i % 3}" / f"{i}.jpg", quality=95)

    def fastload(*args):
        return subprocess.run(
            [sys.executable, "-m", "fastload", *map(str, args)], capture_output=True, text=True
        )

    done = fastload(
        "pack", src, tmp_path / "j.fastload", "--size", "64", "--encoding", "jpeg", "--quality", "85"
    )
    assert done.returncode == 0, done.stderr
    assert "encoded 12 of 12 records as JPEG quality 85 (PSNR against the raw records: mean" in done.stdout
    raw_size = 12 * (64 * 64 * 3 + 8)
    budget = Store(tmp_path / "j.fastload").file_size + raw_size // 3
    done = fastload("pack", src, tmp_path / "m.fastload", "--size", "64", "--max-size", budget)
    assert done.returncode == 0, done.stderr
    assert "kept raw" in done.stdout and "by the size budget" in done.stdout
    assert Store(tmp_path / "m.fastload").file_size <= budget
    summary = info_store(tmp_path / "m.fastload")
    encoding = summary["encoding"]
    assert encoding["jpeg"] + encoding["raw"] == 12 and encoding["raw"] > 0 and encoding["ratio"] > 1
    assert encoding["quality"] == 90 and encoding["psnr_min"] > 30 and encoding["fit_in_ram_stored"] > 0
    shown = fastload("info", tmp_path / "m.fastload")
    assert "encoding   " in shown.stdout and "records JPEG" in shown.stdout
    assert json.loads(fastload("info", "--json", tmp_path / "j.fastload").stdout)["encoding"]["raw"] == 0
    assert info_store(tmp_path / "j.fastload")["encoding"]["jpeg"] == 12
    checked = fastload("verify", "--decode", tmp_path / "m.fastload")
    assert checked.returncode == 0 and "every record matches its checksum and decodes" in checked.stdout
    refused = fastload("pack", src, tmp_path / "x.fastload", "--size", "64", "--max-size", "1kB")
    assert refused.returncode == 1 and "beyond the 1000 bytes allowed" in refused.stderr
    assert not (tmp_path / "x.fastload").exists()
    bad = fastload("pack", src, tmp_path / "y.fastload", "--max-size", "lots")
    assert bad.returncode == 1 and "max_size must be a size such as 150GB" in bad.stderr


def test_fit_trains_from_a_compressed_store(compressed):
    from fastload.train import fit

    path, _ = compressed
    result = fit(path, epochs=1, batch_size=8, seed=0)
    assert result.completed and result.steps == -(-(40 - len(result.val_indices)) // 8)
    assert np.isfinite(result.history[-1]["train_loss"])
