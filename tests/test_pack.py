"""`fastload.pack` / `fastload pack`: formats, orientation, resize geometry, labels,
bad input, determinism, interruption and exit codes. Fixtures are tiny images made with Pillow."""

from __future__ import annotations

import io
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

import fastload
import fastload.inspect
from fastload import BadFilesError
from fastload.cli import main as cli_main

SIZE = 32


def gradient(h: int = SIZE, w: int = SIZE, seed: int = 0) -> np.ndarray:
    """A smooth RGB image with some structure (JPEG keeps it close)."""
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(seed)
    a, b, c = rng.uniform(2, 6, 3)
    img = np.stack([x * a, y * b, (x + y) * c], axis=-1) + 20
    return np.clip(img, 0, 255).astype(np.uint8)


def png16(path: Path, arr: np.ndarray) -> None:
    """Writes a 16-bit PNG (gray H×W or RGB H×W×3), which Pillow cannot save."""
    h, w = arr.shape[:2]
    raw = b"".join(b"\x00" + arr[y].astype(">u2").tobytes() for y in range(h))
    write_png(path, struct.pack(">IIBBBBB", w, h, 16, 0 if arr.ndim == 2 else 2, 0, 0, 0), zlib.compress(raw))


def write_png(path: Path, ihdr: bytes, idat: bytes) -> None:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def pillow_rgb(path: Path) -> np.ndarray:
    """The reference: Pillow's decode, EXIF orientation applied, alpha composited on white."""
    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im)
        if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
            im = Image.alpha_composite(Image.new("RGBA", im.size, "white"), im.convert("RGBA"))
        return np.asarray(im.convert("RGB"))


def record(store: fastload.Store, source: str) -> np.ndarray:
    return np.asarray(store.images[store.meta["sources"].index(source)])


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def make_formats(folder: Path) -> dict:
    """One file per format and mode; returns {name: (largest mean abs diff allowed, expected or None)}."""
    folder.mkdir(parents=True)
    rgb = Image.fromarray(gradient())
    cases = {}
    for sub, name in [(2, "jpeg420.jpg"), (1, "jpeg422.jpg"), (0, "jpeg444.jpg")]:
        rgb.save(folder / name, quality=90, subsampling=sub)
        cases[name] = 2.5
    rgb.save(folder / "progressive.jpeg", quality=90, progressive=True)
    rgb.convert("L").save(folder / "gray.jpg", quality=90)
    rgb.convert("CMYK").save(folder / "cmyk.jpg", quality=95)
    rgb.save(folder / "UPPER.JPG", quality=90)
    rgb.save(folder / "café_猫.png")
    rgb.save(folder / "rgb.png")
    rgb.convert("L").save(folder / "gray.png")
    rgb.convert("P").save(folder / "palette.png")
    rgba = np.dstack([gradient(), np.tile(np.linspace(0, 255, SIZE, dtype=np.uint8), (SIZE, 1))])
    Image.fromarray(rgba, "RGBA").save(folder / "alpha.png")
    Image.fromarray(rgba[..., [0, 3]], "LA").save(folder / "gray_alpha.png")
    palette = rgb.convert("P")
    palette.info["transparency"] = 0
    palette.save(folder / "palette_transparent.png", transparency=0)
    rgb.save(folder / "lossless.webp", lossless=True)
    rgb.save(folder / "lossy.webp", quality=90)
    rgb.save(folder / "image.bmp")
    rgb.save(folder / "image.tiff")
    red, blue = (Image.new("RGB", (SIZE, SIZE), c) for c in ("red", "blue"))
    red.save(folder / "animated.gif", save_all=True, append_images=[blue])
    for name in [
        "café_猫.png",
        "rgb.png",
        "gray.png",
        "palette.png",
        "alpha.png",
        "gray_alpha.png",
        "palette_transparent.png",
        "lossless.webp",
        "image.bmp",
        "image.tiff",
        "animated.gif",
    ]:
        cases[name] = 0.6
    cases.update(
        {"progressive.jpeg": 2.5, "gray.jpg": 2.5, "cmyk.jpg": 3.0, "UPPER.JPG": 2.5, "lossy.webp": 3.0}
    )
    cases = {name: (tol, None) for name, tol in cases.items()}
    level16 = (np.arange(SIZE * SIZE, dtype=np.uint16).reshape(SIZE, SIZE) * 61).astype(np.uint16)
    png16(folder / "gray16.png", level16)
    png16(folder / "rgb16.png", np.dstack([level16, 65535 - level16, level16 // 2]))
    as8 = np.round(level16 / 257).astype(np.uint8)
    cases["gray16.png"] = (0.6, np.dstack([as8] * 3))
    cases["rgb16.png"] = (0.6, np.dstack([as8, 255 - as8, np.round(level16 // 2 / 257).astype(np.uint8)]))
    return cases


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    src = tmp_path_factory.mktemp("formats")
    cases = make_formats(src / "all")
    store = fastload.Store(fastload.pack(src, src.parent / "formats.fl", SIZE, resize="squash").path)
    return src / "all", cases, store


@pytest.mark.parametrize(
    "name",
    [
        "jpeg420.jpg",
        "jpeg422.jpg",
        "jpeg444.jpg",
        "progressive.jpeg",
        "gray.jpg",
        "cmyk.jpg",
        "UPPER.JPG",
        "café_猫.png",
        "rgb.png",
        "gray.png",
        "palette.png",
        "alpha.png",
        "gray_alpha.png",
        "palette_transparent.png",
        "gray16.png",
        "rgb16.png",
        "lossless.webp",
        "lossy.webp",
        "image.bmp",
        "image.tiff",
        "animated.gif",
    ],
)
def test_every_format_packs_close_to_pillow(formats, name):
    folder, cases, store = formats
    tolerance, expected = cases[name]
    got = record(store, f"all/{name}")
    assert got.shape == (SIZE, SIZE, 3)
    reference = pillow_rgb(folder / name) if expected is None else expected
    assert mean_abs_diff(got, reference) <= tolerance


def test_gif_gives_its_first_frame_and_alpha_lands_on_white(formats):
    _, _, store = formats
    gif = record(store, "all/animated.gif")
    assert (gif[..., 0] > 240).all() and (gif[..., 2] < 15).all()
    transparent_column = record(store, "all/alpha.png")[:, 0]  # alpha 0 in the first column
    assert (transparent_column == 255).all()


@pytest.mark.parametrize(
    "orientation, top, bottom", [(6, "red", "blue"), (8, "blue", "red"), (1, None, None)]
)
def test_exif_orientation_is_applied(tmp_path, orientation, top, bottom):
    # Stored 32 wide x 16 high: left half red, right half blue.
    pixels = np.zeros((16, 32, 3), np.uint8)
    pixels[:, :16] = (255, 0, 0)
    pixels[:, 16:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = orientation
    (tmp_path / "src" / "c").mkdir(parents=True)
    Image.fromarray(pixels).save(tmp_path / "src" / "c" / "photo.jpg", quality=95, exif=exif)
    store = fastload.Store(fastload.pack(tmp_path / "src", tmp_path / "s.fl", (32, 16), resize="squash").path)
    image = store.images[0].astype(int)
    colour = {"red": (255, 0, 0), "blue": (0, 0, 255)}
    if top is None:  # no rotation: 16 x 32 squashed to 32 x 16 keeps red left, blue right
        assert np.abs(image[:, 2] - colour["red"]).max() < 40
        assert np.abs(image[:, -3] - colour["blue"]).max() < 40
    else:  # rotated to 16 wide x 32 high: one colour on top, the other at the bottom
        assert np.abs(image[2] - colour[top]).max() < 40
        assert np.abs(image[-3] - colour[bottom]).max() < 40


def test_resize_modes_give_their_geometry(tmp_path):
    wide = np.zeros((32, 64, 3), np.uint8)
    wide[:, :16] = (255, 0, 0)  # left quarter red, middle half green, right quarter blue
    wide[:, 16:48] = (0, 255, 0)
    wide[:, 48:] = (0, 0, 255)
    (tmp_path / "src" / "c").mkdir(parents=True)
    Image.fromarray(wide).save(tmp_path / "src" / "c" / "wide.png")
    pil = Image.fromarray(wide)
    packed = {}
    for mode in ("squash", "crop", "pad"):
        report = fastload.pack(tmp_path / "src", tmp_path / f"{mode}.fl", 32, resize=mode, fill=(9, 8, 7))
        packed[mode] = np.asarray(fastload.Store(report.path).images[0])
    # pad: the 64x32 image becomes 32x16 between two 8-row bars of the fill colour
    assert (packed["pad"][:8] == (9, 8, 7)).all() and (packed["pad"][24:] == (9, 8, 7)).all()
    pad_reference = np.asarray(ImageOps.pad(pil, (32, 32), Image.LANCZOS, color=(9, 8, 7)))
    assert mean_abs_diff(packed["pad"], pad_reference) < 1.0
    # crop: only the green centre is left
    assert (packed["crop"][..., 1] > 240).all() and (packed["crop"][..., [0, 2]] < 15).all()
    assert mean_abs_diff(packed["crop"], np.asarray(ImageOps.fit(pil, (32, 32), Image.LANCZOS))) < 1.0
    # squash: every colour stays, squeezed
    assert (packed["squash"][:, 1, 0] > 240).all() and (packed["squash"][:, -2, 2] > 240).all()
    assert mean_abs_diff(packed["squash"], np.asarray(pil.resize((32, 32), Image.LANCZOS))) < 1.0


def photo_folder(root: Path, names, size: int = 8) -> Path:
    for i, name in enumerate(names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(gradient(size, size, seed=i)).save(root / name)
    return root


@pytest.mark.parametrize("header", [True, False])
@pytest.mark.parametrize("encoding, newline", [("utf-8", "\n"), ("utf-8-sig", "\r\n")])
def test_csv_labels_land_on_their_records(tmp_path, header, encoding, newline):
    src = photo_folder(tmp_path / "src", ["b.png", "a.png", "sub/c.png"])
    rows = ["path,target"] * header + ["sub/c.png,2.5", "a.png,-1", "b.png,7.25"]
    (tmp_path / "labels.csv").write_bytes(newline.join(rows).encode(encoding) + newline.encode())
    store = fastload.Store(fastload.pack(src, tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv").path)
    assert store.meta["sources"] == ["a.png", "b.png", "sub/c.png"]
    assert store.label_dtype == np.float64
    assert store.labels.tolist() == [-1.0, 7.25, 2.5]


def test_class_folders_give_class_indices_and_names(tmp_path):
    src = photo_folder(tmp_path / "src", ["dog/1.png", "cat/2.png", "cat/1.png", "emu/x/deep.png"])
    progress = []
    report = fastload.pack(
        src, tmp_path / "s.fl", 8, progress=lambda done, total: progress.append((done, total))
    )
    store = fastload.Store(report.path)
    assert store.meta["class_names"] == ["cat", "dog", "emu"]
    assert store.meta["sources"] == ["cat/1.png", "cat/2.png", "dog/1.png", "emu/x/deep.png"]
    assert store.labels.tolist() == [0, 0, 1, 2] and store.label_dtype == np.int64
    assert store.meta["pack"]["resize"] == "crop" and store.meta["skipped"] == []
    assert progress[-1] == (4, 4) and report.records == 4


def test_class_folders_that_read_as_one_name_are_refused(tmp_path):
    """Two folders may differ as bytes yet read the same ('é' as one code point or as e and an
    accent): their classes would show as one."""
    src = photo_folder(tmp_path / "src", ["\u00e9/1.png", "e\u0301/2.png", "x/3.png"])
    with pytest.raises(
        ValueError, match="class folders that read as one name: 'é' .*different Unicode forms"
    ):
        fastload.pack(src, tmp_path / "s.fl", 8)
    assert not (tmp_path / "s.fl").exists()


def test_a_file_name_that_is_not_utf8_packs(tmp_path):
    (tmp_path / "src" / "c").mkdir(parents=True)
    name = os.fsdecode(b"bad\xffname.png")  # a byte that is not UTF-8 (Linux allows it)
    Image.fromarray(gradient(8, 8)).save(tmp_path / "src" / "c" / name, format="PNG")
    store = fastload.Store(fastload.pack(tmp_path / "src", tmp_path / "s.fl", 8).path)
    assert store.meta["sources"] == ["c/bad\ufffdname.png"] and len(store) == 1


def test_verify_names_the_source_of_a_damaged_record(tmp_path):
    src = photo_folder(tmp_path / "src", ["c/a.png", "c/b.png", "d/c.png"])
    path = fastload.pack(src, tmp_path / "s.fl", 8).path
    stride = fastload.Store(path)._core.stride
    with open(path, "r+b") as f:  # flip one byte of record 1's image (the image section starts at 4096)
        f.seek(4096 + stride + 5)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert fastload.inspect.verify(path) == [(1, "c/b.png")]


def test_repacking_gives_identical_sections(tmp_path):
    src = photo_folder(tmp_path / "src", [f"c{i % 3}/{i}.png" for i in range(40)], size=24)
    first = fastload.Store(fastload.pack(src, tmp_path / "1.fl", 16, resize="pad", workers=2).path)
    second = fastload.Store(fastload.pack(src, tmp_path / "2.fl", 16, resize="pad", workers=1).path)
    assert first.images.tobytes() == second.images.tobytes()
    assert first.labels.tobytes() == second.labels.tobytes()


def bad_folder(root: Path) -> dict:
    """A class folder with one good image and one of each kind of bad file; returns {file: reason part}."""
    good = photo_folder(root, ["c/good.jpg"], size=32) / "c"
    jpeg = (good / "good.jpg").read_bytes()
    (good / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    png = Path(root / "tmp.png")
    Image.fromarray(gradient()).save(png)
    (good / "truncated.png").write_bytes(png.read_bytes()[: png.stat().st_size // 2])
    png.unlink()
    (good / "corrupt.jpg").write_bytes(jpeg[:20] + bytes(range(256)) * 4)
    (good / "empty.png").write_bytes(b"")
    (good / "notes.txt").write_text("not a picture")
    (good / ".hidden.jpg").write_bytes(jpeg)
    (good / "folder.jpg").mkdir()
    # A 20000 x 20000 PNG header with almost no data: a decompression bomb.
    write_png(
        good / "bomb.png", struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0), zlib.compress(b"\0" * 1000)
    )
    return {
        "c/truncated.jpg": "truncated",
        "c/truncated.png": "truncated",
        "c/corrupt.jpg": "corrupt",
        "c/empty.png": "empty",
        "c/notes.txt": "not an image",
        "c/.hidden.jpg": "hidden",
        "c/folder.jpg": "folder",
        "c/bomb.png": "refused",
    }


#: What `strict` does not refuse: files left out by rule.
SKIPPED_BY_RULE = {"c/.hidden.jpg"}


def partials(folder: Path) -> list:
    return [p.name for p in folder.iterdir() if p.name.endswith(".fastload-partial")]


def test_bad_files_are_skipped_with_their_reason(tmp_path):
    expected = bad_folder(tmp_path / "src")
    report = fastload.pack(tmp_path / "src", tmp_path / "s.fl", 16)
    store = fastload.Store(report.path)
    assert report.records == 1 and store.meta["sources"] == ["c/good.jpg"]
    reasons = dict(report.skipped)
    assert sorted(reasons) == sorted(expected)
    for name, part in expected.items():
        assert part in reasons[name], (name, reasons[name])
    assert {s["file"]: s["reason"] for s in store.meta["skipped"]} == reasons
    assert "bomb.png" in str(report) and "packed 1 image " in str(report)


def test_strict_names_every_bad_file_and_writes_nothing(tmp_path):
    expected = set(bad_folder(tmp_path / "src")) - SKIPPED_BY_RULE
    with pytest.raises(BadFilesError) as err:
        fastload.pack(tmp_path / "src", tmp_path / "s.fl", 16, strict=True)
    assert sorted(name for name, _ in err.value.files) == sorted(expected)
    assert all(name in str(err.value) for name in expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def damaged_jpeg(path: Path, flips: int = 24) -> None:
    """A photo-like JPEG with `flips` bytes of its entropy-coded data (after the start-of-scan
    header, from the middle of the scan on) changed; 0xFF bytes and their neighbours are left
    alone, so no marker is made or unmade: libjpeg decodes it with warnings."""
    buffer = io.BytesIO()
    Image.fromarray(gradient(192, 256)).save(buffer, "JPEG", quality=90)
    data = bytearray(buffer.getvalue())
    sos = data.index(b"\xff\xda")
    scan = sos + 2 + struct.unpack(">H", data[sos + 2 : sos + 4])[0]
    at, changed = scan + (len(data) - 2 - scan) // 2, 0
    while changed < flips:
        flipped = data[at] ^ 0x5A
        if 0xFF not in (data[at], data[at - 1], flipped):
            data[at] = flipped
            changed += 1
        at += 7
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(data))


def test_a_damaged_jpeg_is_packed_and_listed_with_its_decoder_warnings(tmp_path):
    src = photo_folder(tmp_path / "src", ["c/clean.jpg", "c/z.png"], size=64)
    damaged_jpeg(src / "c" / "flipped.jpg")
    report = fastload.pack(src, tmp_path / "s.fl", 16)
    assert report.records == 3 and report.skipped == []
    assert [name for name, _ in report.decode_warnings] == ["c/flipped.jpg"]
    warnings = report.decode_warnings[0][1]
    assert warnings and all("Corrupt JPEG data" in w or "Premature end" in w for w in warnings), warnings
    text = str(report)
    assert "decoded with warnings: 1 damaged image(s)" in text and "c/flipped.jpg: Corrupt JPEG data" in text
    store = fastload.Store(report.path)
    assert store.meta["sources"] == ["c/clean.jpg", "c/flipped.jpg", "c/z.png"]
    assert store.meta["decode_warnings"] == [{"file": "c/flipped.jpg", "record": 1, "warnings": warnings}]


def test_strict_refuses_a_damaged_jpeg_but_not_files_skipped_by_rule(tmp_path, capsys):
    src = photo_folder(tmp_path / "src", ["c/clean.jpg", "d/other.jpg"], size=64)
    (src / "c" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (src / ".hidden").mkdir()
    (src / ".hidden" / "x.jpg").write_bytes(b"not read")
    report = fastload.pack(src, tmp_path / "clean.fl", 16, strict=True)
    assert report.records == 2 and report.decode_warnings == []
    assert sorted(report.skipped) == [(".hidden", "hidden folder"), ("c/.DS_Store", "hidden file")]

    damaged_jpeg(src / "c" / "flipped.jpg")
    with pytest.raises(BadFilesError) as err:
        fastload.pack(src, tmp_path / "s.fl", 16, strict=True)
    assert [name for name, _ in err.value.files] == ["c/flipped.jpg"]
    assert "c/flipped.jpg: decoded with warnings: Corrupt JPEG data" in str(err.value)
    assert not (tmp_path / "s.fl").exists()
    assert cli_main(["pack", str(src), str(tmp_path / "s.fl"), "--size", "16", "--strict", "--quiet"]) == 1
    assert "c/flipped.jpg: decoded with warnings" in capsys.readouterr().err
    assert not (tmp_path / "s.fl").exists()


def test_csv_problems_are_reported_with_line_numbers(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png", "b.png", "c.png", "d.png"])
    (tmp_path / "labels.csv").write_text(
        "path,label\na.png,1\nmissing.png,2\nb.png,abc\nc.png,nan\nd.png,inf\na.png,3\n"
    )
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv")
    message = str(err.value)
    for line, what in [
        (3, "missing.png does not exist"),
        (4, "not a number"),
        (5, "not a finite"),
        (6, "not a finite"),
        (7, "already has a label on line 2"),
    ]:
        assert f"line {line}: " in message and what in message
    assert not (tmp_path / "s.fl").exists()


def test_int64_labels_must_be_whole(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png"])
    (tmp_path / "labels.csv").write_text("a.png,1.5\n")
    with pytest.raises(ValueError, match="line 1: a.png: label '1.5' is not a whole number"):
        fastload.pack(src, tmp_path / "s.fl", 8, labels=tmp_path / "labels.csv", label_dtype="int64")


def test_unlabelled_images_fail_unless_skipped(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png", "b.png"])
    (src / "labels.csv").write_text("a.png,4\n")  # a labels file inside SRC is not an image to pack
    with pytest.raises(ValueError, match=r"1 image\(s\) have no label.*skip_unlabelled.*\n  b.png"):
        fastload.pack(src, tmp_path / "s.fl", 8, labels=src / "labels.csv")
    report = fastload.pack(
        src, tmp_path / "s.fl", 8, labels=src / "labels.csv", skip_unlabelled=True, strict=True
    )
    assert report.records == 1 and report.skipped == [("b.png", "no label (skipped by request)")]
    assert fastload.Store(report.path).labels.tolist() == [4]


def test_no_labels_at_all_explains_both_ways(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png"])
    with pytest.raises(ValueError, match="no labels") as err:
        fastload.pack(src, tmp_path / "s.fl", 8)
    assert "labels" in str(err.value) and "subfolder per class" in str(err.value)


def test_a_flat_folder_packs_without_labels_and_says_so(tmp_path, capsys):
    src = photo_folder(tmp_path / "src", ["b.png", "a.jpg", "sub/c.png"])
    (src / "notes.txt").write_text("not an image")
    report = fastload.pack(src, tmp_path / "s.fl", 8, no_labels=True, strict=True)
    assert report.records == 3 and report.skipped == [
        ("notes.txt", "not an image file (no label, no image extension)")
    ]
    store = fastload.Store(report.path)
    assert store.meta["sources"] == ["a.jpg", "b.png", "sub/c.png"] and store.labels.tolist() == [0, 0, 0]
    assert store.meta["labels"] == "none" and store.meta["pack"]["labels"] == "none" and not store.labelled
    assert "class_names" not in store.meta
    floats = fastload.Store(
        fastload.pack(src, tmp_path / "f.fl", 8, no_labels=True, label_dtype="float64").path
    )
    assert np.isnan(floats.labels).all() and not floats.labelled
    summary = fastload.inspect.info(store.path)
    assert summary["labelled"] is False and summary["labels"] == {}
    assert cli_main(["info", str(store.path)]) == 0
    assert "3 images of 8x8x3 uint8, no labels (packed with --no-labels)" in capsys.readouterr().out
    assert cli_main(["pack", str(src), str(tmp_path / "c.fl"), "--size", "8", "--no-labels", "--quiet"]) == 0
    assert not fastload.Store(tmp_path / "c.fl").labelled
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("a.jpg,1\n")
    with pytest.raises(ValueError, match="not both"):
        fastload.pack(src, tmp_path / "x.fl", 8, no_labels=True, labels=csv_path)
    with pytest.raises(SystemExit) as usage:
        cli_main(["pack", str(src), str(tmp_path / "x.fl"), "--no-labels", "--labels", str(csv_path)])
    assert usage.value.code == 2


def test_without_labels_the_error_offers_no_labels(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png"])
    with pytest.raises(ValueError, match=r"no labels\. .*--no-labels"):
        fastload.pack(src, tmp_path / "s.fl", 8)


def test_info_calls_whole_number_labels_of_a_csv_values_not_classes(tmp_path, capsys):
    src = photo_folder(tmp_path / "src", ["a.png", "b.png", "c.png"])
    (tmp_path / "ages.csv").write_text("a.png,30\nb.png,41\nc.png,30\n")
    store = fastload.pack(src, tmp_path / "s.fl", 8, labels=tmp_path / "ages.csv").path
    labels = fastload.inspect.info(store)["labels"]
    assert "classes" not in labels and labels["values"] == {"30": 2, "41": 1} and labels["distinct"] == 2
    assert labels["min"] == 30 and labels["max"] == 41
    assert cli_main(["info", str(store)]) == 0
    out = capsys.readouterr().out
    assert "\nclasses " not in out and "values     2 distinct whole numbers: 30: 2, 41: 1" in out


@pytest.mark.parametrize("command", ["info", "verify"])
def test_info_and_verify_help_describe_the_command_and_store(command, capsys):
    with pytest.raises(SystemExit):
        cli_main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "STORE a store file written by `fastload pack` or StoreWriter" in text
    assert ("Recompute the checksum" if command == "verify" else "Print what STORE holds") in text


def test_demo_seed_has_help(capsys):
    with pytest.raises(SystemExit):
        cli_main(["demo", "--help"])
    assert "seed of the generated photos" in " ".join(capsys.readouterr().out.split())


def test_a_folder_without_images_says_so_not_no_labels(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"empty: no images found \(nothing; images are files ending in"):
        fastload.pack(empty, tmp_path / "s.fl", 8)
    (empty / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"no images found \(1 other file\(s\);"):
        fastload.pack(empty, tmp_path / "s.fl", 8, labels=None)
    result = subprocess.run(
        [sys.executable, "-m", "fastload", "pack", str(empty), str(tmp_path / "s.fl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "no images found" in result.stderr
    assert not (tmp_path / "s.fl").exists()


def test_csv_rows_for_missing_files_fail_unless_skipped(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png", "b.png"])
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("a.png,1.5\ngone.png,2\nb.png,3\n")
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8, labels=csv_path)
    assert "line 2: gone.png does not exist in" in str(err.value)
    assert str(err.value).count("--skip-missing") == 1  # the advice once, not on every row
    assert not (tmp_path / "s.fl").exists()
    report = fastload.pack(src, tmp_path / "s.fl", 8, labels=csv_path, skip_missing=True, strict=True)
    assert report.records == 2
    assert report.skipped == [("gone.png", "in the labels CSV, but no such file (skipped by request)")]
    assert fastload.Store(report.path).labels.tolist() == [1.5, 3.0]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastload",
            "pack",
            str(src),
            str(tmp_path / "t.fl"),
            "--size",
            "8",
            "--labels",
            str(csv_path),
            "--skip-missing",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "gone.png" in result.stdout and len(fastload.Store(tmp_path / "t.fl")) == 2


def test_csv_paths_with_a_folder_too_many_are_explained_once(tmp_path, capsys):
    names = [f"{c}/{i}.png" for c in ("cat", "dog") for i in range(18)]
    src = photo_folder(tmp_path / "classes", names)
    csv_path = tmp_path / "labels.csv"  # beside SRC, its paths written from there
    csv_path.write_text("path,label\n" + "".join(f"classes/{n},{int(n.startswith('dog'))}\n" for n in names))
    for skip in (False, True):
        with pytest.raises(ValueError) as err:
            fastload.pack(src, tmp_path / "s.fl", 8, labels=csv_path, skip_missing=skip)
        message = str(err.value)
        assert "none of its 36 paths names a file in SRC" in message
        assert "all 36 start with `classes/`: they are relative to the CSV's folder" in message
        assert "without `classes/`), e.g. `cat/0.png`" in message
        assert "skip-missing" not in message and "no images to pack" not in message
        assert len(message.splitlines()) == 1
    assert (
        cli_main(["pack", str(src), str(tmp_path / "s.fl"), "--labels", str(csv_path), "--skip-missing"]) == 1
    )
    assert capsys.readouterr().err.count("classes/") == 2


def test_csv_paths_naming_nothing_say_so_once_with_the_first_rows(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png"])
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("".join(f"elsewhere{i}.png,{i}\n" for i in range(35)))
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8, labels=csv_path)
    message = str(err.value)
    assert "none of its 35 paths names a file in SRC" in message and "skip-missing" not in message
    assert "elsewhere2.png" in message and "elsewhere3.png" not in message and "... and 32 more" in message


def test_class_names_as_csv_labels_become_classes(tmp_path, capsys):
    src = photo_folder(tmp_path / "src", ["a.png", "b.png", "c.png", "d.png"])
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("file,animal\na.png,dogs\nb.png, cats\nc.png,dogs\nd.png,emus\n")
    store = fastload.Store(fastload.pack(src, tmp_path / "s.fl", 8, labels=csv_path).path)
    assert store.meta["class_names"] == ["cats", "dogs", "emus"] and store.label_dtype == np.int64
    assert store.labels.tolist() == [1, 0, 1, 2]
    assert fastload.inspect.info(store.path)["labels"]["classes"] == {"cats": 1, "dogs": 2, "emus": 1}
    # Without a header the first row is data: its name is another row's label.
    csv_path.write_text("a.png,dogs\nb.png,cats\nc.png,dogs\nd.png,dogs\n")
    store = fastload.Store(fastload.pack(src, tmp_path / "t.fl", 8, labels=csv_path).path)
    assert store.labels.tolist() == [1, 0, 1, 1]
    csv_path.write_text("a.png,dogs\nb.png,2\nc.png,dogs\nd.png,1\n")
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "u.fl", 8, labels=csv_path)
    assert "label 'dogs' is not a number" in str(err.value) and "or all of them class names" in str(err.value)
    csv_path.write_text("a.png,dogs\nb.png,cats\nc.png,dogs\nd.png,dogs\n")
    with pytest.raises(ValueError, match="label 'dogs' is not a number"):
        fastload.pack(src, tmp_path / "v.fl", 8, labels=csv_path, label_dtype="float64")


def test_too_many_names_for_the_metadata_fail_before_decoding(tmp_path, monkeypatch):
    src = photo_folder(tmp_path / "src", [f"c/{i}.png" for i in range(20)])
    monkeypatch.setattr(fastload._core, "MAX_META_LEN", 100)
    with pytest.raises(ValueError, match="metadata limit; pack the folder as several stores"):
        fastload.pack(src, tmp_path / "s.fl", 8)
    assert list(tmp_path.iterdir()) == [src]


def test_destination_rules(tmp_path):
    src = photo_folder(tmp_path / "src", ["c/a.png"])
    dest = tmp_path / "s.fl"
    dest.write_bytes(b"precious")
    with pytest.raises(FileExistsError):
        fastload.pack(src, dest, 8)
    assert dest.read_bytes() == b"precious"
    fastload.pack(src, dest, 8, overwrite=True)
    assert len(fastload.Store(dest)) == 1
    for inside in (src / "s.fl", src / "c" / "a.png", src):
        with pytest.raises(ValueError, match="inside the source folder"):
            fastload.pack(src, inside, 8, overwrite=True)
    assert (src / "c" / "a.png").stat().st_size > 0 and not (src / "s.fl").exists()
    with pytest.raises(FileNotFoundError):
        fastload.pack(tmp_path / "nowhere", tmp_path / "t.fl", 8)


def test_cli_exit_codes(tmp_path, capsys):
    bad_folder(tmp_path / "src")
    assert (
        cli_main(["pack", str(tmp_path / "src"), str(tmp_path / "s.fl"), "--size", "16", "--workers", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "packed 1 image " in out and "c/notes.txt: not an image" in out
    assert cli_main(["pack", str(tmp_path / "src"), str(tmp_path / "t.fl"), "--strict", "--quiet"]) == 1
    assert "c/bomb.png" in capsys.readouterr().err and not (tmp_path / "t.fl").exists()
    assert cli_main(["pack", str(tmp_path / "src"), str(tmp_path / "s.fl")]) == 1  # exists
    assert cli_main(["pack", str(tmp_path / "nowhere"), str(tmp_path / "n.fl")]) == 1
    (tmp_path / "no_images" / "c").mkdir(parents=True)
    (tmp_path / "no_images" / "c" / "notes.txt").write_text("text")
    assert cli_main(["pack", str(tmp_path / "no_images"), str(tmp_path / "n.fl")]) == 1
    assert "no images found (1 other file(s)" in capsys.readouterr().err
    for usage in (["--resize", "stretch"], ["--size", "0"], ["--fill", "1,2"], ["--workers", "x"]):
        with pytest.raises(SystemExit) as exit_:
            cli_main(["pack", str(tmp_path / "src"), str(tmp_path / "u.fl"), *usage])
        assert exit_.value.code == 2
    assert (
        cli_main(
            [
                "pack",
                str(tmp_path / "src"),
                str(tmp_path / "p.fl"),
                "--height",
                "8",
                "--width",
                "12",
                "--resize",
                "pad",
                "--fill",
                "1,2,3",
                "--quiet",
            ]
        )
        == 0
    )
    assert fastload.Store(tmp_path / "p.fl").shape == (8, 12, 3)


@pytest.fixture(scope="module")
def big_folder(tmp_path_factory):
    """Enough noisy photos that one worker takes a few seconds to pack them."""
    root = tmp_path_factory.mktemp("big") / "src"
    rng = np.random.default_rng(1)
    noise = rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)
    for i in range(120):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.roll(noise, i, axis=1)).save(root / f"c{i % 2}" / f"{i:03}.jpg", quality=95)
    return root


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_interrupted_pack_leaves_nothing(tmp_path, big_folder, sig):
    dest = tmp_path / "s.fl"
    command = [
        sys.executable,
        "-m",
        "fastload",
        "pack",
        str(big_folder),
        str(dest),
        "--size",
        "512",
        "--resize",
        "squash",
        "--workers",
        "1",
        "--quiet",
    ]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not partials(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # well into decoding and writing
    assert proc.poll() is None, "the pack finished before it could be interrupted"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert not dest.exists()
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and b"interrupted" in err
        assert partials(tmp_path) == []
    else:
        assert proc.returncode == -signal.SIGKILL
    subprocess.run(command[:6] + ["--size", "16", "--quiet"], check=True)
    assert len(fastload.Store(dest)) == 120
    assert partials(tmp_path) == []
