#!/usr/bin/env bash
# The checks that need a GPU, in one run of under 5 minutes, every figure in one JSON file.
#
#   benches/device_check.sh [OUT.json]             # on a machine with CUDA; fails without it
#   DEVICE=cpu benches/device_check.sh [OUT.json]  # the same steps on the CPU: checks the script
#
# Steps: make fastload importable (FASTLOAD_WHEEL=path.whl installs that wheel; else the
# checkout's python/ folder when its extension is built; else `pip install -e ".[test]"`),
# refuse to go on without CUDA, run the tests whose outcome depends on CUDA, run
# `fastload bench --only h2d,to_device,dataset` and the augmentation bench, check on a small
# synthetic store that batches reach the device byte-exact through FastLoadDataset + to_device
# (and time it), and run a short `fastload train --device cuda --amp bf16`. Exit 1, naming the
# step, if any step fails or a CUDA step was skipped.
set -euo pipefail

DEVICE="${DEVICE:-cuda}"
OUT="$(realpath -m "${1:-device_check.json}")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT"
fail() { echo "device_check: FAILED: $*" >&2; exit 1; }
step() { echo "device_check: [$SECONDS s] $*" >&2; }

case "$DEVICE" in cuda | cpu) ;; *) fail "DEVICE must be cuda or cpu, not '$DEVICE'" ;; esac

step "making fastload importable"
if [[ -n "${FASTLOAD_WHEEL:-}" ]]; then
    python -m pip install --quiet --no-deps --force-reinstall "$FASTLOAD_WHEEL" || fail "pip install $FASTLOAD_WHEEL"
elif PYTHONPATH="$ROOT/python" python -c "import fastload._core" 2>/dev/null; then
    export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
else
    python -m pip install --quiet -e ".[test]" || fail "pip install -e .[test] (needs Rust and maturin, or set FASTLOAD_WHEEL)"
fi
python -c "import fastload, pytest" || fail "fastload or pytest is not importable"
TORCH="$(python -c 'import torch; print(torch.__version__, int(torch.cuda.is_available()))')"
if [[ "$DEVICE" == cuda && "$TORCH" != *" 1" ]]; then
    fail "CUDA is not available to torch ${TORCH% *}; DEVICE=cpu runs the same steps on the CPU"
fi

step "tests whose outcome depends on CUDA"
# The tests marked "needs CUDA" (bf16 training, augmentation on CUDA against the CPU), the bench
# tests (h2d and to_device stages run with CUDA), and the pinned-memory and to_device tests of
# the dataset.
set +e
timeout 120 python -m pytest -q -rs -p no:cacheprovider --junitxml="$WORK/junit.xml" \
    tests/test_train.py::test_cuda_with_bf16_reports_gpu_memory tests/test_augment.py::test_cuda_matches_cpu \
    tests/test_bench.py \
    tests/test_dataset.py -k "cuda or pin or to_device or bench or json or noisy or stage or quick" \
    >"$WORK/pytest.txt" 2>&1
TESTS_RC=$?
set -e
tail -5 "$WORK/pytest.txt" >&2

step "fastload bench --only h2d,to_device,dataset"
timeout 100 python -m fastload bench --only h2d,to_device,dataset --size-gb 1 --repeats 3 --quiet \
    --json "$WORK/bench.json" || fail "fastload bench"

step "augmentation on $DEVICE: benches/bench_augment.py"
# Batch 64, 384 -> 224 crop + flip + jitter; torchvision and kornia rows only where installed.
timeout 90 python benches/bench_augment.py --device "$DEVICE" --batches 16 --repeats 3 >"$WORK/augment.txt" \
    || fail "benches/bench_augment.py --device $DEVICE"
cat "$WORK/augment.txt" >&2

step "batches on the device through FastLoadDataset + to_device, and a small store to train on"
timeout 60 python - "$WORK" "$DEVICE" <<'EOF' || fail "the FastLoadDataset -> $DEVICE check"
import json, sys, time
import numpy as np, torch
from fastload import FastLoadDataset, Store, StoreWriter, to_device

work, device = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (4096, 64, 64, 3), dtype=np.uint8)
labels = images.mean(axis=(1, 2, 3)) / 255.0  # learnable: the brightness
with StoreWriter(f"{work}/train.fl", (64, 64, 3), "float64") as writer:
    writer.extend(images, labels)
store = Store(f"{work}/train.fl")
ds = FastLoadDataset(store, 256, order="random", return_indices=True)
figures = {"pinned_batches": ds.pin_memory}
for epoch in range(2):  # the first includes CUDA's start-up, the second is the steady state
    started, mismatched, records = time.perf_counter(), 0, 0
    for batch, _, indices in ds:
        on_device = to_device(batch, device, dtype=torch.float32)
        # Back to the bytes: x/255 in float32 rounds back to x exactly.
        restored = (on_device * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()
        mismatched += int((restored != torch.from_numpy(images[indices.numpy()])).flatten(1).any(1).sum())
        records += len(indices)
    if device == "cuda":
        torch.cuda.synchronize()
    figures[f"epoch_{epoch}"] = {"records": records, "seconds": round(time.perf_counter() - started, 3),
                                 "mismatched_records": mismatched}
assert all(figures[f"epoch_{e}"]["mismatched_records"] == 0 for e in range(2)), figures
assert all(figures[f"epoch_{e}"]["records"] == len(images) for e in range(2)), figures
assert ds.pin_memory == (device == "cuda"), "batches are not pinned with CUDA available"
json.dump(figures, open(f"{work}/to_device.json", "w"))
EOF

step "fastload train --device $DEVICE --amp bf16"
timeout 90 python -m fastload train "$WORK/train.fl" --device "$DEVICE" --amp bf16 --epochs 3 --max-steps 40 \
    --batch-size 256 --json --json-log "$WORK/train.jsonl" >/dev/null || fail "fastload train"

step "writing $OUT"
python - "$WORK" "$DEVICE" "$OUT" "$TESTS_RC" "$SECONDS" <<'EOF'
import json, platform, re, subprocess, sys
import xml.etree.ElementTree as ET
import torch

work, device, out, tests_rc, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
problems = []
suite = ET.parse(f"{work}/junit.xml").getroot().iter("testcase")
tests = {"passed": [], "failed": [], "skipped": []}
for case in suite:
    name = f"{case.get('classname')}::{case.get('name')}"
    outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
    kind = "passed" if outcome is None else "skipped" if outcome.tag == "skipped" else "failed"
    tests[kind].append(name if outcome is None else f"{name}: {(outcome.get('message') or '')[:200]}")
if tests_rc != 0 or tests["failed"]:
    problems.append(f"tests failed (pytest exit {tests_rc}): {tests['failed'][:5]}")
bench = json.load(open(f"{work}/bench.json"))
stages = {name: s["status"] for name, s in bench["stages"].items()}
figures = [{k: row[k] for k in ("stage", "method", "images_per_s", "gb_per_s", "spread_pct") if k in row}
           for row in bench["rows"]]
if device == "cuda":
    cuda_skips = [t for t in tests["skipped"] if re.search("cuda", t, re.I)]
    if cuda_skips:
        problems.append(f"tests skipped for want of CUDA: {cuda_skips}")
    for name in ("h2d", "to_device"):
        if stages.get(name) != "ok":
            problems.append(f"bench stage {name} did not run: {bench['stages'].get(name)}")
epochs = [json.loads(line) for line in open(f"{work}/train.jsonl")]
gpu = None
if torch.cuda.is_available():
    gpu = torch.cuda.get_device_name(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True)
    gpu += f" ({smi.stdout.strip()})" if smi.returncode == 0 else ""
report = {
    "device": device,
    "passed": not problems,
    "problems": problems,
    "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                "cuda": torch.version.cuda, "gpu": gpu},
    "tests": {k: (len(v) if k == "passed" else v) for k, v in tests.items()},
    "bench": {"stages": stages, "figures": figures, "verdict": bench.get("verdict")},
    "to_device": json.load(open(f"{work}/to_device.json")),
    "train": epochs,
    "augment": open(f"{work}/augment.txt").read().splitlines(),
    "seconds": seconds,
}
with open(out, "w") as f:
    json.dump(report, f, indent=1)
print(json.dumps({"passed": report["passed"], "problems": problems, "tests": report["tests"], "seconds": seconds}))
sys.exit(0 if not problems else 1)
EOF
