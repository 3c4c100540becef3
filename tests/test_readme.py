"""Every code block in README.md runs as written, in order, against a small folder of images
on the CPU, so the README cannot drift from the code.

The setup blocks (installs) are the only ones not run here; the test checks that they are
exactly the commands `.ci/run` itself runs, or the clone-and-venv lines before them."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SETUP_MARKERS = ("pip install", "git clone", "python -m venv")


def readme_blocks():
    """(language, code) of each fenced block; `text` blocks show data, not code."""
    return [
        (lang, code) for lang, code in FENCE.findall(README.read_text(encoding="utf-8")) if lang != "text"
    ]


def is_setup(code: str) -> bool:
    return any(marker in code for marker in SETUP_MARKERS)


def make_images(folder: Path, count: int = 24) -> None:
    """Photo-like JPEGs of a few sizes, and `labels.csv` (path,label) beside them; and class
    folders beside it (`pets/cat`, `pets/dog`: darker and lighter images)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir()
    rows = ["path,label"]
    for i in range(count):
        h, w = (40 + 8 * (i % 3), 56 - 4 * (i % 4))
        pixels = (rng.random((h, w, 3)) * 64 + 4 * i).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i:03d}.jpg", quality=90)
        rows.append(f"img{i:03d}.jpg,{i / count:.4f}")
    (folder.parent / "labels.csv").write_text("\n".join(rows) + "\n")
    for name, level in (("cat", 60), ("dog", 190)):
        (folder.parent / "pets" / name).mkdir(parents=True)
        for i in range(count // 2):
            pixels = (rng.random((40, 40, 3)) * 64 + level - 32).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder.parent / "pets" / name / f"{i:03d}.jpg", quality=90)


def test_the_readme_has_the_blocks_this_test_runs():
    blocks = readme_blocks()
    langs = {lang for lang, _ in blocks}
    assert langs <= {"bash", "python"}, f"README blocks in languages this test cannot run: {langs}"
    runnable = [code for _, code in blocks if not is_setup(code)]
    text = "\n".join(runnable)
    for needed in ("fastload pack", "Store(", "FastLoadDataset(", "fastload train", "fastload bench"):
        assert needed in text, f"the README shows no runnable example of {needed}"


def test_the_setup_blocks_are_what_ci_runs():
    """The two setup commands of the README are the ones a fresh machine runs; the test
    command is the one `.ci/run` runs, so CI proves it."""
    setup = [code.strip() for _, code in readme_blocks() if is_setup(code)]
    installs = [code for code in setup if "pip install" in code]
    assert installs == ["pip install . && fastload demo", 'pip install -e ".[test]" && python -m pytest'], (
        installs
    )
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'-m pip install -e "\.\[test[],]', ci) and re.search(r"-m pytest", ci), (
        "CI no longer runs the test command"
    )
    assert "fastload demo" in (ROOT / "tests" / "test_demo.py").read_text()


def test_every_readme_block_runs(tmp_path, monkeypatch):
    make_images(tmp_path / "images")
    shim = tmp_path / "bin"
    shim.mkdir()
    # `fastload` on PATH runs this checkout's package with this interpreter.
    (shim / "fastload").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fastload "$@"\n')
    (shim / "fastload").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    import fastload

    src = str(Path(fastload.__file__).parent.parent)  # the fastload this test imports
    env["PYTHONPATH"] = src + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else src
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    ran = 0
    for lang, code in readme_blocks():
        if is_setup(code):
            continue
        if lang == "bash":
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", code],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert result.returncode == 0, f"README block failed:\n{code}\n{result.stdout}\n{result.stderr}"
        else:
            try:
                exec(compile(code, "README.md", "exec"), namespace)
            except Exception as exc:  # noqa: BLE001 - the block's text is the useful part of the report
                pytest.fail(f"README block raised {type(exc).__name__}: {exc}\n{code}")
        ran += 1
    assert ran >= 8
