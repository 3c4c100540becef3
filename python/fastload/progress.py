"""Console output shared by the commands: progress on stderr (`pack`, `train`, `bench`), drawn by
tqdm (rate and ETA), and how sizes are written (`gigabytes`)."""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO, Union

from tqdm import tqdm

#: Progress bars: `5/10 files [2.5 files/s, ETA 00:02, 3.1 MB/s]` (the unit carries its space).
BAR_FORMAT = (
    "{desc} {percentage:3.0f}%|{bar:24}| {n_fmt}/{total_fmt}{unit} [{rate_fmt}, ETA {remaining}{postfix}]"
)


def gigabytes(n: float) -> str:
    """`n` bytes as GB (10**9 bytes), the unit every command reports sizes in."""
    return f"{n / 1e9:,.3f} GB"


class Progress:
    """Progress of one task on stderr: a bar of `total` steps, or (`total` None) a status line
    of messages (`say`). Disabled, it writes nothing. A bar redraws in place at most every
    `interval` seconds, so drawing never slows the work it reports on; a status line redraws
    in place on a terminal and is written as plain lines (`fastload bench: ...`) elsewhere."""

    def __init__(
        self,
        enabled: bool,
        total: Optional[int] = None,
        desc: str = "",
        unit: str = " steps",
        interval: float = 0.1,
        stream: Optional[TextIO] = None,
    ):
        self.enabled, self.total, self.desc, self.interval = enabled, total, desc, interval
        self.stream = sys.stderr if stream is None else stream
        self.start = time.perf_counter()
        self.drawn = -float("inf")
        self.bar = None
        if enabled and (total is not None or self.stream.isatty()):
            self.bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                file=self.stream,
                mininterval=0,  # `due` throttles
                miniters=1,
                bar_format=BAR_FORMAT if total is not None else "{desc}",
                dynamic_ncols=True,
                leave=total is not None,  # a status line goes when its task ends
            )

    def due(self, force: bool = False) -> bool:
        """Whether a redraw is wanted now (always when `force`, never when disabled)."""
        now = time.perf_counter()
        if not self.enabled or (not force and now - self.drawn < self.interval):
            return False
        self.drawn = now
        return True

    def elapsed(self) -> float:
        return max(time.perf_counter() - self.start, 1e-9)

    def update(self, done: int, postfix: Union[str, Callable[[], str]] = "", force: bool = False) -> None:
        """Moves the bar to `done` steps when a redraw is due; `postfix` (a callable is only
        called then, so a costly figure such as a loss on the GPU is read rarely) follows the ETA."""
        if self.bar is None or not self.due(force):
            return
        self.bar.set_postfix_str(postfix() if callable(postfix) else postfix, refresh=False)
        self.bar.update(done - self.bar.n)
        self.bar.refresh()

    def say(self, message: str) -> None:
        """Shows what the task does now, as `DESC: message`."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_description_str(f"{self.desc}: {message}")
        else:
            print(f"{self.desc}: {message}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
