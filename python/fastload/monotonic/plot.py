"""``plot_calibrators``: a PNG of a fitted estimator's calibrators, one panel per feature.

A calibrator is the model's learned transform of one feature; seeing it is how a practitioner
checks that "increasing" and "concave" came out as meant and where the keypoints fell.
matplotlib is imported here, on first use, so nothing else in fastload needs it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Union

import torch

from fastload._checks import import_optional
from fastload.files import replace_atomically
from fastload.monotonic.calibrators import CategoricalCalibrator

__all__ = ["plot_calibrators"]


def plot_calibrators(model, path: Union[str, Path], columns: int = 3) -> Path:
    """Writes a PNG to ``path`` of each feature's calibrator of a fitted
    :class:`~fastload.monotonic.LatticeRegressor` or
    :class:`~fastload.monotonic.LatticeClassifier`: numeric features as the line through their
    keypoints (the quantiles of the training data), categorical ones as a bar per category, a
    dashed line for the learned output of missing values. Titles give each declaration. Returns
    the path. Raises MissingDependencyError (an ImportError) naming matplotlib when it is not installed. Written atomically
    by the output rule (:mod:`fastload.files`)."""
    FigureCanvasAgg = import_optional(
        "matplotlib.backends.backend_agg", "plot_calibrators", "pip install matplotlib"
    ).FigureCanvasAgg
    Figure = import_optional("matplotlib.figure", "plot_calibrators", "pip install matplotlib").Figure
    if not hasattr(model, "model_"):
        raise ValueError(
            f"plot_calibrators needs a fitted estimator, got {type(model).__name__} without model_"
        )
    features, calibrators = model.features_, model.model_.calibrators
    columns = max(1, min(columns, len(features)))
    rows = math.ceil(len(features) / columns)
    figure = Figure(figsize=(4 * columns, 3 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    with torch.no_grad():
        for index, (feature, calibrator) in enumerate(zip(features, calibrators)):
            axes = figure.add_subplot(rows, columns, index + 1)
            if isinstance(calibrator, CategoricalCalibrator):
                labels = [str(c) for c in model.categories_[index]]
                axes.bar(range(len(labels)), calibrator.category_outputs().float().numpy())
                axes.set_xticks(range(len(labels)), labels, rotation=45 if len(labels) > 4 else 0)
            else:
                axes.plot(
                    calibrator.keypoints.float().numpy(),
                    calibrator.keypoint_outputs().float().numpy(),
                    marker="o",
                    markersize=3,
                )
                axes.set_xlabel(feature.name)
            if calibrator.missing is not None:
                missing = calibrator.missing.value(torch.float32).item()
                axes.axhline(missing, linestyle="--", color="gray", label="missing")
                axes.legend(loc="best", fontsize="small")
            axes.set_title(f"{feature.name} ({feature.description})", fontsize="medium")
            axes.set_ylabel("calibrated")
    path = Path(path)
    with replace_atomically(path, "plot") as f:
        figure.savefig(f, format="png", dpi=100)
    return path
