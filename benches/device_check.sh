#!/usr/bin/env bash
# The checks that need a GPU, most important first, under one overall time limit, each step's
# output written to its own file the moment the step ends (a hang leaves the earlier results).
#
#   benches/device_check.sh [OUTDIR]             # on a machine with CUDA; fails without it
#   DEVICE=cpu benches/device_check.sh [OUTDIR]  # the same steps on the CPU, small: checks the script
#
# Environment:
#   PYTHON       the interpreter (default python3; a stock GPU machine may have no `python`)
#   BUDGET       seconds for the whole run (default 540: a device command may run 600 s; 900
#                for the dry run); each step gets min(its own limit (twice it in the dry
#                run), what is left), a step with under 20 s left is
#                skipped (named in the summary), and the suite gets whatever remains
#   STEPS        comma-separated steps to run (default: all, in the order below)
#   FILL_GPU_GB  GB of 384x384x3 records in the fill_gpu store (default 8 on CUDA, 0.02 on the CPU)
#   FASTLOAD_WHEEL  install this wheel first (else the checkout's python/ when its extension is
#                built, else `pip install -e ".[test]"`)
#   TORCHVISION_DIR  a folder holding torchvision (`pip install --no-deps --target DIR
#                torchvision==0.29.2`, made where there is a network and carried along), added
#                to PYTHONPATH: the decode step and the CUDA decode test need its decode_jpeg
#
# Steps, with their own limits (seconds) and what they cost on an H200 (estimated: none has
# run there yet):
#   setup          20  fastload importable, CUDA present (exits 1 without it), machine.json
#   cuda_tests    150  the tests whose outcome depends on CUDA (benches/cuda_tests.txt), -v,
#                      failures by name
#   fit_many_cuda 120  #25's crashed command: bench_fit_many.py --counts 4 --records 4096
#                      --side 96 --epochs 2 --batch-size 256, all four modes (10 processes)
#   bench         180  fastload bench --only memcpy,gather,dataset,h2d,to_device --size-gb 2:
#                      the copy limit against the loader, the link, and the verdict
#   to_device      60  batches byte-exact on the device through FastLoadDataset + to_device
#   decode         90  #47: images/s of DeviceLoader(decode="device") and DeviceStore(decode=
#                      "device") on a JPEG store (quality 90) against the raw DeviceLoader, the
#                      raw DeviceStore and the host decode, on the same records (2048 of
#                      384x384x3, photo-like), 3 epochs each after a warm-up one; nvjpeg's pixels
#                      against the host decode's (max and mean abs difference: for
#                      tests/test_device_decode.py's CUDA_TOLERANCE). Fails on CUDA without
#                      torchvision; the dry run notes its absence and passes
#   train_bf16     90  fastload train --amp bf16 on that small store
#   fill_gpu      300  bench_fit_many.py on FILL_GPU_GB of 384x384x3 records, N = 1, 2, 4, 8,
#                      the four modes, 1 epoch, amp off (so --stack stacks): 27 processes,
#                      about 3 minutes (store 10 s, ~4 s start-up per process, < 5 s training)
#   fill_gpu_bf16 120  the same store, fit_many at N = 1 and 8 under bf16 autocast
#   augment        90  benches/bench_augment.py on the device
#   suite        rest  the whole suite (-m "not slow", -n 8 with pytest-xdist), -v: on the
#                      default budget little is left for it; run it alone as well:
#                      STEPS=suite benches/device_check.sh OUTDIR2. The dry run (DEVICE=cpu)
#                      runs the data path's test files only
# Default budget: the steps above but the suite take about 9 minutes on an H200 (estimated).
#
# OUTDIR (default ./device_check) gets, as each step ends: NN-STEP.log (its output), the
# figures it writes (bench.json, fit_many_cuda.json, to_device.json, decode.json, train.jsonl, fill_gpu.json,
# fill_gpu_bf16.json), junit-STEP.xml for the test steps, and, rewritten after every step,
# steps.tsv, failed-tests.txt and summary.json (every step's outcome, the failed tests by name,
# the verdict, the problems). Exit 1 if a step failed or was skipped for want of time, a test
# failed, or (on CUDA) a test was skipped for want of CUDA.
set -uo pipefail

PYTHON="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
STEPS="${STEPS:-setup,cuda_tests,fit_many_cuda,bench,to_device,decode,train_bf16,fill_gpu,fill_gpu_bf16,augment,suite}"
if [[ "$DEVICE" == cuda ]]; then
    FIT_MANY_SIZE=(--counts 4 --records 4096 --side 96 --epochs 2 --batch-size 256) # #25's command
    BENCH_SIZE=(--size-gb 2)
    FILL_GPU_GB="${FILL_GPU_GB:-8}"
    FILL_COUNTS=1,2,4,8
    TRAIN_SIZE="--epochs 3 --max-steps 40" # a string: the train_bf16 function gets it exported
    SMALL_RECORDS=4096
    DECODE_RECORDS=2048
    DECODE_SIDE=384
    LIMIT_SCALE=1
    BUDGET="${BUDGET:-540}"
else # the dry run: the same steps, smaller, with twice each step's limit (every child process
    # imports torch, seconds each on 2 cores): about 6 minutes on an idle 2-core machine
    FIT_MANY_SIZE=(--counts 1 --records 128 --side 16 --epochs 1 --batch-size 64)
    BENCH_SIZE=(--quick)
    FILL_GPU_GB="${FILL_GPU_GB:-0.02}"
    FILL_COUNTS=1,2
    TRAIN_SIZE="--epochs 1 --max-steps 8"
    SMALL_RECORDS=1024
    DECODE_RECORDS=96
    DECODE_SIDE=64
    LIMIT_SCALE=2
    BUDGET="${BUDGET:-900}"
fi
OUTDIR="$(realpath -m "${1:-device_check}")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT" || exit 1
say() { echo "device_check: [$SECONDS s] $*" >&2; }
fail() { echo "device_check: FAILED: $*" >&2; exit 1; }

case "$DEVICE" in cuda | cpu) ;; *) fail "DEVICE must be cuda or cpu, not '$DEVICE'" ;; esac
[[ "$BUDGET" =~ ^[0-9]+$ ]] || fail "BUDGET must be a whole number of seconds, not '$BUDGET'"
command -v "$PYTHON" >/dev/null || fail "no interpreter '$PYTHON' (set PYTHON to the one that has torch)"
mkdir -p "$OUTDIR" || fail "cannot make $OUTDIR"
rm -f "$OUTDIR"/*.log "$OUTDIR"/junit-*.xml "$OUTDIR"/steps.tsv "$OUTDIR"/failed-tests.txt "$OUTDIR"/summary.json
printf 'step\tstatus\texit\tseconds\n' >"$OUTDIR/steps.tsv"
STEP_NUMBER=0

# run_step NAME LIMIT COMMAND...: runs COMMAND under min(LIMIT, budget left) seconds, its
# output in OUTDIR/NN-NAME.log, its outcome in steps.tsv; then the summary is rewritten.
run_step() {
    local name="$1" limit="$2" left rc status started
    shift 2
    [[ ",$STEPS," == *",$name,"* ]] || return 0
    STEP_NUMBER=$((STEP_NUMBER + 1))
    local log
    log="$OUTDIR/$(printf '%02d' "$STEP_NUMBER")-$name.log"
    left=$((BUDGET - SECONDS - 5)) # 5 s for the summary
    if [[ "$limit" == rest ]]; then limit=$left; else limit=$((limit * LIMIT_SCALE)); fi
    ((limit > left)) && limit=$left
    if ((limit < 20)); then
        say "$name: skipped, ${left} s of the ${BUDGET} s budget left"
        printf '%s\tskipped: budget\t\t0\n' "$name" >>"$OUTDIR/steps.tsv"
        echo "skipped: ${left} s of the ${BUDGET} s budget left" >"$log"
        summarize
        return 0
    fi
    say "$name (at most $limit s) -> $log"
    started=$SECONDS
    # bash -c: a step may be one of the functions below (exported), which timeout cannot run.
    timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" "$@" >"$log" 2>&1
    rc=$?
    case $rc in
        0) status=passed ;;
        124 | 137) status="timed out after $limit s" ;;
        *) status=failed ;;
    esac
    say "$name: $status (exit $rc, $((SECONDS - started)) s)"
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$((SECONDS - started))" >>"$OUTDIR/steps.tsv"
    summarize
    if [[ "$name" == setup && $rc != 0 ]]; then
        cat "$log" >&2
        fail "setup (see $log)"
    fi
}

summarize() { # its exit status says whether there are problems; a traceback, that it failed
    "$PYTHON" benches/device_check_summary.py "$OUTDIR" "$DEVICE" >/dev/null 2>"$OUTDIR/summary.err"
    [[ -s "$OUTDIR/summary.err" ]] && say "the summary could not be written: $(tail -1 "$OUTDIR/summary.err")"
    return 0
}

# Every step's interpreter sees the checkout when its extension is built.
if [[ -z "${FASTLOAD_WHEEL:-}" ]] && PYTHONPATH="$ROOT/python" "$PYTHON" -c "import fastload._core" 2>/dev/null; then
    export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
fi
if [[ -n "${TORCHVISION_DIR:-}" ]]; then
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$TORCHVISION_DIR"
fi
export PYTHON DEVICE OUTDIR WORK ROOT TRAIN_SIZE SMALL_RECORDS DECODE_RECORDS DECODE_SIDE

setup() {
    if [[ -n "${FASTLOAD_WHEEL:-}" ]]; then
        "$PYTHON" -m pip install --quiet --no-deps --force-reinstall "$FASTLOAD_WHEEL" || return 1
    elif ! "$PYTHON" -c "import fastload._core" 2>/dev/null; then
        "$PYTHON" -m pip install --quiet -e ".[test]" || return 1
    fi
    "$PYTHON" - "$DEVICE" "$OUTDIR/machine.json" <<'EOF'
import json, os, platform, shutil, subprocess, sys
import fastload, pytest, torch

device, out = sys.argv[1], sys.argv[2]
machine = {"platform": platform.platform(), "cores": os.cpu_count(), "python": platform.python_version(),
           "torch": torch.__version__, "cuda": torch.version.cuda, "fastload": fastload.__file__,
           "cuda_available": torch.cuda.is_available(), "gpu": None}
if torch.cuda.is_available():
    machine["gpu"] = torch.cuda.get_device_name(0)
if shutil.which("nvidia-smi"):
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True)
    machine["nvidia_smi"] = smi.stdout.strip()
json.dump(machine, open(out, "w"), indent=1)
print(json.dumps(machine))
if device == "cuda" and not torch.cuda.is_available():
    sys.exit(f"CUDA is not available to torch {torch.__version__}; DEVICE=cpu runs the same steps on the CPU")
EOF
}

small_store() {
    # SMALL_RECORDS records of 64x64x3, labels their brightness: for to_device and train_bf16.
    [[ -f "$WORK/train.fl" ]] || "$PYTHON" -c "
import sys, numpy as np
from fastload import StoreWriter
images = np.random.default_rng(0).integers(0, 256, (int(sys.argv[2]), 64, 64, 3), dtype=np.uint8)
with StoreWriter(sys.argv[1], (64, 64, 3), 'float64') as writer:
    writer.extend(images, images.mean(axis=(1, 2, 3)) / 255.0)
" "$WORK/train.fl" "$SMALL_RECORDS"
}

to_device_check() {
    small_store || return 1
    "$PYTHON" - "$WORK/train.fl" "$DEVICE" "$OUTDIR/to_device.json" <<'EOF'
import json, sys, time
import torch
from fastload import FastLoadDataset, Store, to_device

path, device, out = sys.argv[1:4]
store = Store(path)
images = torch.from_numpy(store.images.copy())
ds = FastLoadDataset(store, 256, order="random", return_indices=True)
figures = {"pinned_batches": ds.pin_memory}
for epoch in range(2):  # the first includes CUDA's start-up, the second is the steady state
    started, mismatched, records = time.perf_counter(), 0, 0
    for batch, _, indices in ds:
        on_device = to_device(batch, device, dtype=torch.float32)
        # Back to the bytes: x/255 in float32 rounds back to x exactly.
        restored = (on_device * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()
        mismatched += int((restored != images[indices]).flatten(1).any(1).sum())
        records += len(indices)
    if device == "cuda":
        torch.cuda.synchronize()
    figures[f"epoch_{epoch}"] = {"records": records, "seconds": round(time.perf_counter() - started, 3),
                                 "mismatched_records": mismatched}
json.dump(figures, open(out, "w"), indent=1)
print(json.dumps(figures))
assert all(figures[f"epoch_{e}"]["mismatched_records"] == 0 for e in range(2)), figures
assert all(figures[f"epoch_{e}"]["records"] == len(images) for e in range(2)), figures
assert ds.pin_memory == (device == "cuda"), "batches are not pinned with CUDA available"
EOF
}

decode_check() {
    "$PYTHON" - "$WORK" "$DEVICE" "$OUTDIR/decode.json" "$DECODE_RECORDS" "$DECODE_SIDE" <<'EOF'
import json, sys, time
import numpy as np
import torch
from fastload import DeviceLoader, DeviceStore, FastLoadDataset, Store, StoreWriter

work, device, out = sys.argv[1:4]
records, side = int(sys.argv[4]), int(sys.argv[5])
figures = {"records": records, "shape": [side, side, 3], "device": device, "batch_size": 256, "quality": 90}
try:
    import torchvision
except ImportError:
    figures["skipped"] = "torchvision is not installed (TORCHVISION_DIR): decode='device' needs it"
    json.dump(figures, open(out, "w"), indent=1)
    sys.exit(f"decode: {figures['skipped']}" if device == "cuda" else 0)
figures["torchvision"] = torchvision.__version__
raw, jpeg = f"{work}/decode_raw.fl", f"{work}/decode_jpeg.fl"
generator = torch.Generator().manual_seed(0)
with StoreWriter(raw, (side, side, 3), "int64") as r, \
        StoreWriter(jpeg, (side, side, 3), "int64", encoding="jpeg", quality=90) as j:
    for first in range(0, records, 256):  # photo-like: smooth regions, edges, sensor noise
        n = min(256, records - first)
        coarse = torch.rand((n, 3, side // 16, side // 16), generator=generator) * 255
        smooth = torch.nn.functional.interpolate(coarse, size=(side, side), mode="bilinear", align_corners=False)
        noisy = smooth + 4 * torch.randn(smooth.shape, generator=generator)
        images = noisy.clamp(0, 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
        labels = np.arange(first, first + n)
        r.extend(images, labels)
        j.extend(images, labels)
figures["file_bytes"] = {"raw": Store(raw).file_size, "jpeg": Store(jpeg).file_size}


def epochs(make, repeats=3):
    """images/s of the best of `repeats` epochs after a warm-up one (CUDA's and nvjpeg's start-up)."""
    loader, best = make(), 0.0
    for epoch in range(repeats + 1):
        started = time.perf_counter()
        count = sum(len(batch[0]) for batch in loader)
        if device == "cuda":
            torch.cuda.synchronize()
        if epoch:
            best = max(best, count / (time.perf_counter() - started))
    return round(best, 1)


def dataset(path, **options):
    return FastLoadDataset(path, 256, seed=0, **options)


rates = figures["images_per_s"] = {}
rates["DeviceLoader raw"] = epochs(lambda: DeviceLoader(dataset(raw), device))
rates["DeviceLoader jpeg decode=host"] = epochs(lambda: DeviceLoader(dataset(jpeg), device))
rates["DeviceLoader jpeg decode=device"] = epochs(lambda: DeviceLoader(dataset(jpeg), device, decode="device"))
held = DeviceStore(raw, device, progress=False)
rates["DeviceStore raw"] = epochs(lambda: held.loader(dataset(raw)))
del held
held = DeviceStore(jpeg, device, progress=False, decode="device")
figures["held_compressed_bytes"] = held.nbytes
rates["DeviceStore jpeg decode=device"] = epochs(lambda: held.loader(dataset(jpeg)))
print(json.dumps(rates))

# nvjpeg's pixels against the host decode's (fastload's Rust threads), on every record.
largest, total, differing, pixels, mismatched = 0, 0.0, 0, 0, 0
in_order = dict(order="sequential", shuffle=False, return_indices=True)
pairs = zip(DeviceLoader(dataset(jpeg, **in_order), device, decode="device"), DeviceLoader(dataset(jpeg, **in_order), device))
for (a, labels_a, indices_a), (b, labels_b, indices_b) in pairs:
    mismatched += int(not (torch.equal(labels_a, labels_b) and torch.equal(indices_a, indices_b)))
    d = ((a - b) * 255).round().abs()  # x/255 in float32 rounds back to x exactly
    largest, total = max(largest, int(d.max())), total + float(d.sum())
    differing, pixels = differing + int((d > 0).sum()), pixels + d.numel()
figures["pixels_against_host_decode"] = {
    "max_abs": largest,
    "mean_abs": round(total / pixels, 5),
    "share_differing": round(differing / pixels, 5),
    "batches_with_other_labels_or_indices": mismatched,
}
json.dump(figures, open(out, "w"), indent=1)
print(json.dumps(figures))
assert mismatched == 0, figures
EOF
}

train_bf16() {
    small_store || return 1
    rm -f "$OUTDIR/train.jsonl"
    "$PYTHON" -m fastload train "$WORK/train.fl" --device "$DEVICE" --amp bf16 $TRAIN_SIZE \
        --batch-size 256 --json --json-log "$OUTDIR/train.jsonl"
}

# pytest_step NAME ARGS...: pytest -v, every outcome by name in the log and junit-NAME.xml.
pytest_step() {
    local name="$1"
    shift
    "$PYTHON" -m pytest -v -rA -p no:cacheprovider --junitxml="$OUTDIR/junit-$name.xml" "$@"
}

suite_step() {
    local parallel=() files=()
    "$PYTHON" -c "import xdist" 2>/dev/null && parallel=(-n 8)
    # The dry run: the files of the data path only (store, dataset, device, resident), about a
    # minute on 2 cores; CI runs the whole suite on its own just before.
    [[ "$DEVICE" == cpu ]] && files=(tests/test_store.py tests/dataset/test_dataset.py tests/test_device.py tests/test_resident.py)
    pytest_step suite -m "not slow" "${parallel[@]}" "${files[@]}"
}

export -f setup small_store to_device_check decode_check train_bf16 pytest_step suite_step
say "$PYTHON, DEVICE=$DEVICE, budget $BUDGET s, steps $STEPS -> $OUTDIR"
run_step setup 20 setup
# The tests whose outcome depends on CUDA: benches/cuda_tests.txt lists them (a CI test checks
# that pytest collects every one).
mapfile -t CUDA_TESTS < <(grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' benches/cuda_tests.txt)
run_step cuda_tests 150 pytest_step cuda_tests "${CUDA_TESTS[@]}"
run_step fit_many_cuda 120 "$PYTHON" benches/bench_fit_many.py --device "$DEVICE" --repeats 1 \
    "${FIT_MANY_SIZE[@]}" --child-timeout 100 --json "$OUTDIR/fit_many_cuda.json"
run_step bench 180 "$PYTHON" -m fastload bench --only memcpy,gather,dataset,h2d,to_device "${BENCH_SIZE[@]}" \
    --repeats 3 --quiet --json "$OUTDIR/bench.json"
run_step to_device 60 to_device_check
run_step decode 90 decode_check
run_step train_bf16 90 train_bf16
run_step fill_gpu 300 "$PYTHON" benches/bench_fit_many.py --device "$DEVICE" --side 384 --size-gb "$FILL_GPU_GB" \
    --counts "$FILL_COUNTS" --epochs 1 --batch-size 256 --val-fraction 0.05 --repeats 1 --child-timeout 120 \
    --json "$OUTDIR/fill_gpu.json"
run_step fill_gpu_bf16 120 "$PYTHON" benches/bench_fit_many.py --device "$DEVICE" --side 384 \
    --size-gb "$FILL_GPU_GB" --counts 1,8 --modes fit_many --amp bf16 --epochs 1 --batch-size 256 \
    --val-fraction 0.05 --repeats 1 --child-timeout 100 --json "$OUTDIR/fill_gpu_bf16.json"
# Batch 64, 384 -> 224 crop + flip + jitter; torchvision and kornia rows only where installed.
run_step augment 90 "$PYTHON" benches/bench_augment.py --device "$DEVICE" --batches 16 --repeats 3
run_step suite rest suite_step

"$PYTHON" benches/device_check_summary.py "$OUTDIR" "$DEVICE"
