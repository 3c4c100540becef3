"""Regularisers of the table models, as TensorFlow Lattice offers them: smoothness of each
numeric feature's calibrator (laplacian, hessian, wrinkle), smoothness of the lattices
(laplacian, torsion), and an L2 penalty on the linear weights and lattice vertex values.

Why: a calibrated lattice has a free output per keypoint and per vertex, so on a table of a
few hundred rows it fits noise; each regulariser pulls the fit toward a simpler function of
the kind a statistician would expect (a calibrator toward flat, linear or a smooth curve; a
lattice toward flat or additive), as ridge regression does for a linear model. They add to
the training loss and shape the fit only: the parameters still pass through the maps of
:mod:`fastload.monotonic.constraints`, so every guarantee of monotonicity, convexity and
bounds holds whatever the strengths.

The scale: training minimises the weighted mean loss over the rows (a regressor's on its
standardized target, variance 1) plus each strength times its sum of squares below, so a
strength of 1e-3 is a light touch and 1 dominates any fit. All are sums of squares (TF
Lattice's l2 forms), smooth in the parameters as L-BFGS needs:

- ``calibrator_laplacian``: squared differences of a calibrator's outputs at neighbouring
  keypoints (toward a flat calibrator); ``calibrator_hessian``: squared second differences
  (toward a straight line over the keypoints); ``calibrator_wrinkle``: squared third
  differences (toward a curve without kinks). Outputs run from 0 to ``lattice_size - 1``;
  categorical calibrators are not smoothed (their categories have no neighbours).
- ``lattice_laplacian``: squared differences of neighbouring vertex values along each
  dimension (toward a flat lattice); ``lattice_torsion``: squared mixed differences over each
  pair of dimensions, v11 - v10 - v01 + v00 (toward a lattice additive in its inputs, without
  interactions). An ensemble's lattices are measured by what each adds to the output, its
  vertex values over the lattice count.
- ``l2``: squared linear weights, and squared lattice vertex values as each adds to the output.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields
from typing import Any, Dict, Sequence

import torch
from torch import nn

from fastload.monotonic.calibrators import PWLCalibrator

__all__ = ["MAX_STRENGTH", "REGULARIZERS", "Regularization"]

# The strongest a regulariser may be: at 1 it already dominates any fit, and the penalty, in
# float32, would overflow to infinity near 1e308 (a diverged fit, not a refusal by name).
MAX_STRENGTH = 1e6


@dataclass(frozen=True)
class Regularization:
    """The strength of each regulariser (module docstring: what each measures, and its scale);
    0 leaves it out."""

    calibrator_laplacian: float = 0.0
    calibrator_hessian: float = 0.0
    calibrator_wrinkle: float = 0.0
    lattice_laplacian: float = 0.0
    lattice_torsion: float = 0.0
    l2: float = 0.0

    def __post_init__(self):
        for name, value in self.items().items():
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Real)
                or not 0 <= value <= MAX_STRENGTH
            ):
                raise ValueError(f"{name} must be a number from 0 to {MAX_STRENGTH:g}, got {value!r}")
            object.__setattr__(self, name, float(value))  # a NumPy scalar saves as a plain float

    @classmethod
    def of(cls, params: Dict[str, Any]) -> Regularization:
        """The strengths among ``params`` (an estimator's parameters), as floats."""
        return cls(**{name: params[name] for name in REGULARIZERS})

    def items(self) -> Dict[str, float]:
        """Each regulariser's name and strength."""
        return {name: getattr(self, name) for name in REGULARIZERS}

    def __bool__(self) -> bool:
        """Whether any strength is above 0 (training adds no penalty otherwise)."""
        return any(self.items().values())

    def penalty(
        self, calibrators: Sequence[nn.Module], lattices: Sequence[nn.Module], linear
    ) -> torch.Tensor:
        """The sum of each strength times its sum of squares over the given layers."""
        total = torch.zeros(())
        calibrator_strengths = (self.calibrator_laplacian, self.calibrator_hessian, self.calibrator_wrinkle)
        for calibrator in calibrators:
            if not isinstance(calibrator, PWLCalibrator):
                continue
            outputs = calibrator.keypoint_outputs()
            for order, strength in enumerate(calibrator_strengths, 1):
                if strength and len(outputs) > order:
                    total = total + strength * outputs.diff(order).square().sum()
        for lattice in lattices:
            if not (self.lattice_laplacian or self.lattice_torsion or self.l2):
                break
            values = lattice.bank.vertex_values(torch.float32)
            values = values / len(values)  # each lattice's share of an ensemble's mean
            dims = range(1, values.dim())
            if self.lattice_laplacian:
                total = total + self.lattice_laplacian * sum(values.diff(dim=d).square().sum() for d in dims)
            if self.lattice_torsion:
                mixed = [values.diff(dim=d).diff(dim=e) for d in dims for e in dims if d < e]
                total = total + self.lattice_torsion * sum(m.square().sum() for m in mixed)
            if self.l2:
                total = total + self.l2 * values.square().sum()
        if linear is not None and self.l2:
            total = total + self.l2 * linear.weight.square().sum()
        return total


REGULARIZERS = tuple(f.name for f in fields(Regularization))
