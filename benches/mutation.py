"""Mutation testing of the core: do the tests catch a planted one-line bug?

`mutmut` (PyPI, 3.x) mutates the Python modules, one module at a time, each against its own
focused test files (MODULES below): mutmut runs, for every mutant, the tests among those that
call the mutated function. `cargo-mutants` (crates.io) mutates the Rust files, one file at a
time, against the Rust unit tests that reach them (`cargo test --lib`, RUST_TESTS below, per file; the
Python tests, which reach the Rust code through the extension, are not run there: that would
take a rebuild of the extension per mutant). Prints each module's kill rate and writes them, with every surviving mutant, to
WORK/summary.json. Hours of CPU for the whole list, hence not in the per-commit CI: run it
before a release, or on the modules a change touched.

    pip install mutmut; cargo install cargo-mutants --locked
    nice -n 15 python benches/mutation.py                      # every module below
    nice -n 15 python benches/mutation.py dataset/plan.py rust/gather.rs --jobs 2

mutmut reads `[tool.mutmut]` in pyproject.toml; it names modules from a `src/` layout, so each
module runs in a copy of the repository under WORK where python/ is src/, with the extension
(`python/fastload/_core*.so`, build it first) copied along, and this script adds the module
(`only_mutate`) and its tests (`pytest_add_cli_args_test_selection`) to that copy's `[tool.mutmut]`. cargo-mutants
builds in its own copy of the tree (never in place), with CARGO_TARGET_DIR under WORK so the
dependencies are compiled once for all files and no other build directory is locked.
Rerunning keeps what is in WORK: mutmut only checks mutants without a result (delete
WORK/python/<module> to start over), cargo-mutants starts each file over."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each Python module (under python/fastload/) and the test files that check it.
MODULES = {
    "store.py": [
        "tests/test_store.py",
        "tests/test_writer.py",
        "tests/test_bad_input.py",
        "tests/dataset/test_dataset_store.py",
        "tests/dataset/test_prefetch.py",
    ],
    "dataset/plan.py": [
        "tests/dataset/test_plan.py",
        "tests/dataset/test_dataset.py",
        "tests/test_distributed.py",
    ],
    "dataset/dataset.py": [
        "tests/dataset/test_dataset.py",
        "tests/dataset/test_dataset_store.py",
        "tests/test_distributed.py",
        "tests/dataset/test_plan.py",
        "tests/test_bad_input.py",
        "tests/dataset/test_buffers.py",
        "tests/test_device.py",  # DeviceLoader iterates a FastLoadDataset
    ],
    "dataset/buffers.py": [
        "tests/dataset/test_buffers.py",
        "tests/dataset/test_prefetch.py",
        "tests/dataset/test_dataset.py",
    ],
    "dataset/prefetch.py": [
        "tests/dataset/test_prefetch.py",
        "tests/dataset/test_buffers.py",
        "tests/dataset/test_dataset.py",
    ],
    "device.py": ["tests/test_device.py", "tests/test_augment.py"],
    "augment.py": ["tests/test_augment.py"],
    "pack/walk.py": ["tests/pack/test_walk.py", "tests/pack/test_pipeline.py"],
    "pack/labels.py": ["tests/pack/test_labels.py"],
    # pack's own tests, and its argument checks among the hostile inputs
    "pack/pipeline.py": [
        "tests/pack/test_pipeline.py",
        "tests/pack/test_walk.py",
        "tests/pack/test_labels.py",
        "tests/test_bad_input.py",
    ],
    "train/checkpoint.py": [
        "tests/train/test_train.py",
        "tests/train/test_trainer.py",
        "tests/train/test_loop.py",
        "tests/train/test_checkpoint.py",
        "tests/train/test_config.py",  # check_checkpoint_path: a checkpoint path refused with the config
    ],
    "monotonic/constraints.py": [
        "tests/monotonic/test_constraints.py",
        "tests/monotonic/test_calibrators.py",
        "tests/monotonic/test_lattice.py",
    ],
    "monotonic/calibrators.py": [
        "tests/monotonic/test_calibrators.py",
        "tests/monotonic/test_constraints.py",
    ],
    "monotonic/linear.py": ["tests/monotonic/test_linear.py", "tests/monotonic/test_constraints.py"],
    "monotonic/lattice.py": ["tests/monotonic/test_lattice.py", "tests/monotonic/test_constraints.py"],
}
# Each Rust file and the Rust unit tests that reach it. The slow property tests (`format::`,
# `fuzz_tests::`: seconds per run) go only where they test the file; every test module builds its
# stores with the writer, so the writer's mutants are seen by all the quick ones.
ALL_RUST_TESTS = [
    "format::",
    "fuzz_tests::",
    "gather::",
    "prefetch::",
    "store::",
    "writer::",
    "output::",
    "direct_write::",
]
QUICK_WRITER_TESTS = ["writer::", "output::", "direct_write::", "store::", "gather::", "prefetch::"]
RUST_TESTS = {
    "rust/format.rs": ALL_RUST_TESTS,
    "rust/gather.rs": ALL_RUST_TESTS,
    "rust/prefetch.rs": ["prefetch::", "gather::", "store::"],
    "rust/writer.rs": QUICK_WRITER_TESTS,
    "rust/output.rs": QUICK_WRITER_TESTS,  # the output rule, moved out of writer.rs (#37)
    "rust/direct_write.rs": QUICK_WRITER_TESTS,
    "rust/store.rs": ALL_RUST_TESTS,
}
RUST_FILES = list(RUST_TESTS)

# mutmut's statuses that mean the tests noticed the mutant (a timeout or a crash is noticed too).
DETECTED = {"killed", "timeout", "segfault", "caught by type check"}
UNDETECTED = {"survived", "no tests", "suspicious"}


def stage(module: str, work: Path) -> Path:
    """A copy of the repository for one module's mutmut run, python/ as src/, its
    `[tool.mutmut]` told the module and the tests; kept if already there (mutmut resumes)."""
    where = work / "python" / module.replace("/", "_").removesuffix(".py")
    if (where / "pyproject.toml").exists():
        return where
    if not list((ROOT / "python" / "fastload").glob("_core*.so")):
        sys.exit("python/fastload/_core*.so is missing: build the extension first (maturin develop)")
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", ".pytest_cache")
    shutil.copytree(ROOT / "python", where / "src", ignore=ignore)
    shutil.copytree(ROOT / "tests", where / "tests", ignore=ignore)
    settings = (ROOT / "pyproject.toml").read_text()
    focus = (
        f'only_mutate = ["src/fastload/{module}"]\n'
        f"pytest_add_cli_args_test_selection = {json.dumps(MODULES[module])}\n"
    )
    if "[tool.mutmut]\n" not in settings:
        sys.exit("pyproject.toml has no [tool.mutmut] table")
    (where / "pyproject.toml").write_text(settings.replace("[tool.mutmut]\n", "[tool.mutmut]\n" + focus, 1))
    return where


def run_mutmut(module: str, work: Path, jobs: int) -> dict:
    where = stage(module, work)
    env = {**os.environ, "CI": "1"}  # Hypothesis draws the same examples in every run (tests/conftest.py)
    env.pop("PYTHONPATH", None)  # mutmut puts its mutated copy first on sys.path
    # mutmut forks each mutant's test process from its own, where torch's OpenMP pool has already
    # started: a forked child then hung in its first parallel op (augment.py's grid_sample), and
    # each hang counted as a timeout, so as detected. One thread: no pool to inherit.
    env["OMP_NUM_THREADS"] = "1"
    log = work / "python" / f"{where.name}.log"
    with open(log, "w") as out:
        subprocess.run(
            ["mutmut", "run", "--max-children", str(jobs)], cwd=where, env=env, stdout=out, stderr=out
        )
    listed = subprocess.run(
        ["mutmut", "results", "--all", "true"], cwd=where, env=env, capture_output=True, text=True, check=True
    ).stdout
    statuses = dict(re.findall(r"^\s+(\S+): (.+)$", listed, re.M))
    return summarize(f"python/fastload/{module}", statuses, log)


def run_cargo_mutants(path: str, work: Path, jobs: int) -> dict:
    output = work / "rust" / Path(path).stem
    output.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CARGO_TARGET_DIR": str(work / "rust" / "target")}
    log = output / "run.log"
    with open(log, "w") as out:
        subprocess.run(
            ["cargo", "mutants", "--file", path, "--output", str(output), "--jobs", str(jobs)]
            + ["--no-shuffle", "--", "--lib", "--", *RUST_TESTS[path]],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )
    statuses = {}
    for status, name in (("killed", "caught"), ("survived", "missed"), ("timeout", "timeout")):
        listing = output / "mutants.out" / f"{name}.txt"
        for line in listing.read_text().splitlines() if listing.exists() else []:
            statuses[line] = status
    return summarize(path, statuses, log)  # unviable mutants (they do not compile) are not counted


def summarize(module: str, statuses: dict, log: Path) -> dict:
    detected = sum(s in DETECTED for s in statuses.values())
    checked = detected + sum(s in UNDETECTED for s in statuses.values())
    survivors = sorted(name for name, s in statuses.items() if s in UNDETECTED)
    return {
        "module": module,
        "mutants": checked,
        "detected": detected,
        "kill_rate": detected / checked if checked else None,
        "not_checked": len(statuses) - checked,
        "survivors": {name: statuses[name] for name in survivors},
        "log": str(log),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("modules", nargs="*", help=f"default: all of {list(MODULES)} and {RUST_FILES}")
    parser.add_argument("--work", type=Path, default=Path("/tmp/fastload-mutation"))
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once")
    args = parser.parse_args(argv)
    # Started in the background by a shell, this process ignores Ctrl-C, and so would the test
    # processes it starts: the tests that interrupt a wait with SIGINT would hang there.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    chosen = args.modules or [*MODULES, *RUST_FILES]
    unknown = [m for m in chosen if m not in MODULES and m not in RUST_FILES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}: choose among {list(MODULES)} and {RUST_FILES}")
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for module in chosen:
        run = run_cargo_mutants if module in RUST_FILES else run_mutmut
        result = run(module, args.work.resolve(), args.jobs)
        results.append(result)
        rate = "-" if result["kill_rate"] is None else f"{100 * result['kill_rate']:.1f}%"
        print(f"{result['module']}: {result['detected']}/{result['mutants']} detected ({rate})", flush=True)
        for name, status in result["survivors"].items():
            print(f"    {status}: {name}", flush=True)
    (args.work / "summary.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
