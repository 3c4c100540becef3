"""The progress pack, train and bench draw on stderr: a bar with rate and ETA, redraws
throttled, nothing when disabled, status messages as plain lines off a terminal."""

import io

import pytest

from fastload.pack import pack
from fastload.progress import Progress


def test_bar_shows_count_rate_eta_and_postfix_and_ends_with_newline():
    bar = Progress(True, total=10, desc="packing", unit=" files", stream=io.StringIO())
    bar.update(5, "5.0 MB/s read", force=True)
    bar.close()
    text = bar.stream.getvalue()
    last = text.rstrip().split("\r")[-1]
    assert last.startswith("packing  50%|") and "| 5/10 files [" in last
    assert "files/s, ETA " in last and last.rstrip().endswith(", 5.0 MB/s read]") and text.endswith("\n")


def test_disabled_progress_writes_nothing_and_redraws_are_throttled():
    quiet = Progress(False, total=4, stream=io.StringIO())
    assert not quiet.due(force=True)
    quiet.update(2, lambda: pytest.fail("a disabled bar computes no postfix"), force=True)
    quiet.say("never shown")
    quiet.close()
    assert quiet.stream.getvalue() == ""
    line = Progress(True, total=4, interval=60, stream=io.StringIO())
    assert line.due() and not line.due() and line.due(force=True)


def test_bar_computes_a_costly_postfix_only_when_it_redraws():
    bar = Progress(True, total=4, interval=60, stream=io.StringIO())
    calls = []
    for done in range(1, 5):
        bar.update(done, lambda: calls.append(1) or "loss 1")
    assert len(calls) == 1


def test_status_off_a_terminal_is_plain_lines():
    status = Progress(True, desc="fastload bench", stream=io.StringIO())
    status.say("round 1/3: memcpy")
    status.close()
    assert status.stream.getvalue() == "fastload bench: round 1/3: memcpy\n"


def test_pack_draws_nothing_when_stderr_is_not_a_terminal(tmp_path, capsys):
    from PIL import Image

    (tmp_path / "src" / "cat").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "src" / "cat" / "a.png")
    pack(tmp_path / "src", tmp_path / "s.fl", 8)
    assert capsys.readouterr().err == ""
