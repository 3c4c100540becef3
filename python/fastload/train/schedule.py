"""The learning-rate schedule (``TrainConfig.schedule``): the rate of each optimizer step, a
function of the step alone so that a resumed run follows the same curve."""

from __future__ import annotations

import math

WARMUP_SHARE = 0.05  # cosine schedule: linear warm-up over this share of the steps


def learning_rate(schedule: str, lr: float, step: int, total_steps: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``total_steps``: constant, or a
    short linear warm-up then a cosine decay to 0, which tolerates a higher peak rate and ends
    with small steps (on the demo's short runs it beat every constant rate tried). A function of
    the step alone, so a resumed run follows the same curve."""
    if schedule == "constant":
        return lr
    warmup = max(1, int(WARMUP_SHARE * total_steps))
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
