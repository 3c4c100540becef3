"""The summary of a benches/device_check.sh run, from what its steps left in OUTDIR: every
step's outcome (steps.tsv), the tests by outcome (junit-STEP.xml, or the -v log of a step
that was killed before pytest wrote its XML), the bench's verdict, the decode figures and the
fit_many figures.

    python3 benches/device_check_summary.py OUTDIR DEVICE

Writes OUTDIR/failed-tests.txt (one failed test per line, with its message) and
OUTDIR/summary.json; prints a one-line JSON summary; exits 1 when there is a problem: a step
that failed, timed out or was skipped for want of time, a failed test, or (DEVICE cuda) a test
skipped for want of CUDA or a CUDA bench stage that did not run. Needs neither torch nor
fastload, so it runs after any step, however the step ended.
"""

from __future__ import annotations

import csv
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Optional

# A test's outcome in a `pytest -v` log: "tests/x.py::test_y FAILED" (or "... FAILED [ 5%]"),
# and "[gw0] [ 5%] FAILED tests/x.py::test_y" under pytest-xdist.
# Parameters in a name may hold spaces ("test_x[pack {images} {store}]").
VERBOSE_OUTCOME = re.compile(
    r"^(?:(\S+::.+?) (PASSED|FAILED|ERROR|SKIPPED)(?: +\[ *\d+%\])?"
    r"|\[gw\d+\] \[ *\d+%\] (PASSED|FAILED|ERROR|SKIPPED) (\S+::.+?))\s*$"
)
FIGURE_FILES = ("fit_many_cuda", "fill_gpu", "fill_gpu_bf16")


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def junit_tests(path: Path) -> Dict[str, list]:
    """name -> outcome lists ("passed", "failed", "skipped") of one junit XML file; failed and
    skipped entries carry their message."""
    tests: Dict[str, list] = {"passed": [], "failed": [], "skipped": []}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            tests["passed"].append(name)
            continue
        message = " ".join((outcome.get("message") or "").split())[:300]
        tests["skipped" if outcome.tag == "skipped" else "failed"].append(f"{name}: {message}")
    return tests


def log_tests(path: Path) -> Dict[str, list]:
    """The same from a `pytest -v` log (a killed pytest writes no XML; its log has every test
    that finished)."""
    tests: Dict[str, list] = {"passed": [], "failed": [], "skipped": [], "unfinished": []}
    for line in path.read_text(errors="replace").splitlines():
        match = VERBOSE_OUTCOME.match(line)
        if match:
            name = match.group(1) or match.group(4)
            outcome = (match.group(2) or match.group(3)).lower()
            tests["failed" if outcome == "error" else outcome].append(name)
        elif "::" in line and not line.startswith((" ", "[")) and line.endswith(" "):
            tests["unfinished"].append(line.strip())  # started; the run was stopped before its outcome
    return tests


def step_tests(outdir: Path, step: str) -> Optional[Dict[str, list]]:
    junit = outdir / f"junit-{step}.xml"
    if junit.exists():
        try:
            return junit_tests(junit)
        except ET.ParseError:
            pass
    logs = sorted(outdir.glob(f"[0-9][0-9]-{step}.log"))
    return log_tests(logs[0]) if logs else None


def fit_many_figures(results: Optional[dict]) -> Optional[List[str]]:
    """One line per mode and N of a bench_fit_many.py --json file."""
    if results is None:
        return None
    lines = []
    for row in results["rows"]:
        if "failed" in row:
            lines.append(f"N={row['n']} {row['mode']}: failed")
            continue
        busy = "n/a" if row["gpu_busy_percent"] is None else f"{row['gpu_busy_percent']:.0f}%"
        memory = row["gpu_memory_per_run"]
        memory = "n/a" if memory is None else f"{memory / 2**20:,.0f} MiB"
        lines.append(
            f"N={row['n']} {row['mode']}: {row['model_images_per_s']:,.0f} model-images/s, "
            f"GPU busy {busy}, GPU memory per run {memory}"
        )
    return lines


def summarize(outdir: Path, device: str) -> dict:
    problems = []
    with open(outdir / "steps.tsv", newline="") as f:
        steps = list(csv.DictReader(f, delimiter="\t"))
    for step in steps:
        if step["status"] != "passed":
            problems.append(f"step {step['step']}: {step['status']} (see its log in {outdir})")
    tests = {}
    for step in ("cuda_tests", "suite"):
        found = step_tests(outdir, step)
        if found is None:
            continue
        tests[step] = {"passed": len(found["passed"]), "failed": found["failed"], "skipped": found["skipped"]}
        if found.get("unfinished"):
            tests[step]["unfinished"] = found["unfinished"]
        if found["failed"]:
            problems.append(f"{step}: {len(found['failed'])} test(s) failed: {found['failed'][:5]}")
        cuda_skips = [t for t in found["skipped"] if re.search("cuda", t, re.I)]
        if device == "cuda" and cuda_skips:
            problems.append(f"{step}: tests skipped for want of CUDA: {cuda_skips}")
    failed = [f"{step}: {name}" for step, found in tests.items() for name in found["failed"]]
    (outdir / "failed-tests.txt").write_text("".join(line + "\n" for line in failed))
    bench = read_json(outdir / "bench.json")
    if bench is not None and device == "cuda":
        for name in ("h2d", "to_device"):
            if bench["stages"].get(name, {}).get("status") != "ok":
                problems.append(f"bench stage {name} did not run: {bench['stages'].get(name)}")
    train = None
    if (outdir / "train.jsonl").exists():
        train = [json.loads(line) for line in (outdir / "train.jsonl").read_text().splitlines() if line]
    summary = {
        "device": device,
        "passed": not problems,
        "problems": problems,
        "machine": read_json(outdir / "machine.json"),
        "steps": steps,
        "tests": tests,
        "bench": None
        if bench is None
        else {
            "verdict": bench.get("verdict"),
            "limit_problem": bench.get("limit_problem"),
            "figures": [
                {k: row[k] for k in ("method", "images_per_s", "gb_per_s", "spread_pct")}
                for row in bench["rows"]
            ],
        },
        "to_device": read_json(outdir / "to_device.json"),
        "decode": read_json(outdir / "decode.json"),
        "train": train,
        **{name: fit_many_figures(read_json(outdir / f"{name}.json")) for name in FIGURE_FILES},
    }
    (outdir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> int:
    outdir, device = Path(sys.argv[1]), sys.argv[2]
    summary = summarize(outdir, device)
    short = {k: summary[k] for k in ("passed", "problems")}
    short["tests"] = {
        step: {"passed": t["passed"], "failed": len(t["failed"])} for step, t in summary["tests"].items()
    }
    print(json.dumps(short))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
