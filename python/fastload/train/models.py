"""Every image model a run trains, and how a run's config builds one: :class:`SmallCNN`, the
default backbone; :class:`~fastload.train.MonotonicRegressor`, an image regressor monotone in extra scalar
inputs; :class:`MonotonicClassifier`, one such regressor head per class logit; and
:func:`build_model`, the model a checkpoint's config describes. The layers they are made of
(calibrators, lattices) are :mod:`fastload.monotonic`'s."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from fastload._checks import import_optional
from fastload.monotonic.calibrators import PWLCalibrator
from fastload.monotonic.constraints import check_inputs
from fastload.monotonic.lattice import Lattice, LatticeEnsemble, check_lattice_size
from fastload.monotonic.ordinal import CumulativeLink, class_log_probabilities
from fastload.options import BACKBONES
from fastload.train.task import CLASSIFICATION


class SmallCNN(nn.Module):
    """Three stride-2 conv/BN/ReLU stages, global average pooling and a linear head. Pools with
    ``mean`` rather than AdaptiveAvgPool2d, whose CUDA backward is not deterministic."""

    def __init__(self, in_channels: int, num_features: int):
        super().__init__()
        layers, channels = [], in_channels
        for width in (16, 32, 64):
            layers += [
                nn.Conv2d(channels, width, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
            ]
            channels = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(channels, num_features)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(images).mean((2, 3)))


# Keypoints of each calibrator of a regressor: its output's, and its inputs' when not given.
NUM_KEYPOINTS = 10


class MonotonicRegressor(nn.Module):
    """Image regressor that is non-decreasing in every extra scalar input, for every image.

    ``model(images, monotone_inputs)``: images (N, C, H, W) go through ``backbone`` (default: a
    small CNN; any module mapping the batch to (N, num_features) works) and are squashed into the
    lattice domain; each column of ``monotone_inputs`` (N, M) goes through an increasing calibrator
    into a monotone lattice dimension, never into the backbone. A calibrator bends only at its
    keypoints: ``monotone_input_keypoints`` (one increasing list per input, such as
    :func:`~fastload.monotonic.keypoints.place_keypoints` gives, dense where the labels step)
    sets them, so a step in an input is learned as a step; without it they are ``num_keypoints``
    evenly spaced over ``monotone_input_range`` (one (low, high) pair for all, or one per input),
    where a step becomes a ramp over a whole piece. The lattice output passes an increasing output
    calibrator, bounded by ``output_min``/``output_max`` when given: pass a range a little wider
    than the labels' so training starts with predictions in the right place. With more than
    ``lattice_rank`` lattice inputs a :class:`LatticeEnsemble` of ``num_lattices`` lattices
    (default: enough to use each input about twice) replaces the single lattice. Returns (N,).
    """

    def __init__(
        self,
        backbone: Optional[nn.Module] = None,
        num_features: int = 8,
        monotone_inputs: int = 0,
        lattice_size: int = 3,
        in_channels: int = 3,
        monotone_input_range: Union[Tuple[float, float], Sequence[Tuple[float, float]]] = (0.0, 1.0),
        num_keypoints: int = NUM_KEYPOINTS,
        lattice_rank: int = 4,
        num_lattices: Optional[int] = None,
        output_min: Optional[float] = None,
        output_max: Optional[float] = None,
        seed: int = 0,
        monotone_input_keypoints: Optional[Sequence[Sequence[float]]] = None,
    ):
        super().__init__()
        if num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {num_features}")
        if monotone_inputs < 0:
            raise ValueError(f"monotone_inputs must be >= 0, got {monotone_inputs}")
        if lattice_size < 2:
            raise ValueError(f"lattice_size must be >= 2, got {lattice_size}")
        ranges = list(monotone_input_range)
        if len(ranges) == 2 and not isinstance(ranges[0], (tuple, list)):
            ranges = [tuple(ranges)] * monotone_inputs
        if len(ranges) != monotone_inputs:
            raise ValueError(
                f"monotone_input_range has {len(ranges)} pairs for {monotone_inputs} monotone inputs"
            )
        num_inputs = num_features + monotone_inputs
        sizes, count = self.lattice_layout(num_inputs, lattice_size, lattice_rank, num_lattices)
        check_lattice_size(sizes, count, "MonotonicRegressor")  # before any part is built
        self.num_features, self.num_monotone, self.lattice_size = num_features, monotone_inputs, lattice_size
        self.backbone = backbone if backbone is not None else SmallCNN(in_channels, num_features)
        if monotone_input_keypoints is None:
            calibrators = [
                PWLCalibrator(num_keypoints, low, high, 1, 0.0, lattice_size - 1.0) for low, high in ranges
            ]
        else:
            calibrators = _placed_calibrators(monotone_input_keypoints, monotone_inputs, lattice_size)
        self.input_calibrators = nn.ModuleList(calibrators)
        monotonicities = [0] * num_features + [1] * monotone_inputs
        if num_inputs <= lattice_rank:
            self.lattice = Lattice(sizes, monotonicities, 0.0, 1.0)
        else:
            self.lattice = LatticeEnsemble(
                num_inputs, lattice_rank, count, lattice_size, monotonicities, seed, 0.0, 1.0
            )
        self.output_calibrator = PWLCalibrator(num_keypoints, 0.0, 1.0, 1, output_min, output_max)

    @staticmethod
    def lattice_layout(
        num_inputs: int, lattice_size: int, lattice_rank: int = 4, num_lattices: Optional[int] = None
    ) -> Tuple[List[int], int]:
        """(each lattice's sizes, how many lattices) the regressor builds for ``num_inputs``
        lattice inputs (image features and monotone inputs): one lattice over all of them, or an
        ensemble of lattices over ``lattice_rank`` each."""
        if num_inputs <= lattice_rank:
            return [lattice_size] * num_inputs, 1
        return [lattice_size] * lattice_rank, num_lattices or math.ceil(2 * num_inputs / lattice_rank)

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """Backbone features squashed into the lattice domain, shape (N, num_features)."""
        features = self.backbone(images)
        check_inputs(features, self.num_features, "backbone output")
        return torch.sigmoid(features) * (self.lattice_size - 1)

    def head(
        self, image_features: torch.Tensor, monotone_inputs: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Prediction from :meth:`image_features`; the part that is monotone in monotone_inputs."""
        if self.num_monotone and monotone_inputs is None:
            raise ValueError(f"this model needs monotone_inputs of shape (N, {self.num_monotone})")
        lattice_inputs = [image_features]
        if monotone_inputs is not None:
            check_inputs(monotone_inputs, self.num_monotone, "monotone_inputs")
            if monotone_inputs.shape[0] != image_features.shape[0]:
                raise ValueError(
                    f"monotone_inputs has {monotone_inputs.shape[0]} rows for {image_features.shape[0]} images"
                )
            lattice_inputs += [
                calibrator(monotone_inputs[:, i]).to(image_features.dtype)[:, None]
                for i, calibrator in enumerate(self.input_calibrators)
            ]
        return self.output_calibrator(self.lattice(torch.cat(lattice_inputs, 1)))

    def forward(self, images: torch.Tensor, monotone_inputs: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.head(self.image_features(images), monotone_inputs)


# Each logit's bounds. Logits start near 0 (every class equally likely); a gap of 16 between two
# logits is a probability ratio of about 9e6, beyond what any label noise justifies.
LOGIT_RANGE = (-8.0, 8.0)


class MonotonicClassifier(nn.Module):
    """Image classifier whose every class logit is non-decreasing in every extra scalar input.

    ``model(images, monotone_inputs)`` returns logits (N, num_classes). ``backbone`` (default:
    :class:`~fastload.train.MonotonicRegressor`'s small CNN) is shared by the classes; each
    class's logit is a :class:`~fastload.train.MonotonicRegressor` head on its features (that
    regressor's own backbone is the identity): the features squashed into its lattice's domain,
    its own monotone-input calibrators (over ``monotone_input_keypoints`` when given, as the
    regressor's), lattice and increasing output calibrator, bounded to
    ``LOGIT_RANGE``. So each logit is monotone by the regressor's construction, with its
    guarantees (the lattice output as logits), and :func:`~fastload.monotonic.check_monotone`
    checks every logit at once. The class probabilities are not monotone: a softmax of logits
    that all rise can still fall for one class.

    ``ordinal=True`` (ordered classes: grades, ratings, tiers): one such head gives a score and a
    :class:`~fastload.monotonic.ordinal.CumulativeLink` turns it into P(y >= k) for every k,
    each monotone in every extra input; the model returns the log class probabilities
    (:func:`~fastload.monotonic.ordinal.class_log_probabilities`), so cross-entropy on them is
    the ordinal likelihood and their argmax the likeliest class.
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
        ordinal: bool = False,
        monotone_input_keypoints: Optional[Sequence[Sequence[float]]] = None,
    ):
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.num_classes = num_classes
        self.link = CumulativeLink(num_classes) if ordinal else None
        self.backbone = backbone if backbone is not None else SmallCNN(in_channels, num_features)
        low, high = LOGIT_RANGE
        self.heads = nn.ModuleList(
            MonotonicRegressor(
                backbone=nn.Identity(),
                num_features=num_features,
                monotone_inputs=monotone_inputs,
                lattice_size=lattice_size,
                monotone_input_range=monotone_input_range,
                monotone_input_keypoints=monotone_input_keypoints,
                output_min=low,
                output_max=high,
                seed=seed,
            )
            for _ in range(1 if ordinal else num_classes)
        )

    def forward(self, images: torch.Tensor, monotone_inputs: Optional[torch.Tensor] = None) -> torch.Tensor:
        features = self.backbone(images)
        if self.link is not None:
            return class_log_probabilities(self.link(self.heads[0](features, monotone_inputs)))
        return torch.stack([head(features, monotone_inputs) for head in self.heads], 1)


def channels_last_convolutions(model: nn.Module) -> nn.Module:
    """Stores the weights of ``model``'s 2-d convolutions channels_last, the layout of the
    batches to_device hands it (cuDNN's fast path for NHWC images), in place. Only those:
    ``model.to(memory_format=torch.channels_last)`` also reorders every other 4-d tensor and
    refuses 5-d ones, such as the vertices of a lattice of rank 4 (the default model's
    LatticeEnsemble: num_lattices x 3 x 3 x 3 x 3), which failed every CUDA run (#25)."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.to(memory_format=torch.channels_last)
    return model


def model_state_bytes(model: nn.Module) -> int:
    """Bytes a model's training holds beside its activations: its parameters and buffers, a
    gradient per parameter and AdamW's two moments per parameter."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return 4 * params + buffers


def build_model(
    config: dict, backbone: Union[str, nn.Module, None] = None
) -> Union[MonotonicRegressor, MonotonicClassifier]:
    """The model a run's ``config`` (as stored in its checkpoints) describes: a regressor, or a
    classifier of ``config["class_names"]`` when its task is classification; its monotone-input
    calibrators over ``config["monotone_input_keypoints"]``, or even keypoints over
    ``config["monotone_input_range"]`` for a config without them (an older checkpoint)."""
    ranges = [tuple(r) for r in config["monotone_input_range"]]
    common = dict(
        backbone=_make_backbone(
            backbone if backbone is not None else config["backbone"],
            config["in_channels"],
            config["num_features"],
        ),
        num_features=config["num_features"],
        monotone_inputs=len(ranges),
        lattice_size=config["lattice_size"],
        in_channels=config["in_channels"],
        monotone_input_range=ranges if ranges else (0.0, 1.0),
        # Absent from checkpoints written before keypoints were placed: their even keypoints.
        monotone_input_keypoints=config.get("monotone_input_keypoints"),
        seed=config["seed"],
    )
    if config.get("task") == CLASSIFICATION:
        return MonotonicClassifier(len(config["class_names"]), ordinal=config.get("ordinal", False), **common)
    output_min, output_max = config["output_range"]
    return MonotonicRegressor(output_min=output_min, output_max=output_max, **common)


def _placed_calibrators(
    keypoints: Sequence[Sequence[float]], monotone_inputs: int, lattice_size: int
) -> List[PWLCalibrator]:
    """An increasing calibrator into the lattice domain over each input's own keypoints; an
    error names the input whose list is wrong."""
    if len(keypoints) != monotone_inputs:
        raise ValueError(
            f"monotone_input_keypoints has {len(keypoints)} keypoint list(s) for {monotone_inputs} monotone inputs"
        )
    calibrators = []
    for i, points in enumerate(keypoints):
        try:
            calibrators.append(
                PWLCalibrator(input_keypoints=points, output_min=0.0, output_max=lattice_size - 1.0)
            )
        except ValueError as exc:
            raise ValueError(f"monotone_input_keypoints[{i}]: {exc}") from None
    return calibrators


def _make_backbone(backbone: Union[str, nn.Module, None], in_channels: int, num_features: int):
    if backbone is None or isinstance(backbone, nn.Module):
        return backbone
    if backbone == "small-cnn":
        return None  # MonotonicRegressor's own default
    if backbone != "resnet18":
        raise ValueError(
            f"backbone must be one of {', '.join(BACKBONES)} or a torch module, not {backbone!r}"
        )
    models = import_optional(
        "torchvision.models", "the resnet18 backbone (or use --backbone small-cnn)", "pip install torchvision"
    )
    net = models.resnet18(weights=None, num_classes=num_features)
    if in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net
