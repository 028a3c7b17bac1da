"""How fast the commands that only read answer: `polyrhythm runs` on a store of 50 runs.

Target: under 1.5 s here. The commands that read (runs, report, strategies, datasets, models)
import neither torch nor the runtime, so their cost is the interpreter, the CLI's
declarations and the store. Each repeat runs the command and, alternately, a bare
interpreter that only imports sqlite3 (the floor any Python command pays); the result is the
median wall time of each and their ratio.

    python benchmarks/face.py           # 15 repeats
    python benchmarks/face.py --quick   # smoke run: 3 repeats
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 1.5
RUNS = 50


def fill_store(out: Path) -> None:
    """A store of RUNS completed runs with two epochs each, as train writes them."""
    from polyrhythm.config import make_config
    from polyrhythm.metrics.records import STORE_NAME
    from polyrhythm.metrics.store import RunStore

    store = RunStore(out / STORE_NAME)
    config = make_config({"workers": 2, "out": str(out)})
    for i in range(RUNS):
        run_id = f"20260101-00{i:04d}-bsp-{i:06x}"
        store.add_run(run_id, f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}+00:00",
                      config.columns(), config.to_toml())
        epochs = [{"epoch": e, "train_loss": 1.0, "val_loss": 1.0, "val_accuracy": 0.9,
                   "samples_per_s": 100.0, "wall_s": 1.0} for e in range(2)]
        store.complete_run(run_id, {"final_val_accuracy": 0.9, "samples_per_s": 100.0,
                                    "wall_s": 2.0}, epochs)


def seconds(cmd: list[str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="repeats (default 15)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 repeats")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else max(1, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        fill_store(out)
        runs = [sys.executable, "-m", "polyrhythm.cli", "runs", "--out", str(out)]
        floor = [sys.executable, "-c", "import sqlite3"]
        timed, bare = [], []
        for _ in range(repeats):
            timed.append(seconds(runs))
            bare.append(seconds(floor))
    median, base = statistics.median(timed), statistics.median(bare)
    verdict = "PASS" if median < TARGET_S else "MISS"
    print(f"polyrhythm runs, {RUNS} runs: {median:.2f} s (target < {TARGET_S:.1f} s) "
          f"{verdict}; bare interpreter {base:.2f} s, ratio {median / base:.1f}; "
          f"range {min(timed):.2f}-{max(timed):.2f} s over {repeats} repeats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
