"""The learning-rate schedule (train/schedule.py): a function of the step alone, so a resumed run
follows the curve of one that never stopped."""

from __future__ import annotations

from fastload.train import learning_rate
from fastload.train.schedule import WARMUP_SHARE


def test_the_cosine_schedule_warms_up_linearly_then_decays_to_zero():
    lr, total = 0.1, 1000
    warmup = int(WARMUP_SHARE * total)
    rates = [learning_rate("cosine", lr, step, total) for step in range(total)]
    assert rates[0] == lr / warmup and rates[warmup - 1] == lr == max(rates)
    assert all(a < b for a, b in zip(rates[: warmup - 1], rates[1:warmup]))
    assert rates[warmup] == lr  # the decay starts from the peak the warm-up reached
    assert all(a > b for a, b in zip(rates[warmup:-1], rates[warmup + 1 :]))
    assert 0 < rates[-1] < 1e-5 * lr and learning_rate("cosine", lr, total + 5, total) == 0.0


def test_a_short_cosine_run_starts_at_the_full_rate_and_constant_stays_there():
    assert learning_rate("cosine", 0.1, 0, 3) == 0.1  # fewer steps than one warm-up step
    assert [learning_rate("constant", 0.1, step, 10) for step in range(12)] == [0.1] * 12
