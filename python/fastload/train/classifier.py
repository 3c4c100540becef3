"""The model of a classification run: :class:`MonotonicClassifier`, one logit per class, each
non-decreasing in the declared monotone inputs for every image."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import nn

from fastload.monotonic.layers import MonotonicRegressor, SmallCNN

# Each logit's bounds. Logits start near 0 (every class equally likely); a gap of 16 between two
# logits is a probability ratio of about 9e6, beyond what any label noise justifies.
LOGIT_RANGE = (-8.0, 8.0)


class MonotonicClassifier(nn.Module):
    """Image classifier whose every class logit is non-decreasing in every extra scalar input.

    ``model(images, monotone_inputs)`` returns logits (N, num_classes). ``backbone`` (default:
    :class:`~fastload.monotonic.MonotonicRegressor`'s small CNN) is shared by the classes; each
    class's logit is a :class:`~fastload.monotonic.MonotonicRegressor` head on its features (that
    regressor's own backbone is the identity): the features squashed into its lattice's domain,
    its own monotone-input calibrators, lattice and increasing output calibrator, bounded to
    ``LOGIT_RANGE``. So each logit is monotone by the regressor's construction, with its
    guarantees (the lattice output as logits), and :func:`~fastload.monotonic.check_monotone`
    checks every logit at once. The class probabilities are not monotone: a softmax of logits
    that all rise can still fall for one class.
    """

    def __init__(
        self,
        num_classes: int,
        backbone: Optional[nn.Module] = None,
        num_features: int = 8,
        monotone_inputs: int = 0,
        lattice_size: int = 3,
        in_channels: int = 3,
        monotone_input_range: Union[Tuple[float, float], Sequence[Tuple[float, float]]] = (0.0, 1.0),
        seed: int = 0,
    ):
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.num_classes = num_classes
        self.backbone = backbone if backbone is not None else SmallCNN(in_channels, num_features)
        low, high = LOGIT_RANGE
        self.heads = nn.ModuleList(
            MonotonicRegressor(
                backbone=nn.Identity(),
                num_features=num_features,
                monotone_inputs=monotone_inputs,
                lattice_size=lattice_size,
                monotone_input_range=monotone_input_range,
                output_min=low,
                output_max=high,
                seed=seed,
            )
            for _ in range(num_classes)
        )

    def forward(self, images: torch.Tensor, monotone_inputs: Optional[torch.Tensor] = None) -> torch.Tensor:
        features = self.backbone(images)
        return torch.stack([head(features, monotone_inputs) for head in self.heads], 1)
