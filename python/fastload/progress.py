"""Console output shared by the commands: a one-line progress bar on stderr (`pack`, `train`),
redrawn at most every `interval` seconds so that drawing never slows the work it reports on,
and how sizes are written (`gigabytes`)."""

from __future__ import annotations

import sys
import time


def gigabytes(n: float) -> str:
    """`n` bytes as GB (10**9 bytes), the unit every command reports sizes in."""
    return f"{n / 1e9:,.3f} GB"


class ProgressLine:
    def __init__(self, enabled: bool, total: int, interval: float = 0.1, width: int = 30):
        self.enabled, self.total, self.interval, self.width = enabled, total, interval, width
        self.stream = sys.stderr
        self.start = time.perf_counter()
        self.drawn = 0.0

    def due(self, force: bool = False) -> bool:
        """Whether a redraw is wanted now (always when `force`, never when disabled)."""
        now = time.perf_counter()
        if not self.enabled or (not force and now - self.drawn < self.interval):
            return False
        self.drawn = now
        return True

    def elapsed(self) -> float:
        return max(time.perf_counter() - self.start, 1e-9)

    def draw(self, done: int, prefix: str, suffix: str) -> None:
        """Rewrites the line as `prefix [####....] done/total suffix`."""
        filled = self.width * done // max(self.total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r{prefix}[{bar}] {done:,}/{self.total:,} {suffix} ")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
