"""The folder walk of `fastload.pack` (`fastload/pack/walk.py`): names that are not UTF-8,
a file swapped for a named pipe after the walk, and the symbolic link policy."""

from __future__ import annotations

import os

import pytest
from pack_helpers import classes, cli, gradient, image, pack_within
from PIL import Image

import fastload
from fastload.pack import LINK_OUTSIDE_SRC, pipeline
from fastload.pack.walk import HIDDEN_FILE, HIDDEN_FOLDER, walk

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


def test_walk_lists_each_entry_that_is_not_an_image_with_its_reason(tmp_path, monkeypatch):
    """Each reason word for word, as the report and `meta["skipped"]` show it; a sub-folder
    that cannot be listed is skipped (SRC itself that cannot be listed is an error)."""
    src = classes(tmp_path / "src")
    image(src / "cat" / ".hidden.png")
    image(src / ".git" / "x.png")
    (src / "cat" / "folder.png").mkdir()
    os.symlink(src / "cat", src / "dog" / "again")  # a second way into a visited folder
    os.symlink(src / "cat" / "gone.png", src / "cat" / "broken.png")
    os.symlink("self", src / "dog" / "self")  # a link to itself: stat fails (ELOOP)
    os.mkfifo(src / "dog" / "pipe.png")
    os.symlink("pipe.png", src / "dog" / "pipe_link.png")  # a link, not broken, to no regular file
    image(src / "locked" / "c.png")
    scandir = os.scandir

    def unlistable(path):
        if os.path.basename(path) == "locked":  # root reads any folder: the failure is simulated
            raise PermissionError(13, "Permission denied", path)
        return sorted(scandir(path), key=lambda entry: entry.name)  # "locked" is listed last, walked first

    monkeypatch.setattr(os, "scandir", unlistable)
    files, skipped, top_folders = walk(src, None)
    assert files == ["cat/a.png", "dog/b.png"]
    assert top_folders == ["cat", "dog", "locked"]
    assert skipped == [
        (".git", HIDDEN_FOLDER),
        ("cat/.hidden.png", HIDDEN_FILE),
        ("cat/broken.png", "not a regular file (broken symbolic link)"),
        ("cat/folder.png", "a folder, not an image file"),
        ("dog/again", "a folder already visited (symbolic link loop)"),
        ("dog/pipe.png", "not a regular file"),
        ("dog/pipe_link.png", "not a regular file"),
        ("dog/self", "not a regular file: Too many levels of symbolic links"),
        ("locked", "cannot list this folder: Permission denied"),
    ]
    monkeypatch.setattr(os, "scandir", lambda path: unlistable(src / "locked"))
    with pytest.raises(PermissionError):
        walk(src, None)


def test_walk_leaves_out_the_excluded_file_and_links_out_of_src_by_default(tmp_path):
    src = classes(tmp_path / "src")
    (src / "labels.csv").write_text("cat/a.png,0\n")
    os.symlink(image(tmp_path / "out.png"), src / "dog" / "out.png")
    files, skipped, _ = walk(src, "labels.csv")
    assert files == ["cat/a.png", "dog/b.png"]
    assert skipped == [("dog/out.png", LINK_OUTSIDE_SRC)]
    assert walk(src, None, follow_symlinks=True)[0] == ["cat/a.png", "dog/b.png", "dog/out.png", "labels.csv"]
