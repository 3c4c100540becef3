"""Moving batches to the accelerator: `to_device` sends uint8 and converts only on the
device, augmenting there when given an `Augment` (fastload.augment)."""

from __future__ import annotations

import functools
from typing import Optional, Sequence, Tuple, Union

import torch

from fastload.augment import Augment, check_uint8_batch, convert, kernel_runs


def to_device(
    images: torch.Tensor,
    device: Union[str, torch.device],
    dtype: torch.dtype = torch.float32,
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    channels_last: bool = True,
    augment: Optional[Augment] = None,
    keys=None,
    epoch: int = 0,
) -> torch.Tensor:
    """Moves a uint8 N×H×W×C batch to `device` and only there makes it N×C×H×W `dtype`,
    scaled to [0, 1] and normalized per channel with `mean`/`std` (in 0–1 units) when given.

    Why: the host-to-device link is a real bottleneck (Thunderbolt ~5 GB/s, PCIe 4.0 x16
    ~25 GB/s), and uint8 is a quarter of the bytes of float32. The copy is asynchronous
    when the batch is in pinned memory. With channels_last=True the result keeps the
    channels_last memory format that NHWC data has anyway (no transpose copy; fast for
    convolutions on GPUs); otherwise it is made contiguous NCHW.

    With `augment`, the batch is augmented on the device in the same float pass, each image by
    draws that depend on (augment.seed, `epoch`, its record index in `keys`: the indices
    FastLoadDataset(return_indices=True) yields), so not on batch size, workers or resumes.
    On the CPU (float32) the augmented batch is written into memory that fastload reuses for a
    later batch once this one and every view of it are gone (a tensor over a NumPy array; its
    storage cannot be resized): fresh memory per batch cost as much as the augmentation.
    """
    check_uint8_batch(images)
    if augment is not None and not isinstance(augment, Augment):
        raise TypeError(f"augment must be a fastload.Augment, not {type(augment).__name__}")
    if augment is not None and augment.active and keys is None:
        raise ValueError(
            "augment needs keys: the record index of each image (FastLoadDataset(return_indices=True))"
        )
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None) if dtype.isidentifier() else None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch dtype such as torch.float32, not {dtype!r}")
    channels = images.shape[3]
    mean_v = (0.0,) if mean is None else tuple(torch.as_tensor(mean, dtype=torch.float64).flatten().tolist())
    std_v = (1.0,) if std is None else tuple(torch.as_tensor(std, dtype=torch.float64).flatten().tolist())
    for name, value in (("mean", mean_v), ("std", std_v)):
        if len(value) not in (1, channels):
            raise ValueError(f"{name} must have 1 or {channels} values, not {len(value)}")
    if 0.0 in std_v:
        raise ValueError("std must not be zero")
    on_device = images.to(device, non_blocking=images.is_pinned())
    scale, shift = _normalization(on_device.device, dtype, mean_v, std_v)
    if augment is not None and augment.active:
        return augment.apply(on_device, keys, epoch, dtype, scale, shift, channels_last)
    if channels_last and len(images) and kernel_runs(on_device, dtype):
        return convert(on_device, scale, shift)
    x = on_device.permute(0, 3, 1, 2).to(dtype).mul_(scale).sub_(shift)
    return x if channels_last else x.contiguous()


@functools.lru_cache(maxsize=64)
def _normalization(
    device: torch.device, dtype: torch.dtype, mean: tuple, std: tuple
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-channel scale and shift on `device`, made once per (device, dtype, mean, std): a
    fresh small tensor per batch would be a synchronous host-to-device copy, queued behind the
    batch's asynchronous one, so the host would wait for every batch to arrive."""
    mean_t, std_t = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
    scale = (1.0 / (255.0 * std_t)).to(device=device, dtype=dtype).view(1, -1, 1, 1)
    shift = (mean_t / std_t).to(device=device, dtype=dtype).view(1, -1, 1, 1)
    return scale, shift
