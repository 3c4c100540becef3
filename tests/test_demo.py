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


@pytest.mark.safety
@pytest.mark.parametrize(
    "users",
    [["images/demo_00000.jpg", "labels.csv"], ["notes.txt"]],
    ids=["named-like-the-demos", "any-other-file"],
)
def test_a_dir_holding_the_users_files_is_refused_and_left_as_it_was(users, tmp_path, capsys):
    """The demo removed every images/demo_* file and replaced labels.csv, whoever wrote them."""
    for name in users:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("the user's")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    status = cli.main(["demo", "--dir", os.fspath(tmp_path), "--quick", "--device", "cpu"])
    err = capsys.readouterr().err
    assert status == 1 and err.startswith(
        f"fastload demo: error: demo folder {tmp_path} holds files the demo did not make ("
    )
    assert err.endswith("give another --dir\n") and len(err.splitlines()) == 1
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
    assert all((tmp_path / name).read_text() == "the user's" for name in users)


class _Stopped(Exception):
    pass


def test_a_dir_an_earlier_demo_made_is_reused_and_only_its_images_removed(tmp_path, monkeypatch):
    def stop(*args, **kwargs):
        raise _Stopped

    monkeypatch.setattr(demo, "make_photos", stop)  # the run stops once the folder is claimed
    with pytest.raises(_Stopped):
        demo.run(workdir=tmp_path, quick=True, quiet=True, device="cpu")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fastload-demo"]  # new: marked as the demo's
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "demo_00007.bmp").write_bytes(b"an earlier demo's")
    (tmp_path / "labels.csv").write_text("an earlier demo's")
    with pytest.raises(_Stopped):
        demo.run(workdir=tmp_path, quick=True, quiet=True, device="cpu")
    assert list((tmp_path / "images").iterdir()) == []
    (tmp_path / "mine.txt").write_text("the user's")
    with pytest.raises(ValueError, match=r"holds files the demo did not make \(mine\.txt\)"):
        demo.run(workdir=tmp_path, quick=True, quiet=True, device="cpu")
    # A link named like the demo's images folder is not followed to a folder of the user's.
    (tmp_path / "mine.txt").unlink()
    (tmp_path / "images").rmdir()
    users = tmp_path.parent / f"{tmp_path.name}-users"
    users.mkdir()
    (users / "demo_00001.jpg").write_text("the user's")
    (tmp_path / "images").symlink_to(users)
    with pytest.raises(ValueError, match=r"holds files the demo did not make \(images\)"):
        demo.run(workdir=tmp_path, quick=True, quiet=True, device="cpu")
    assert (users / "demo_00001.jpg").read_text() == "the user's"
