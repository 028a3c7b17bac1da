"""How long Strategy-Switch's switch takes, against what relaunching the job would cost.

Target: `switch_s` under 1 s with the default task (mnist5k, cnn, default workers, 3 epochs,
rule at α = 0.5: the switch after epoch 1). switch_s runs from a worker's last synchronous
step to its first asynchronous push (validation, rule, handover and that step's compute
between), the slowest worker's. The baseline is measured in the same run: the job's start-up,
from the call to train until every rank is ready to train (processes, torch, data, model,
rendezvous). Sync-Switch (Li et al., ICDCS 2021) switches by checkpointing and relaunching,
which costs at least that start-up (about 90 s on its clusters); the ratio says how many
in-process switches fit in one relaunch.

    python benchmarks/switch.py            # 3 runs
    python benchmarks/switch.py --quick    # smoke run: 1 run of 2 epochs, 5 steps each
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

TARGET_S = 1.0


def one_run(out: str, quick: bool) -> tuple[float, float]:
    """(switch_s, start-up seconds) of one switch run."""
    import polyrhythm
    from polyrhythm.config import make_config

    fields = {"strategy": "switch", "out": out, "instrumentation": False}
    if quick:
        fields |= {"epochs": 2, "steps_per_epoch": 5}
    began = time.time()
    summary = polyrhythm.train(make_config(fields))
    if summary["switch_s"] is None:
        sys.exit("the run did not switch")
    return summary["switch_s"], summary["training_window"][0] - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 short run")
    args = parser.parse_args(argv)
    runs = 1 if args.quick else max(1, args.runs)
    with tempfile.TemporaryDirectory() as out:
        results = [one_run(out, args.quick) for _ in range(runs)]
    switch_s = statistics.median(s for s, _ in results)
    startup_s = statistics.median(s for _, s in results)
    verdict = "PASS" if switch_s < TARGET_S else "MISS"
    print(f"switch_s (default task, median of {runs}): {switch_s:.3f} s "
          f"(target < {TARGET_S:.1f} s) {verdict}; job start-up {startup_s:.2f} s, "
          f"{startup_s / switch_s:.0f}x the switch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
