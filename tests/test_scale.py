"""The scale scripts in benches/: that they run, and that the per-record costs they measure stay
those of arrays. The full runs (250,000 records; a store larger than RAM) are in RESULTS.md:

    PYTHONPATH=python python -m pytest -q -m slow tests/test_scale.py
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHES = Path(__file__).resolve().parent.parent / "benches"


@pytest.mark.slow
def test_small_part_scales_by_arrays_not_per_record_objects(tmp_path):
    """Between 500 and 5,000 records the plan of an epoch grows by arrays (8 bytes a record per
    int64 array alive at once): a list of Python ints or tuples per record would add 36+ bytes."""
    out = tmp_path / "small.json"
    subprocess.run(
        [
            sys.executable,
            str(BENCHES / "scale.py"),
            "small",
            "--counts",
            "500,5000",
            "--repeats",
            "1",
            "--steps",
            "2",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    small = json.loads(out.read_text())["small"]
    assert not (tmp_path / "work").exists(), "work files were left behind"
    for count in ("500", "5000"):
        row = small["counts"][count]
        for order in ("random", "block", "sequential"):
            assert row[f"epoch_{order}"]["records"] == int(count)
        assert row["ddp_8_ranks"]["ranks"] == 8 and row["ddp_8_ranks"]["padding"] < 8
    marginal = small["tracemalloc_marginal_bytes_per_record"]
    for step in ("open", "dataset", "plan_block", "plan_random", "first_batch"):
        assert marginal[step] < 64, (step, marginal)
    # pack, info and verify hold the source names (one str each, in the store's metadata).
    for step in ("pack", "info", "verify"):
        assert marginal[step] < 256, (step, marginal)


@pytest.mark.slow
def test_large_part_reads_a_store_cold_in_every_order(tmp_path):
    out = tmp_path / "large.json"
    subprocess.run(
        [
            sys.executable,
            str(BENCHES / "scale.py"),
            "large",
            "--gb",
            "0.2",
            "--random-gb",
            "0.05",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    large = json.loads(out.read_text())["large"]
    assert large["store"]["bytes"] > 0.19e9
    for mode in ("read", "sequential", "block"):
        assert large["passes"][mode]["bytes"] >= large["store"]["records"] * 384 * 384 * 3, mode
    assert large["passes"]["random"]["bytes"] >= 0.05e9
    assert set(large["x_sequential_read"]) == {"read", "sequential", "block", "random"}


@pytest.mark.slow
def test_device_check_dry_run_on_cpu_writes_every_figure(tmp_path):
    out = tmp_path / "device.json"
    env = {**os.environ, "DEVICE": "cpu"}
    subprocess.run(["bash", str(BENCHES / "device_check.sh"), str(out)], check=True, env=env, timeout=600)
    report = json.loads(out.read_text())
    assert report["passed"] and report["device"] == "cpu" and report["tests"]["passed"] > 0
    assert report["to_device"]["epoch_1"]["mismatched_records"] == 0
    assert {row["stage"] for row in report["bench"]["figures"]} == {"dataset"}
    assert report["train"] and all(line["device"] == "cpu" for line in report["train"])


@pytest.mark.slow  # ~30 s on 2 busy cores: three interpreters import torch
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_device_check_fails_loudly_without_cuda(tmp_path):
    done = subprocess.run(
        ["bash", str(BENCHES / "device_check.sh"), str(tmp_path / "device.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DEVICE": "cuda"},
    )
    assert done.returncode == 1
    assert "FAILED: CUDA is not available" in done.stderr
    assert not (tmp_path / "device.json").exists()
