"""The progress line pack and train draw on a terminal."""

import io

from fastload.pack import _ProgressBar
from fastload.progress import ProgressLine


def test_line_redraws_in_place_and_ends_with_newline():
    line = ProgressLine(True, total=4, width=8)
    line.stream = io.StringIO()
    assert line.due(force=True)
    line.draw(2, "epoch 1/3 ", "loss 0.5")
    line.close()
    assert line.stream.getvalue() == "\repoch 1/3 [####....] 2/4 loss 0.5 \n"


def test_disabled_line_writes_nothing_and_redraws_are_throttled():
    quiet = ProgressLine(False, total=4)
    quiet.stream = io.StringIO()
    assert not quiet.due(force=True)
    quiet.close()
    assert quiet.stream.getvalue() == ""
    line = ProgressLine(True, total=4, interval=60)
    assert line.due() and not line.due() and line.due(force=True)


def test_pack_bar_shows_rate_and_eta():
    bar = _ProgressBar(True, 10)
    bar.stream = io.StringIO()
    bar.update(5, 5_000_000, force=True)
    text = bar.stream.getvalue()
    assert "] 5/10 files" in text and "files/s" in text and "MB/s" in text and "ETA" in text
