"""benches/bench_fit_many.py: the command that crashed on an H200 (#25), run on the CPU with
every mode, and a failing child reported with its command, exit status and stderr while the
bench goes on. Speeds are never asserted here; benches/RESULTS.md records them."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benches" / "bench_fit_many.py"


def _bench(*args, timeout=240):
    return subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=timeout
    )


def test_the_command_that_failed_on_cuda_runs_every_mode_on_the_cpu(tmp_path):
    # #25 ran `--device cuda --counts 4 --repeats 1 --records 4096 --side 96 --epochs 2
    # --batch-size 256`; here the same modes at a size a busy 2-core machine runs in a minute.
    out = tmp_path / "fit_many.json"
    args = ["--device", "cpu", "--counts", "2", "--records", "256", "--side", "16", "--epochs", "1"]
    done = _bench(*args, "--repeats", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["fit_many", "fit_many --stack", "separate", "one after another"]
    # Every mode trains 2 runs on the same records: the same model-images, each timed.
    assert (
        len({r["repeats"][0]["model_images"] for r in rows}) == 1
        and rows[0]["repeats"][0]["model_images"] > 0
    )
    for row in rows:
        assert row["model_images_per_s"] > 0 and row["training_seconds"] > 0, row
        assert row["gpu_busy_percent"] is None and row["gpu_memory_per_run"] is None  # no GPU: n/a
    assert "| 2 | fit_many --stack |" in done.stdout and "| n/a | n/a |" in done.stdout
    assert "N=2: fit_many / separate: " in done.stdout


def test_a_failing_child_is_reported_and_the_bench_exits_1_without_a_traceback():
    # The child refuses --threads 100000; on the H200 the bench died with a JSONDecodeError on
    # the stderr of a child that had failed, which it never showed.
    args = ["--device", "cpu", "--counts", "1", "--records", "64", "--side", "8", "--epochs", "1"]
    done = _bench(*args, "--repeats", "1", "--threads", "100000")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "JSONDecodeError" not in done.stderr
    assert "fit_many with N=1 failed:" in done.stderr
    assert "command: fastload train " in done.stderr and " --threads 100000 " in done.stderr
    assert "exit status 2" in done.stderr and "fastload train: error: argument --threads" in done.stderr
    # It went on: every mode was tried, and each is in the table as failed.
    assert "one after another with N=1 failed:" in done.stderr
    assert done.stdout.count("| failed |") == 4
