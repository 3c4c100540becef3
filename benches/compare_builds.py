"""Store.gather of one store by two builds of fastload, round by round: is a change free for
the records it does not touch? (#47: raw stores no slower than before compressed records.)

    python benches/compare_builds.py STORE OLD_PYTHON_DIR NEW_PYTHON_DIR [--rounds 7] [--batch 64]

Each round runs one timed process per build, in alternating order, each gathering every
record of STORE in shuffled batches of `--batch` into a reused buffer after one warm-up epoch
(the store stays in the page cache). It prints each round's images/s and the per-round ratio
new/old, then their median: the figure benches/RESULTS.md records.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

EPOCHS = 3

TRIAL = """
import json, sys, time
import numpy as np
import fastload
store = fastload.Store(sys.argv[1])
batch = int(sys.argv[2])
order = np.random.default_rng(0).permutation(len(store))
out = np.empty((batch, *store.shape), np.uint8)
labels = np.empty(batch, store.label_dtype)
def epoch():
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        store.gather(idx, out=out[:len(idx)], labels_out=labels[:len(idx)])
epoch()
t0 = time.perf_counter()
for _ in range(int(sys.argv[3])):
    epoch()
print(json.dumps({"images_per_s": int(sys.argv[3]) * len(store) / (time.perf_counter() - t0),
                  "module": fastload.__file__}))
"""


def trial(python_dir: str, store: str, batch: int) -> float:
    env = {**os.environ, "PYTHONPATH": python_dir}
    done = subprocess.run(
        [sys.executable, "-c", TRIAL, store, str(batch), str(EPOCHS)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["module"].startswith(os.path.abspath(python_dir)), result["module"]
    return result["images_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    ratios = []
    for round_ in range(args.rounds):
        builds = [("old", args.old), ("new", args.new)]
        if round_ % 2:
            builds.reverse()
        rates = {name: trial(path, args.store, args.batch) for name, path in builds}
        ratios.append(rates["new"] / rates["old"])
        print(
            f"round {round_ + 1}: old {rates['old']:,.0f} img/s, new {rates['new']:,.0f} img/s, new/old {ratios[-1]:.3f}"
        )
    print(f"median new/old {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
