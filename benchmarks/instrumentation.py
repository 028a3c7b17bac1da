"""What polyrhythm's always-on instrumentation costs: throughput with it on vs off.

The same job (default `bsp`, 2 workers, 1 server, mnist5k, cnn) runs with instrumentation on
(every iteration's spans, per-push server events, a ~1 Hz resource sampler per rank, all
stored) and off (span totals only), side by side: runs alternate, and which side goes first
alternates between repeats, so drift in machine load hits both alike. A run's throughput is
its summary's samples/s (warm-up steps left out); the result is the median over repeats of the
paired ratios on/off. Target: >= 0.97.

    python benchmarks/instrumentation.py          # about 1-2 minutes on 2 cores
    python benchmarks/instrumentation.py --quick  # smoke run: a few steps, one repeat
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

import polyrhythm

TARGET = 0.97


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="bsp", help="strategy (default bsp)")
    parser.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="paired repeats (default 5)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 steps, 1 repeat")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.epochs < 1 or args.workers < 1:
        parser.error("--repeats, --epochs and --workers must be at least 1")
    return args


def throughput(args: argparse.Namespace, out: str, instrumentation: bool) -> float:
    extra = {"steps_per_epoch": 8, "warmup_steps": 2} if args.quick else {}
    summary = polyrhythm.train(strategy=args.strategy, workers=args.workers, epochs=args.epochs,
                               instrumentation=instrumentation, out=out, **extra)
    return summary["samples_per_s"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    ratios = []
    with tempfile.TemporaryDirectory(prefix="polyrhythm-instrumentation-") as out:
        for repeat in range(repeats):
            order = (True, False) if repeat % 2 == 0 else (False, True)
            rate = {on: throughput(args, out, on) for on in order}
            ratios.append(rate[True] / rate[False])
            print(f"repeat {repeat + 1}: on {rate[True]:.0f} samples/s, off "
                  f"{rate[False]:.0f} samples/s, ratio {ratios[-1]:.3f}", flush=True)
    ratio = statistics.median(ratios)
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"instrumentation on/off ({args.strategy}, {args.workers} workers): {ratio:.3f} "
          f"(target >= {TARGET:.2f}) {verdict}")
    if args.quick:
        print("--quick is a smoke run: too short for the ratio to mean much")
    return 0


if __name__ == "__main__":
    sys.exit(main())
