"""benches/device_check.sh, the GPU machine's check, and benches/device_check_summary.py: the
script runs with `python3` alone and writes each step as it ends, every test it runs on CUDA
(benches/cuda_tests.txt) is collected, the summary names failed tests and steps cut short, and
a dry run on the CPU writes every figure."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHES = Path(__file__).resolve().parents[2] / "benches"


def _python3_only_env(tmp_path):
    """A virtual environment made here whose only interpreter is `python3`, as on a stock GPU
    machine, that sees this interpreter's packages (fastload, torch, pytest) through a .pth:
    whatever the script installs goes into it and nowhere else."""
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    (env_dir / "bin" / "python").unlink()
    site_packages = subprocess.run(
        [str(env_dir / "bin" / "python3"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    outer = [p for p in sys.path if p.endswith("site-packages")]
    (Path(site_packages) / "outer.pth").write_text(f"import site; list(map(site.addsitedir, {outer!r}))\n")
    return env_dir


def _device_check(out, env, tmp_path, timeout):
    """benches/device_check.sh in an environment built from nothing (#35: one inherited
    FASTLOAD_WHEEL had it pip-install into the machine's own Python)."""
    env_dir = _python3_only_env(tmp_path)
    scratch = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    return subprocess.run(
        ["bash", str(BENCHES / "device_check.sh"), str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=scratch | env,
    )


def test_device_check_runs_with_python3_alone_and_writes_each_step_as_it_ends(tmp_path):
    # #25: on the GPU machine there was no `python`, only `python3`.
    out = tmp_path / "out"
    env = {"DEVICE": "cpu", "STEPS": "setup,to_device", "BUDGET": "200"}
    done = _device_check(out, env, tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.glob("*.log")) == ["01-setup.log", "02-to_device.log"]
    machine = json.loads((out / "machine.json").read_text())
    assert machine["python"] == ".".join(map(str, sys.version_info[:3]))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] and [s["step"] for s in summary["steps"]] == ["setup", "to_device"]
    assert summary["to_device"]["epoch_1"]["mismatched_records"] == 0


def test_every_test_the_device_check_runs_on_cuda_is_collected():
    """#42: the GPU check named a test that had moved to another file, and pytest's "not
    found" failed the CUDA step on the only GPU run. Every line of benches/cuda_tests.txt must
    collect, each named test at least once, with no collection error."""
    lines = (BENCHES / "cuda_tests.txt").read_text().splitlines()
    named = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert named, "benches/cuda_tests.txt names no test"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *named],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCHES.parent,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = [line.split("[")[0] for line in done.stdout.splitlines() if "::" in line]
    for test in named:
        assert any(c == test or c.startswith(test + "::") for c in collected), f"{test} collects nothing"


def test_device_check_summary_names_failed_tests_and_steps_cut_short(tmp_path):
    # A pytest killed by the budget writes no junit XML: its -v log still names each outcome.
    (tmp_path / "steps.tsv").write_text(
        "step\tstatus\texit\tseconds\nsetup\tpassed\t0\t8\nsuite\ttimed out after 90 s\t124\t90\n"
        "augment\tskipped: budget\t\t0\n"
    )
    (tmp_path / "02-suite.log").write_text(
        "tests/test_a.py::test_one PASSED [ 10%]\n"
        "tests/test_a.py::test_two[pack {images} {store}] FAILED [ 20%]\n"
        "[gw1] [ 30%] ERROR tests/test_b.py::test_three \n"
        "[gw0] [ 40%] SKIPPED tests/test_b.py::test_cuda_four \n"
        "tests/test_c.py::test_five[train {missing}] "
    )
    done = subprocess.run(
        [sys.executable, str(BENCHES / "device_check_summary.py"), str(tmp_path), "cuda"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    failed = (tmp_path / "failed-tests.txt").read_text().splitlines()
    assert failed == [
        "suite: tests/test_a.py::test_two[pack {images} {store}]",
        "suite: tests/test_b.py::test_three",
    ]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tests"]["suite"]["unfinished"] == ["tests/test_c.py::test_five[train {missing}]"]
    problems = summary["problems"]
    assert any("step suite: timed out after 90 s" in p for p in problems)
    assert any("step augment: skipped: budget" in p for p in problems)
    assert any("skipped for want of CUDA" in p and "test_cuda_four" in p for p in problems)


@pytest.mark.slow  # ~8 minutes on 2 busy cores
def test_device_check_dry_run_on_cpu_writes_every_figure(tmp_path):
    out = tmp_path / "out"
    env = {"DEVICE": "cpu", "STEPS": ",".join(DRY_RUN_STEPS)}  # the dry run's own budget, 900 s
    done = _device_check(out, env, tmp_path, timeout=960)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "summary.json").read_text())
    assert report["passed"] and report["device"] == "cpu" and report["tests"]["cuda_tests"]["passed"] > 0
    assert [s["step"] for s in report["steps"]] == list(DRY_RUN_STEPS)
    assert report["to_device"]["epoch_1"]["mismatched_records"] == 0
    # torchvision is there only where it is installed (.ci/run's torchvision step does not run this).
    decode = report["decode"]
    assert "skipped" in decode or decode["pixels_against_host_decode"]["max_abs"] == 0, decode
    assert {row["method"].split(",")[0] for row in report["bench"]["figures"]} >= {"memcpy", "Store.gather"}
    assert report["train"] and all(line["device"] == "cpu" for line in report["train"])
    for name in ("fit_many_cuda", "fill_gpu", "fill_gpu_bf16"):
        assert report[name] and not any(line.endswith("failed") for line in report[name]), name


DRY_RUN_STEPS = (
    "setup",
    "cuda_tests",
    "fit_many_cuda",
    "bench",
    "to_device",
    "decode",
    "train_bf16",
    "fill_gpu",
    "fill_gpu_bf16",
    "augment",
    "suite",
)


@pytest.mark.slow  # ~30 s on 2 busy cores: three interpreters import torch
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_device_check_fails_loudly_without_cuda(tmp_path):
    done = _device_check(tmp_path / "out", {"DEVICE": "cuda"}, tmp_path, timeout=120)
    assert done.returncode == 1
    assert "FAILED: setup" in done.stderr and "CUDA is not available" in done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert not summary["passed"] and summary["steps"] == [
        {"step": "setup", "status": "failed", "exit": "1", "seconds": summary["steps"][0]["seconds"]}
    ]
