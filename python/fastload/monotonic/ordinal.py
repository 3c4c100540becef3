"""Ordered classes: a cumulative-link head, so that a score monotone in a feature makes the
probability of every "at least this class" monotone in it.

Why: with one score per class and a softmax, each class's score can be monotone while its
probability still falls (another class's score rose faster). For ordered classes (ratings,
grades, risk tiers) the quantity a monotone promise is about is P(y >= k). The head turns one
score s into cumulative log-odds ``s - t_k`` against increasing thresholds ``t_1 < ... <
t_{K-1}``, so P(y >= k) = sigmoid(s - t_k) rises with s for every k, and the class
probabilities P(y = k) = P(y >= k) - P(y >= k + 1) are non-negative by construction. (A
sigmoid in floating point can split a tie by one ulp, as the binary classifier's can.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastload.monotonic.constraints import inverse_softplus

__all__ = ["CumulativeLink", "class_log_probabilities", "class_probabilities", "ordinal_loss"]


class CumulativeLink(nn.Module):
    """Scores (N,) -> cumulative log-odds (N, num_classes - 1): column k is the log-odds of
    ``y >= k + 1``. Thresholds: a first value plus softplus increments (strictly increasing,
    a running sum of positive terms stays increasing under rounding), starting evenly spread
    over [-1, 1]."""

    def __init__(self, num_classes: int):
        super().__init__()
        if int(num_classes) < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        gaps = int(num_classes) - 2
        steps = inverse_softplus(torch.full((gaps,), 2.0 / max(gaps, 1)))
        self.raw = nn.Parameter(torch.cat([torch.tensor([-1.0 if gaps else 0.0]), steps]))

    def thresholds(self) -> torch.Tensor:
        return torch.cat([self.raw[:1], F.softplus(self.raw[1:])]).cumsum(0)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.reshape(-1, 1) - self.thresholds().to(scores.dtype)


def class_probabilities(cumulative: torch.Tensor) -> torch.Tensor:
    """(N, K - 1) cumulative log-odds -> (N, K) class probabilities, each >= 0, summing to 1."""
    at_least = torch.sigmoid(cumulative)
    ones, zeros = torch.ones_like(at_least[:, :1]), torch.zeros_like(at_least[:, :1])
    padded = torch.cat([ones, at_least, zeros], 1)
    return (padded[:, :-1] - padded[:, 1:]).clamp(min=0)


def class_log_probabilities(cumulative: torch.Tensor) -> torch.Tensor:
    """(N, K - 1) cumulative log-odds -> (N, K) log class probabilities, in a form that stays
    finite: log(sigmoid(a) - sigmoid(b)) = log sigmoid(a) + log sigmoid(-b) + log(1 - exp(b - a))
    for a = s - t_k > b = s - t_{k+1}, where a - b = t_{k+1} - t_k does not depend on s. A
    softmax of them gives the class probabilities back, so cross-entropy on them is the
    ordinal likelihood."""
    infinite = torch.full_like(cumulative[:, :1], float("inf"))
    above = torch.cat([infinite, cumulative], 1)  # s - t_k, t_0 = -inf
    below = torch.cat([cumulative, -infinite], 1)  # s - t_{k+1}, t_K = +inf
    return F.logsigmoid(above) + F.logsigmoid(-below) + torch.log(-torch.expm1(below - above))


def ordinal_loss(cumulative: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Each sample's negative log-likelihood of its class ``codes`` (0 .. K - 1), (N,)."""
    return -class_log_probabilities(cumulative).gather(1, codes[:, None])[:, 0]
