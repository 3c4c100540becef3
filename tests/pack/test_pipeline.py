"""`fastload.pack` / `fastload pack`, the pipeline (`fastload/pack/pipeline.py`): formats,
orientation, resize geometry, bad and damaged files, strict, bounded workers and record sizes,
determinism, interruption (Ctrl-C included) and exit codes, and the report's escaped names.
Fixtures are tiny images made with Pillow (tests/pack_helpers.py)."""

from __future__ import annotations

import errno
import io
import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from pack_helpers import ESCAPED, HOSTILE, SIZE, classes, cli, gradient, image, photo_folder
from PIL import Image, ImageOps

import fastload
import fastload.inspect
from fastload import BadFilesError, _core
from fastload.cli import main as cli_main
from fastload.pack import PackReport, pipeline


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


@pytest.mark.safety
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


@pytest.mark.safety
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


@pytest.mark.safety
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


@pytest.mark.safety
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


# Control characters in names


@pytest.mark.safety
def test_control_characters_in_names_are_printed_escaped(tmp_path, capsys):
    src = classes(tmp_path / "src")
    (src / "cat" / HOSTILE).write_bytes(b"not an image")
    (src / "cat" / "bidi\u202egpj.exe.png").write_bytes(b"not an image either")
    report = fastload.pack(src, tmp_path / "s.fl", 8)
    assert (f"cat/{HOSTILE}", "not an image (unrecognised file format)") in report.skipped
    text = str(report)
    assert f"cat/{ESCAPED}: not an image" in text and "cat/bidi\\u202egpj.exe.png" in text
    assert not any(c in text for c in "\x1b\r\u202e")
    store = fastload.Store(tmp_path / "s.fl")
    assert f"cat/{HOSTILE}" in [s["file"] for s in store.meta["skipped"]]  # the metadata keeps the name

    code, out, err = cli(capsys, src, tmp_path / "t.fl", "--size", 8)
    assert code == 0 and f"cat/{ESCAPED}" in out
    code, out, err = cli(capsys, src, tmp_path / "u.fl", "--size", 8, "--strict")
    assert code == 1 and f"cat/{ESCAPED}" in err
    for printed in (out, err):
        assert "\x1b" not in printed and "\r" not in printed


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


@pytest.mark.safety
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


# Bounded workers and chunk memory


@pytest.mark.safety
def test_workers_are_bounded_by_the_cores(tmp_path, capsys):
    src = classes(tmp_path / "src")
    cores = os.cpu_count()
    bound = f"workers must be between 1 and {_core.PACK_MAX_WORKERS} (this machine has"
    with pytest.raises(ValueError, match=re.escape(bound) + r" \d+ cores\), not 100000"):
        fastload.pack(src, tmp_path / "s.fl", 8, workers=100_000)
    for wrong in (-3, 10**26):  # one message, however far out (not an OverflowError)
        with pytest.raises(ValueError, match=re.escape(bound) + rf" \d+ cores\), not {wrong}"):
            fastload.pack(src, tmp_path / "s.fl", 8, workers=wrong)
    code, _, err = cli(capsys, src, tmp_path / "s.fl", "--size", 8, "--workers", 100_000)
    assert code == 1 and bound in err and "Traceback" not in err
    assert not (tmp_path / "s.fl").exists()
    assert 4 <= _core.PACK_MAX_WORKERS <= 4 * cores
    assert (
        len(fastload.Store(fastload.pack(src, tmp_path / "s.fl", 8, workers=_core.PACK_MAX_WORKERS).path))
        == 2
    )


@pytest.mark.safety
def test_a_record_larger_than_a_chunk_may_hold_is_refused(tmp_path, capsys):
    src = classes(tmp_path / "src")
    with pytest.raises(ValueError, match=r"size 10000x10000: one record takes 286 MiB, over the 256 MiB"):
        fastload.pack(src, tmp_path / "s.fl", 10000)
    code, _, err = cli(capsys, src, tmp_path / "s.fl", "--height", 9000, "--width", 12000)
    assert code == 1 and "over the 256 MiB" in err
    with pytest.raises(ValueError, match="between 1 and 65535"):
        fastload.pack(src, tmp_path / "s.fl", (1, 70000))
    assert not (tmp_path / "s.fl").exists()
    assert _core.PACK_DECODE_MEMORY_BUDGET == 2 << 30


# Interruption


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


@pytest.mark.safety
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


@pytest.mark.safety
def test_ctrl_c_stops_a_long_chunk_within_a_second_and_leaves_nothing(tmp_path):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    y, x = np.mgrid[0:4000, 0:4000]
    big = np.stack([x % 256, y % 256, (x + y) % 256], axis=-1).astype(np.uint8)
    Image.fromarray(big).save(src / "0.jpg", quality=90)
    for i in range(1, 16):  # one chunk of 16 files, seconds of decoding on one thread
        os.link(src / "0.jpg", src / f"{i}.jpg")
    dest = tmp_path / "s.fl"
    proc = subprocess.Popen(  # 2048: over half the side, so JPEGs decode at full scale (no DCT shortcut)
        [
            sys.executable,
            "-m",
            "fastload",
            "pack",
            str(tmp_path / "src"),
            str(dest),
            "--size",
            "2048",
            "--workers",
            "1",
            "--quiet",
        ],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not any(p.name.endswith(".fastload-partial") for p in tmp_path.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    time.sleep(0.5)  # inside the first chunk's decoding
    assert proc.poll() is None, "the pack finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=30)
    waited = time.monotonic() - sent
    assert proc.returncode == 130 and b"interrupted" in err
    assert waited < 1.5, f"Ctrl-C took {waited:.1f} s"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


# The pipeline on its own: the report word for word, chunks, metadata and argument checks


def pack_error(*args, error=ValueError, **kwargs) -> str:
    """The message of the `error` that `fastload.pack(*args, **kwargs)` raises."""
    with pytest.raises(error) as err:
        fastload.pack(*args, **kwargs)
    return str(err.value)


def test_the_report_reads_word_for_word(tmp_path):
    report = PackReport(
        path=tmp_path / "s.fl",
        records=1,
        shape=(8, 12, 3),
        seconds=2.0,
        files_read=4,
        source_bytes=3_000_000,
        store_bytes=999_999_999,
    )
    assert report.files_per_second == 2.0 and report.mb_per_second == 1.5
    assert str(report) == (
        f"packed 1 image (8x12x3) into {tmp_path / 's.fl'} (1,000.0 MB) in 2.0 s: 2 files/s, 1.5 MB/s read"
    )
    report.records, report.store_bytes = 2, 10**9
    report.skipped = [(f"c/{i:02}.png", "empty file") for i in range(51)]
    report.decode_warnings = [(f"d/{i:02}.jpg", ["corrupt JPEG data", "premature end"]) for i in range(51)]
    lines = str(report).splitlines()
    assert lines[0].startswith("packed 2 images (8x12x3) into ") and "(1.00 GB)" in lines[0]
    assert lines[1] == "skipped 51 file(s) (all listed in the store's meta['skipped']):"
    assert lines[2] == "  c/00.png: empty file" and lines[51] == "  c/49.png: empty file"
    assert lines[52] == "  ... and 1 more"
    assert lines[53] == (
        "decoded with warnings: 51 damaged image(s), packed as decoded (listed in the store's "
        "meta['decode_warnings']; --strict / strict=True refuses them):"
    )
    assert lines[54] == "  d/00.jpg: corrupt JPEG data; premature end" and lines[104] == "  ... and 1 more"
    assert len(lines) == 105
    report.store_bytes, report.seconds = 2_500_000_000, 0.0
    assert "(2.50 GB) in 0.0 s: 0 files/s, 0.0 MB/s read" in str(report)
    assert report.files_per_second == 0.0 and report.mb_per_second == 0.0
    report.store_bytes = 1_235_000_001  # rounds up in GB, down if divided by a bit more than 10**9
    assert "(1.24 GB)" in str(report)
    report.store_bytes = 1_250_001
    assert "(1.3 MB)" in str(report)


def chunked_folder(src: Path) -> list:
    """40 files of class c (a bad file in the first and last chunk of 16, a damaged JPEG in the
    second) and the records they should make, in order."""
    names = [f"c/{i:02}.png" for i in range(40)]
    photo_folder(src, names)
    (src / "c" / "05.png").write_bytes(b"")
    (src / "c" / "37.png").write_bytes((src / "c" / "36.png").read_bytes()[:40])
    (src / "c" / "20.png").unlink()
    damaged_jpeg(src / "c" / "20.jpg")
    names[20] = "c/20.jpg"
    return [n for n in names if n not in ("c/05.png", "c/37.png")]


def test_a_pack_of_several_chunks_keeps_every_record_and_figure(tmp_path):
    src = tmp_path / "src"
    good = chunked_folder(src)
    progress = []
    report = fastload.pack(src, tmp_path / "s.fl", 8, workers=1, progress=lambda *p: progress.append(p))
    assert progress == [(16, 40), (32, 40), (40, 40)]  # one chunk is 16 files a worker
    store = fastload.Store(report.path)
    assert store.meta["sources"] == good and report.records == len(store) == 38
    assert [name for name, _ in report.skipped] == ["c/05.png", "c/37.png"]
    assert [(name, record) for name, record, _ in map(dict.values, store.meta["decode_warnings"])] == [
        ("c/20.jpg", good.index("c/20.jpg"))
    ]
    assert report.decode_warnings[0][0] == "c/20.jpg"
    assert report.files_read == 40 and report.store_bytes == report.path.stat().st_size
    assert report.source_bytes == sum((src / name).stat().st_size for name in good)  # bytes of the records
    reference = fastload.Store(fastload.pack(src, tmp_path / "one.fl", 8, workers=4).path)
    assert store.images.tobytes() == reference.images.tobytes()
    assert store.meta["pack"] == {
        "size": [8, 8],
        "resize": "crop",
        "fill": [0, 0, 0],
        "filter": "lanczos3",
        "alpha_background": list(_core.PACK_ALPHA_BACKGROUND),
        "labels": "class folders",
        "label_dtype": "int64",
        "source": str(src.resolve()),
    }
    assert store.meta["class_names"] == ["c"] and "labels" not in store.meta


def test_a_chunk_is_bounded_by_records_and_bytes(tmp_path, monkeypatch):
    src = tmp_path / "src"
    chunked_folder(src)
    progress = []
    monkeypatch.setattr(pipeline, "MAX_CHUNK_RECORDS", 12)
    fastload.pack(src, tmp_path / "a.fl", 8, workers=1, progress=lambda *p: progress.append(p[0]))
    assert progress == [12, 24, 36, 40]
    monkeypatch.setattr(pipeline, "MAX_CHUNK_BYTES", 8 * 8 * 3 * 15)  # 15 records
    progress.clear()
    fastload.pack(src, tmp_path / "b.fl", 8, workers=1, progress=lambda *p: progress.append(p[0]))
    assert progress == [12, 24, 36, 40]
    progress.clear()
    fastload.pack(src, tmp_path / "d.fl", (8, 20), workers=1, progress=lambda *p: progress.append(p[0]))
    assert progress == [6, 12, 18, 24, 30, 36, 40]  # twice the bytes a record: 6 fit


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_ends_at_every_file_with_the_read_rate(tmp_path, monkeypatch):
    src = tmp_path / "src"
    chunked_folder(src)
    monkeypatch.setattr(sys, "stderr", Terminal())
    fastload.pack(src, tmp_path / "s.fl", 8, workers=1)
    drawn = sys.stderr.getvalue().split("\r")[-1]
    assert "packing 100%" in drawn and "40/40 files" in drawn and re.search(r"[\d.]+ MB/s read\]", drawn)


def test_the_labels_csv_inside_src_is_not_a_file_to_pack(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png", "b.png"])
    (src / "sub").mkdir()
    (src / "sub" / "labels.csv").write_text("a.png,1\nb.png,2\n")
    report = fastload.pack(src, tmp_path / "s.fl", 8, labels=src / "sub" / ".." / "sub" / "labels.csv")
    assert report.skipped == [] and report.records == 2
    store = fastload.Store(report.path)
    assert store.meta["pack"]["labels"] == str(src / "sub" / ".." / "sub" / "labels.csv")
    assert store.meta["pack"]["label_dtype"] == "int64" and "class_names" not in store.meta


def test_names_that_fit_the_metadata_exactly_pass_the_early_check(tmp_path, monkeypatch):
    src = classes(tmp_path / "src")
    (src / ".x").write_text("hidden")
    # (len("cat/a.png") + 4) + (len("dog/b.png") + 4) + (len(".x") + 64): the estimate, in bytes
    monkeypatch.setattr(_core, "MAX_META_LEN", 92)
    with pytest.raises(
        ValueError, match="metadata is .* bytes as JSON"
    ):  # past the names, the writer's own check
        fastload.pack(src, tmp_path / "s.fl", 8)
    monkeypatch.setattr(_core, "MAX_META_LEN", 91)
    with pytest.raises(ValueError, match=r"the names of 2 files take about 0 MiB, over the store's 0 MiB"):
        fastload.pack(src, tmp_path / "t.fl", 8)


def test_too_many_names_are_measured_in_mib(tmp_path, monkeypatch):
    src = classes(tmp_path / "src")
    names = [f"c/{'x' * 1000}{i}.png" for i in range(3000)]  # about 3 MiB
    monkeypatch.setattr(pipeline, "walk", lambda *args: (names, [], ["c"]))
    monkeypatch.setattr(_core, "MAX_META_LEN", 2 << 20)
    assert pack_error(src, tmp_path / "s.fl", 8) == (
        f"{src}: the names of 3,000 files take about 3 MiB, over the store's 2 MiB metadata limit; "
        "pack the folder as several stores"
    )


def test_paths_are_refused_word_for_word(tmp_path):
    src = classes(tmp_path / "src")
    cases = [
        (tmp_path / "nowhere", tmp_path / "s.fl", {}, f"{tmp_path / 'nowhere'}: no such folder"),
        (
            src / "cat" / "a.png",
            tmp_path / "s.fl",
            {},
            f"{src / 'cat' / 'a.png'}: not a folder (pack takes a folder of images)",
        ),
        (
            src,
            tmp_path / "l.csv",
            {"labels": tmp_path / "l.csv"},
            f"{tmp_path / 'l.csv'}: the store would replace the labels file",
        ),
        (
            src,
            tmp_path,
            {},
            f"store {tmp_path} is a directory, not a regular file: fastload only replaces regular files; choose another path",
        ),
    ]
    (tmp_path / "l.csv").write_text("cat/a.png,1\n")
    for source, dest, options, message in cases:
        with pytest.raises((OSError, ValueError)) as err:
            fastload.pack(source, dest, 8, **options)
        assert str(err.value) == message
    (tmp_path / "s.fl").write_bytes(b"precious")
    with pytest.raises(FileExistsError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8)
    assert (
        str(err.value)
        == f"{tmp_path / 's.fl'}: already exists (pass overwrite=True or --overwrite to replace it)"
    )


@pytest.mark.parametrize("fill", [-1, 256, (1, 2), (0, 0, 256), (0, 0, -1), (1, 2, 3, 4), (0, 0, 1.5)])
def test_a_fill_outside_0_255_or_not_a_triple_is_refused(tmp_path, fill):
    src = classes(tmp_path / "src")
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8, resize="pad", fill=fill)
    assert str(err.value) == f"fill must be an int 0-255 or an (R, G, B) triple, not {fill!r}"


def test_fill_takes_0_to_255(tmp_path):
    src = classes(tmp_path / "src")
    store = fastload.Store(
        fastload.pack(src, tmp_path / "s.fl", (8, 16), resize="pad", fill=(0, 255, 7)).path
    )
    assert store.meta["pack"]["fill"] == [0, 255, 7] and store.meta["pack"]["resize"] == "pad"
    assert np.asarray(store.images[0])[0, 0].tolist() == [0, 255, 7]


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(size=0), ValueError, "size must be between 1 and 65535 pixels, not 0"),
        (dict(size=(0, 8)), ValueError, "size must be between 1 and 65535 pixels, not (0, 8)"),
        (dict(size=(1, 65536)), ValueError, "size must be between 1 and 65535 pixels, not (1, 65536)"),
        (dict(size=(1, 2, 3)), ValueError, "size must be an int or (height, width), not (1, 2, 3)"),
        (dict(size=(8, True)), ValueError, "size must be an int or (height, width), not (8, True)"),
        (dict(size=2.5), ValueError, "size must be an int or (height, width), not 2.5"),
        (dict(progress=5), TypeError, "progress must be a callable (done, total), not int"),
        (dict(resize="stretch"), ValueError, "resize must be one of squash, crop, pad, not 'stretch'"),
        (dict(label_dtype="int8"), ValueError, "label_dtype must be 'float64' or 'int64', not 'int8'"),
        (dict(workers=2.5), ValueError, "workers must be an int, not 2.5"),
        (dict(workers=True), ValueError, "workers must be an int, not True"),
        (dict(labels=""), ValueError, "labels is an empty path; give the labels CSV file"),
        (dict(labels=5), TypeError, "labels must be a str or os.PathLike, not int"),
    ],
)
def test_bad_options_are_refused_word_for_word(tmp_path, options, error, message):
    src = classes(tmp_path / "src")
    with pytest.raises(error) as err:
        fastload.pack(src, tmp_path / "s.fl", **{"size": 8, **options})
    assert str(err.value) == message


def test_options_are_checked_before_the_folder_is_read(tmp_path):
    src = photo_folder(tmp_path / "src", ["a.png"])  # no labels: an error, but a later one
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8, label_dtype="int8")
    assert str(err.value) == "label_dtype must be 'float64' or 'int64', not 'int8'"


def test_a_folder_without_images_lists_what_it_holds(tmp_path):
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    (src / "c" / "notes.txt").write_text("x")
    extensions = ".bmp, .dib, .gif, .jfif, .jpe, .jpeg, .jpg, .png, .tif, .tiff, .webp"
    found = f"{src}: no images found (1 other file(s); images are files ending in {extensions})"
    assert pack_error(src, tmp_path / "s.fl", 8) == found
    (src / ".DS_Store").write_text("x")
    assert pack_error(src, tmp_path / "s.fl", 8) == f"{found}\n  .DS_Store: hidden file"


def test_src_and_dest_of_the_wrong_type_are_named(tmp_path):
    with pytest.raises(TypeError) as err:
        fastload.pack(None, tmp_path / "s.fl")
    assert str(err.value) == "src must be a str or os.PathLike, not NoneType"
    with pytest.raises(TypeError) as err:
        fastload.pack(tmp_path, 5)
    assert str(err.value) == "dest must be a str or os.PathLike, not int"
    with pytest.raises(ValueError) as err:
        fastload.pack(tmp_path, tmp_path / "s.fl", no_labels=True, labels=tmp_path / "l.csv")
    assert str(err.value) == (
        f"no_labels / --no-labels packs without labels: pass it or labels ({tmp_path / 'l.csv'}), not both"
    )


def test_sizes_at_the_edges_pack(tmp_path, monkeypatch):
    src = classes(tmp_path / "src")
    assert fastload.Store(fastload.pack(src, tmp_path / "a.fl", (1, 8)).path).shape == (1, 8, 3)
    assert fastload.Store(fastload.pack(src, tmp_path / "b.fl", (1, 65535)).path).shape == (1, 65535, 3)
    monkeypatch.setattr(pipeline, "MAX_CHUNK_BYTES", 8 * 8 * 3)  # a record may fill a chunk exactly
    assert fastload.pack(src, tmp_path / "c.fl", 8).records == 2
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "d.fl", (8, 9))
    assert str(err.value) == (
        "size 8x9: one record takes 0 MiB, over the 0 MiB one chunk of records may hold; pack at a smaller size"
    )


def test_defaults_are_256_pixels_cropped_black_bars_and_a_timed_report(tmp_path):
    src = classes(tmp_path / "src")
    started = time.perf_counter()
    report = fastload.pack(src, tmp_path / "s.fl")
    took = time.perf_counter() - started
    assert report.shape == (256, 256, 3) and fastload.Store(report.path).shape == (256, 256, 3)
    assert 0 < report.seconds <= took
    image(src / "wide" / "w.png", side=4).write_bytes(
        (lambda b: b.getvalue())(_png_of(np.full((4, 8, 3), 200, np.uint8)))
    )
    padded = fastload.Store(fastload.pack(src, tmp_path / "p.fl", 8, resize="pad").path)
    assert np.asarray(padded.images[padded.meta["sources"].index("wide/w.png")])[0, 0].tolist() == [0, 0, 0]


def _png_of(array: np.ndarray) -> io.BytesIO:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG")
    return buffer


def test_when_no_image_can_be_packed_each_is_named(tmp_path):
    src = tmp_path / "src"
    for name in ("c/a.png", "c/b.png"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(b"")
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8)
    assert str(err.value) == (
        f"{src}: none of the 2 image(s) could be packed:\n  c/a.png: empty file\n  c/b.png: empty file"
    )


def test_when_every_image_is_left_out_there_is_nothing_to_pack(tmp_path):
    src = tmp_path / "src"
    image(src / "a.png")
    (src / "cat").mkdir()  # a class with no image: a.png lies outside any class folder
    with pytest.raises(ValueError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8, skip_unlabelled=True)
    assert str(err.value) == f"{src}: no images to pack\n  a.png: no label (skipped by request)"


def test_strict_lists_every_bad_file_however_many(tmp_path):
    src = classes(tmp_path / "src")
    for i in range(25):
        (src / "cat" / f"bad{i:02}.png").write_bytes(b"")
    with pytest.raises(BadFilesError) as err:
        fastload.pack(src, tmp_path / "s.fl", 8, strict=True)
    lines = str(err.value).splitlines()
    assert lines[0] == f"25 file(s) in {src} cannot be packed (strict): nothing was written:"
    assert lines[1:] == [f"  cat/bad{i:02}.png: empty file" for i in range(25)]


def test_a_failed_write_of_the_last_chunk_fails_the_pack(tmp_path, monkeypatch):
    src = tmp_path / "src"
    chunked_folder(src)
    extend, calls = fastload.StoreWriter.extend, []

    def extend_until_the_disk_fills(writer, *args):
        calls.append(len(args[0]))
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return extend(writer, *args)

    monkeypatch.setattr(fastload.StoreWriter, "extend", extend_until_the_disk_fills)
    with pytest.raises(OSError, match="No space left on device"):
        fastload.pack(src, tmp_path / "s.fl", 8, workers=1)
    assert calls == [15, 16, 7] and not (tmp_path / "s.fl").exists()


def test_no_progress_bar_when_stderr_is_no_terminal_or_quiet(tmp_path, capsys, monkeypatch):
    src = classes(tmp_path / "src")
    fastload.pack(src, tmp_path / "a.fl", 8)  # stderr captured: not a terminal
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys, "stderr", Terminal())
    fastload.pack(src, tmp_path / "b.fl", 8, quiet=True)
    assert sys.stderr.getvalue() == ""


def test_a_build_without_jpeg_simd_says_so_at_the_start_of_every_pack(tmp_path, monkeypatch, capsys):
    # #35: pip hides the JPEG library's build warning, so a build without nasm lost SIMD silently.
    src = classes(tmp_path / "src")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a build with SIMD says nothing
        if _core.pack_jpeg_simd():
            fastload.pack(src, tmp_path / "simd.fl", 8, quiet=True)
    monkeypatch.setattr(_core, "pack_jpeg_simd", lambda: False)
    for name in ("a.fl", "b.fl"):
        with pytest.warns(UserWarning) as said:
            fastload.pack(src, tmp_path / name, 8, quiet=True)
        assert [str(w.message) for w in said] == [fastload.inspect.NO_JPEG_SIMD]
        assert "1.4-2.7x slower" in str(said[0].message) and "apt-get install nasm" in str(said[0].message)
    code, _, err = cli(capsys, src, tmp_path / "c.fl", "--size", "8")
    assert code == 0
    assert err.count("warning") == 1
    assert err.startswith(f"fastload pack: warning: {fastload.inspect.NO_JPEG_SIMD}\n")
    # Said before any file is read: a pack that fails on its folder has said it too.
    code, _, err = cli(capsys, tmp_path / "missing", tmp_path / "d.fl")
    assert code == 1 and err.startswith(
        "fastload pack: warning: JPEG decoding in this fastload runs without SIMD"
    )


def test_a_pack_onto_a_ram_disk_writes_the_same_store_as_onto_a_disk(ram_disk_folder, tmp_path):
    # #35: the O_DIRECT writer on tmpfs (which takes O_DIRECT from Linux 6.6, and is written
    # buffered where it refuses it): the same bytes, verified.
    src = photo_folder(tmp_path / "src", [f"c{i % 3}/{i}.png" for i in range(30)], size=40)
    on_disk = fastload.pack(src, tmp_path / "disk.fl", 32, quiet=True)
    in_ram = fastload.pack(src, os.path.join(ram_disk_folder, "ram.fl"), 32, quiet=True)
    assert fastload.inspect.storage(in_ram.path)["in_ram"]
    with fastload.Store(on_disk.path) as a, fastload.Store(in_ram.path) as b:
        assert a.fingerprint() == b.fingerprint() and len(b) == 30
        assert b.verify(None) == []
    assert fastload.inspect.verify(in_ram.path) == []


@pytest.mark.safety
def test_a_destination_that_names_a_folder_or_nothing_is_refused(tmp_path, capsys):
    """`pack imgs newdir/` silently created a file `newdir`; `pack imgs ""` said "store . is a directory"."""
    src = classes(tmp_path / "src")
    code, out, err = cli(capsys, src, f"{tmp_path}/newdir/")
    assert code == 1 and err == (
        f"fastload pack: error: {tmp_path}/newdir/: ends with '/', so it names a folder, and a store is "
        f"a file; give its file name, e.g. {tmp_path}/newdir/images.fastload\n"
    )
    assert not (tmp_path / "newdir").exists()
    code, out, err = cli(capsys, src, "")
    assert code == 1 and err == (
        "fastload pack: error: dest is an empty path; give the store's file name, e.g. images.fastload\n"
    )


FULL_PACK = textwrap.dedent(
    """
    import resource, signal, sys
    from fastload import cli
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
    sys.exit(cli.main(["pack", sys.argv[1], sys.argv[2], "--size", "64"]))
    """
)


@pytest.mark.safety
def test_a_full_disk_during_pack_names_the_store_not_its_temporary_file(tmp_path):
    src = classes(tmp_path / "src")
    dest = tmp_path / "full.store"
    child = subprocess.run(
        [sys.executable, "-c", FULL_PACK, src, dest], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 1
    assert child.stderr.splitlines()[-1] == f"fastload pack: error: {dest}: File too large (os error 27)", (
        child.stderr
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
