"""The folder walk of `fastload.pack`: every regular file under SRC, in sorted order, with the
entries that cannot be images and why (hidden files and folders, special files, broken links),
under the symbolic link policy (links into SRC followed, links out of it only when asked,
links to a folder containing SRC never)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Tuple

#: Extensions taken for images when a file has no label (other unlabelled files are not images).
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".bmp", ".dib", ".tif", ".tiff", ".gif"}
)
#: Why a symbolic link out of SRC is not followed by default.
LINK_OUTSIDE_SRC = "symbolic link to outside SRC (pass follow_symlinks=True / --follow-symlinks to follow)"
#: Reasons of files left out by rule, never read: hidden ones (`.DS_Store`).
HIDDEN_FILE, HIDDEN_FOLDER = "hidden file", "hidden folder"


def has_image_extension(name: str) -> bool:
    """Whether the file name ends in one of IMAGE_EXTENSIONS (any case)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _link_refusal(link: str, real_src: Path, follow_symlinks: bool) -> Optional[str]:
    """Why the symbolic link `link` is not followed, or None. A link into SRC is followed;
    one to a folder containing SRC (`/`, a parent) never, as it would walk SRC's
    surroundings; any other link out of SRC only with `follow_symlinks`. A broken link
    gets its own reason from the walk."""
    target = Path(os.path.realpath(link))
    if target.is_relative_to(real_src) or not target.exists():
        return None
    if real_src.is_relative_to(target):
        return "symbolic link to a folder that contains SRC (a loop; never followed)"
    return None if follow_symlinks else LINK_OUTSIDE_SRC


def walk(
    src: Path, exclude: Optional[str], follow_symlinks: bool = False
) -> Tuple[List[str], List[Tuple[str, str]], List[str]]:
    """Every regular file under `src` as a relative POSIX path (sorted), the entries that
    cannot be images with the reason, and the top-level folders (candidate classes)."""
    real_src = Path(os.path.realpath(src))
    files: List[str] = []
    skipped: List[Tuple[str, str]] = []
    top_folders: List[str] = []
    visited = {(src.stat().st_dev, src.stat().st_ino)}
    pending = [(str(src), "")]
    while pending:
        folder, prefix = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            if not prefix:
                raise
            skipped.append((prefix[:-1], f"cannot list this folder: {exc.strerror}"))
            continue
        for entry in entries:
            rel = prefix + entry.name
            try:
                is_dir = entry.is_dir()
                is_file = not is_dir and entry.is_file()
            except OSError as exc:
                skipped.append((rel, f"not a regular file: {exc.strerror}"))
                continue
            refusal = entry.is_symlink() and _link_refusal(entry.path, real_src, follow_symlinks)
            if entry.name.startswith("."):
                skipped.append((rel, HIDDEN_FOLDER if is_dir else HIDDEN_FILE))
            elif refusal:
                skipped.append((rel, refusal))
            elif is_dir:
                st = entry.stat()
                if has_image_extension(entry.name):
                    skipped.append((rel, "a folder, not an image file"))
                elif (st.st_dev, st.st_ino) in visited:
                    skipped.append((rel, "a folder already visited (symbolic link loop)"))
                else:
                    visited.add((st.st_dev, st.st_ino))
                    pending.append((entry.path, rel + "/"))
                    if not prefix:
                        top_folders.append(entry.name)
            elif is_file:
                if rel != exclude:
                    files.append(rel)
            else:
                broken = entry.is_symlink() and not os.path.exists(entry.path)
                skipped.append((rel, "not a regular file" + (" (broken symbolic link)" if broken else "")))
    return sorted(files), sorted(skipped), sorted(top_folders)
