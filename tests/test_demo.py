"""`fastload demo`: the README's first command runs end to end and says whether it worked."""

from __future__ import annotations

import json
import os
import sys

import pytest

from fastload import MissingDependencyError, cli, demo


def test_quick_demo_learns_and_keeps_its_guarantee(tmp_path, monkeypatch):
    monkeypatch.setattr(demo.tempfile, "tempdir", str(tmp_path))  # where the demo's temporary directory goes
    report = demo.run(images=300, size=32, quick=True, quiet=True, device="cpu")

    assert report["passed"] and report["problems"] == []
    for key in (
        "pack_images_per_s",
        "loader_images_per_s",
        "memmap_dataloader_images_per_s",
        "train_images_per_s",
    ):
        assert report[key] > 0, key
    assert 0 <= report["data_wait_fraction"] <= 1
    assert report["val_rmse"] < report["baseline_rmse"]
    assert (
        report["augment"] == "crop=0.5,flip"
        and 0 < report["augmented_val_rmse"] < 2 * report["baseline_rmse"]
    )
    assert report["monotonicity_violation"] <= report["monotonicity_tolerance"] == 1e-6
    assert not list(tmp_path.glob("fastload-demo-*"))  # the temporary directory is removed


def test_cli_exits_1_and_says_why_when_the_model_misses_and_keeps_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(demo, "PASS_RMSE_RATIO", 0.0)  # no model can reach it
    argv = ["demo", "--dir", os.fspath(tmp_path), "--images", "120", "--size", "24", "--epochs", "1"]
    argv += ["--images-from", "textures"]  # BMP textures, whether or not scikit-image is installed
    assert cli.main([*argv, "--quick", "--device", "cpu", "--json"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert not report["passed"] and not report["beats_baseline"] and report["monotone"]
    assert "fastload demo: error: the model's validation RMSE" in captured.err
    # --dir keeps the work: images, labels and the packed store.
    assert (tmp_path / "demo.fastload").is_file() and (tmp_path / "labels.csv").is_file()
    assert len(list((tmp_path / "images").glob("*.bmp"))) == 120


def test_photos_without_scikit_image_are_refused_naming_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "skimage", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "skimage.data", None)
    with pytest.raises(MissingDependencyError, match="pip install scikit-image"):
        demo.run(workdir=os.fspath(tmp_path / "d"), images=100, size=16, epochs=1, images_from="photos")
    with pytest.raises(ValueError, match="images_from must be one of auto, photos, textures, not 'film'"):
        demo.run(workdir=os.fspath(tmp_path / "d"), images_from="film")
    assert not (tmp_path / "d").exists()  # refused before any file was written
