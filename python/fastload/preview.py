"""The augmentation preview (`fastload augment-preview`): a PNG grid of what the model sees,
each tile augmented exactly as training augments that record in that epoch."""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch
import torch.nn.functional as F

from fastload._checks import fspath, import_optional, is_int
from fastload.augment import Augment
from fastload.files import output_target, replace_atomically
from fastload.store import Store

#: Most rows (records) and columns (epochs) of a preview grid: a picture to look at.
MAX_PREVIEW_SIDE = 256


def save_preview(
    store,
    path,
    augment: Augment,
    records: int = 4,
    epochs: int = 8,
    first_epoch: int = 0,
) -> Tuple[int, int]:
    """Writes a PNG grid of what the model sees: one row per record (`records` spread evenly
    over the store), one column per epoch from `first_epoch`, each tile augmented as training
    would augment it. Written atomically; returns the PNG's (width, height). Needs Pillow."""
    Image = import_optional("PIL.Image", "the augmentation preview", "pip install pillow")
    for name, value, least in (
        ("records", records, 1),
        ("epochs", epochs, 1),
        ("first_epoch", first_epoch, 0),
    ):
        if not is_int(value) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, not {value!r}")
    if records > MAX_PREVIEW_SIDE or epochs > MAX_PREVIEW_SIDE:
        raise ValueError(
            f"need records and epochs between 1 and {MAX_PREVIEW_SIDE} (the grid's rows and columns), "
            f"not {records} and {epochs}"
        )
    path = fspath(path, "preview path")
    output_target(path, "preview")  # refused before any work; checked again when replaced
    owned = not isinstance(store, Store)
    store = Store(store) if owned else store
    try:
        if len(store) == 0:
            raise ValueError(f"{store.path}: the store has no records to preview")
        if store.shape[2] not in (1, 3):
            raise ValueError(f"{store.path}: a preview needs 1 or 3 channels, not {store.shape[2]}")
        keys = np.unique(np.linspace(0, len(store) - 1, min(records, len(store))).round().astype(np.int64))
        images = torch.from_numpy(store.gather(keys)[0])
    finally:
        if owned:
            store.close()
    tiles = [
        augment(images, torch.from_numpy(keys), epoch) for epoch in range(first_epoch, first_epoch + epochs)
    ]
    grid = (torch.stack(tiles, dim=1) * 255).round().clamp(0, 255)  # records × epochs × C × h × w
    rows, cols, channels, h, w = grid.shape
    gap = 2  # white lines between tiles and around the grid
    grid = F.pad(grid, (0, gap, 0, gap), value=255.0).permute(0, 3, 1, 4, 2)  # rows × h' × cols × w' × C
    canvas = F.pad(
        grid.reshape(rows * (h + gap), cols * (w + gap), channels).permute(2, 0, 1),
        (gap, 0, gap, 0),
        value=255.0,
    )
    canvas = canvas.permute(1, 2, 0).to(torch.uint8)
    picture = Image.fromarray(canvas.squeeze(2).numpy() if channels == 1 else canvas.numpy())
    with replace_atomically(path, "preview") as out:
        picture.save(out, format="PNG")
    return picture.size
