"""The folder walk of `fastload.pack` (`fastload/pack/walk.py`): names that are not UTF-8,
a file swapped for a named pipe after the walk, and the symbolic link policy."""

from __future__ import annotations

import os

import pytest
from PIL import Image
from test_pack import classes, cli, gradient, image, pack_within

import fastload
from fastload.pack import LINK_OUTSIDE_SRC, pipeline

pytestmark = pytest.mark.safety


def test_a_file_name_that_is_not_utf8_packs(tmp_path):
    (tmp_path / "src" / "c").mkdir(parents=True)
    name = os.fsdecode(b"bad\xffname.png")  # a byte that is not UTF-8 (Linux allows it)
    Image.fromarray(gradient(8, 8)).save(tmp_path / "src" / "c" / name, format="PNG")
    store = fastload.Store(fastload.pack(tmp_path / "src", tmp_path / "s.fl", 8).path)
    assert store.meta["sources"] == ["c/bad\ufffdname.png"] and len(store) == 1


def test_a_file_replaced_by_a_named_pipe_after_the_walk_is_reported(tmp_path, monkeypatch):
    src = classes(tmp_path / "src")
    walk = pipeline.walk

    def walk_then_swap(*args):
        listing = walk(*args)
        os.remove(src / "dog" / "b.png")
        os.mkfifo(src / "dog" / "b.png")
        return listing

    monkeypatch.setattr(pipeline, "walk", walk_then_swap)
    report = pack_within(30, src, tmp_path / "s.fl", 8, workers=1)
    assert report.records == 1
    assert ("dog/b.png", "not a regular file (a named pipe)") in report.skipped


def test_symbolic_links_out_of_src_are_skipped_unless_asked(tmp_path, capsys):
    src = classes(tmp_path / "src")
    outside = image(tmp_path / "elsewhere" / "out.png")
    image(tmp_path / "elsewhere" / "more" / "deep.png")
    image(src / ".store" / "hidden_target.png")
    os.symlink(outside, src / "cat" / "out.png")
    os.symlink(tmp_path / "elsewhere" / "more", src / "cat" / "outdir")
    os.symlink("/", src / "cat" / "root")
    os.symlink(tmp_path, src / "dog" / "parent")
    os.symlink("../dog/b.png", src / "cat" / "in.png")  # inside: packed as today
    os.symlink("../.store", src / "cat" / "indir")

    loop = "symbolic link to a folder that contains SRC (a loop; never followed)"
    report = pack_within(60, src, tmp_path / "s.fl", 8)
    assert fastload.Store(report.path).meta["sources"] == [
        "cat/a.png",
        "cat/in.png",
        "cat/indir/hidden_target.png",
        "dog/b.png",
    ]
    skipped = dict(report.skipped)
    assert skipped["cat/out.png"] == LINK_OUTSIDE_SRC and skipped["cat/outdir"] == LINK_OUTSIDE_SRC
    assert skipped["cat/root"] == loop and skipped["dog/parent"] == loop

    report = pack_within(60, src, tmp_path / "t.fl", 8, follow_symlinks=True)
    assert fastload.Store(report.path).meta["sources"] == [
        "cat/a.png",
        "cat/in.png",
        "cat/indir/hidden_target.png",
        "cat/out.png",
        "cat/outdir/deep.png",
        "dog/b.png",
    ]
    assert dict(report.skipped)["cat/root"] == loop and dict(report.skipped)["dog/parent"] == loop

    code, out, _ = cli(capsys, src, tmp_path / "u.fl", "--size", 8, "--follow-symlinks")
    assert code == 0 and "packed 6 images" in out
