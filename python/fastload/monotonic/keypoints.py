"""Where a numeric feature's calibrator keypoints go, learned from the data and the target.

Why: a piecewise-linear calibrator can only bend at its keypoints, so with keypoints at evenly
spread quantiles a jump in the target (a price tier, a threshold) becomes a ramp over a whole
piece, and its error never trains away. Here part of the keypoints follow the data (quantiles,
so every piece sees samples) and part follow the target's change along the feature: the mean
target in fine quantile bins, and keypoints at quantiles of how much it changes from bin to bin
(and across two bins, for a jump inside one) beyond the noise of that change. A jump draws its
keypoints around it, so the calibrator rises within a fraction of a bin; a smooth effect, whose
change between fine bins is within their noise or spread evenly, keeps quantile keypoints.

Each feature's curve is measured on the target less the other numeric features' coarse curves
(one sweep of backfitting), so a jump in one feature is not drowned by the others' effects.
Measured in benches/RESULTS.md."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["place_keypoints"]

# Each fine bin holds at least this many samples (the curve's noise), and there are at most
# MAX_BINS (the resolution at which a jump is placed; gradient boosting uses 255 bins).
MIN_BIN_SAMPLES, MAX_BINS = 32, 1024
# Past this many rows the curves come from a sample (1024 bins of 256 samples).
SAMPLE_ROWS = 2**18
# Bins of the coarse curves taken out of the target before a feature's own curve is measured.
COARSE_BINS = 32
# The most of the keypoints that follow the target's change rather than the data.
TARGET_SHARE = 0.5
# A change between bins counts beyond this many standard errors of it.
SIGNIFICANCE = 4.0


def _bin_means(values: np.ndarray, target: np.ndarray, count: int) -> Tuple[np.ndarray, ...]:
    """(bin of each value, centre, mean target and its standard error per bin) over ``count``
    quantile bins of ``values`` (fewer where quantiles tie)."""
    edges = np.unique(np.quantile(values, np.linspace(0, 1, count + 1)))
    bins = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, max(len(edges) - 2, 0))
    sizes = np.maximum(np.bincount(bins), 1)
    means = np.bincount(bins, weights=target) / sizes
    squares = np.bincount(bins, weights=target**2) / sizes
    errors = np.sqrt(np.maximum(squares - means**2, 0) / sizes)
    return bins, np.bincount(bins, weights=values) / sizes, means, errors


def _keypoints(values: np.ndarray, target: np.ndarray, count: int, ends: Tuple[float, float]) -> List[float]:
    _, centres, means, errors = _bin_means(
        values, target, int(np.clip(len(values) // MIN_BIN_SAMPLES, 2, MAX_BINS))
    )
    # Change beyond the noise from each bin to the next, and across two bins (half to each
    # gap), which sees a jump inside a bin whole.
    change = np.maximum(np.abs(np.diff(means)) - SIGNIFICANCE * np.hypot(errors[1:], errors[:-1]), 0)
    across = np.maximum(np.abs(means[2:] - means[:-2]) - SIGNIFICANCE * np.hypot(errors[2:], errors[:-2]), 0)
    change[:-1] += across / 2
    change[1:] += across / 2
    spread = means.max() - means.min() if len(means) else 0.0
    share = TARGET_SHARE * min(1.0, change.sum() / spread) if change.sum() > 0 else 0.0
    # CDFs at the bin centres, the change spread evenly between neighbouring centres.
    data_cdf = np.linspace(0.0, 1.0, len(centres))
    change_cdf = np.concatenate([[0.0], np.cumsum(change)]) / max(change.sum(), np.finfo(float).tiny)
    mixture = (1 - share) * data_cdf + share * change_cdf
    inner = np.interp(np.linspace(0.0, 1.0, count)[1:-1], mixture, centres) if len(centres) > 1 else []
    return [float(p) for p in np.unique(np.concatenate([ends, inner]).astype(np.float32))]


def place_keypoints(
    columns: Sequence[Optional[np.ndarray]], target: np.ndarray, counts: Sequence[int], seed: int = 0
) -> List[Optional[List[float]]]:
    """Keypoints for each numeric feature: ``columns`` its values (NaN where missing), None for
    a categorical feature; ``target`` the matching targets (any scale); ``counts`` the most
    keypoints per feature. Each list covers the feature's range, distinct in float32; None for
    a categorical feature or one with fewer than two distinct values. Past ``SAMPLE_ROWS`` rows
    the curves come from a sample of that many, drawn from ``seed`` (the ends from every row)."""
    target = np.asarray(target, dtype=np.float64)
    ranges = [
        None if v is None else (np.nanmin(v), np.nanmax(v)) if (~np.isnan(v)).any() else None for v in columns
    ]
    if len(target) > SAMPLE_ROWS:
        rows = np.random.default_rng(seed).choice(len(target), SAMPLE_ROWS, replace=False)
        columns, target = [None if v is None else v[rows] for v in columns], target[rows]
    centred = target - target.mean()
    coarse = []
    for values in columns:
        fitted = np.zeros(len(target))
        if values is not None and (~np.isnan(values)).any():
            present = ~np.isnan(values)
            bins, _, means, _ = _bin_means(values[present], centred[present], COARSE_BINS)
            fitted[present] = means[bins]
        coarse.append(fitted)
    others = np.sum(coarse, axis=0)
    keypoints: List[Optional[List[float]]] = []
    for values, fitted, count, ends in zip(columns, coarse, counts, ranges):
        present = None if values is None else ~np.isnan(values)
        distinct = 0 if values is None else len(np.unique(values[present]))
        if ends is None or ends[0] == ends[1] or distinct < 2:
            keypoints.append(None)
            continue
        partial = centred - (others - fitted)
        # More keypoints than the feature has values would only repeat them.
        keypoints.append(_keypoints(values[present], partial[present], min(count, distinct), ends))
    return keypoints
