"""What the tests of `fastload.pack` (tests/pack/) share: tiny images made with Pillow, class
folders, `fastload pack` run as the command line, `pack` under a deadline, and a hostile name
with its escaped form."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from PIL import Image

import fastload
from fastload.cli import main as cli_main

SIZE = 32


def gradient(h: int = SIZE, w: int = SIZE, seed: int = 0) -> np.ndarray:
    """A smooth RGB image with some structure (JPEG keeps it close)."""
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(seed)
    a, b, c = rng.uniform(2, 6, 3)
    img = np.stack([x * a, y * b, (x + y) * c], axis=-1) + 20
    return np.clip(img, 0, 255).astype(np.uint8)


def photo_folder(root: Path, names, size: int = 8) -> Path:
    for i, name in enumerate(names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(gradient(size, size, seed=i)).save(root / name)
    return root


def image(path: Path, side: int = 8, value: int = 100) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((side, side, 3), value, np.uint8)).save(path)
    return path


def classes(src: Path) -> Path:
    image(src / "cat" / "a.png")
    image(src / "dog" / "b.png", value=200)
    return src


def cli(capsys, *args) -> tuple:
    code = cli_main(["pack", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def pack_within(seconds: float, *args, **kwargs):
    """`pack` in a thread that must finish within `seconds` (a blocked decode fails the test)."""
    result = {}

    def run():
        try:
            result["report"] = fastload.pack(*args, **kwargs)
        except Exception as exc:  # handed to the test
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"pack did not finish within {seconds} s"
    if "error" in result:
        raise result["error"]
    return result["report"]


HOSTILE = "a\x1b[31mred\r\n.jpg"


ESCAPED = "a\\x1b[31mred\\r\\n.jpg"
