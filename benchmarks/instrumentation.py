"""What polyrhythm's always-on instrumentation costs: throughput with it on vs off.

The same job (default `bsp`, 2 workers, 1 server, mnist5k, cnn) runs with instrumentation on
(every iteration's spans, per-push server events, a ~1 Hz resource sampler per rank, all
stored) and off (span totals only). Target: on/off >= 0.99.

Method: the two jobs run at the same time, each pinned to a core of its own (every process of
a job, its sampler threads included, shares that one core, so whatever instrumentation costs
is paid in that job's throughput). Running them together makes both see the same drift in the
machine's speed, which on a shared 2-core VM moves throughput by 10-25 % over seconds and
swamped the effect when on and off ran one after the other (repeats ranged 0.63-1.23). The
cores swap between repeats, so a difference between the cores cancels. A run's throughput is
its summary's samples/s (warm-up steps left out); the result is the median over repeats of
the paired ratios on/off. With a single usable core the two runs alternate instead.

    python benchmarks/instrumentation.py          # about 2 minutes on 2 cores
    python benchmarks/instrumentation.py --quick  # smoke run: a few steps, one repeat
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile

TARGET = 0.99


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="bsp", help="strategy (default bsp)")
    parser.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs per run (default 6)")
    parser.add_argument("--repeats", type=int, default=6, help="paired repeats (default 6)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 8 steps, 1 repeat")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.epochs < 1 or args.workers < 1:
        parser.error("--repeats, --epochs and --workers must be at least 1")
    return args


def run_pinned(job: dict, core: int | None, out: str, results) -> None:
    """One job in its own process, every rank it starts confined to `core` (inherited)."""
    import polyrhythm  # spawned: import here, after the affinity is set for the ranks

    if core is not None:
        os.sched_setaffinity(0, {core})
    summary = polyrhythm.train(**job, threads=1, out=out)  # one core: one torch thread
    results.put((job["instrumentation"], summary["samples_per_s"]))


def paired_rates(args: argparse.Namespace, cores: list[int], out: str, repeat: int,
                 ) -> dict[bool, float]:
    """samples/s with instrumentation on and off, run side by side (or in turn on one core)."""
    extra = {"steps_per_epoch": 8, "warmup_steps": 2} if args.quick else {}
    job = {"strategy": args.strategy, "workers": args.workers, "epochs": args.epochs, **extra}
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    sides = (True, False) if repeat % 2 == 0 else (False, True)  # swap cores / order
    procs = [ctx.Process(target=run_pinned, args=({**job, "instrumentation": on},
                                                  cores[i] if len(cores) > 1 else cores[0],
                                                  out, results))
             for i, on in enumerate(sides)]
    rates: dict[bool, float] = {}
    if len(cores) > 1:
        for proc in procs:
            proc.start()
    for proc in procs:
        if len(cores) == 1:
            proc.start()
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"a benchmark run failed (exit code {proc.exitcode})")
    while len(rates) < 2:
        on, rate = results.get(timeout=60)
        rates[on] = rate
    return rates


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    cores = sorted(os.sched_getaffinity(0))[:2]
    how = "side by side, one core each" if len(cores) > 1 else "in turn on one core"
    print(f"{args.strategy}, {args.workers} workers, {args.epochs} epochs per run, {how}",
          flush=True)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="polyrhythm-instrumentation-") as out:
        for repeat in range(repeats):
            rate = paired_rates(args, cores, out, repeat)
            ratios.append(rate[True] / rate[False])
            print(f"repeat {repeat + 1}: on {rate[True]:.0f} samples/s, off "
                  f"{rate[False]:.0f} samples/s, ratio {ratios[-1]:.3f}", flush=True)
    ratio = statistics.median(ratios)
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"instrumentation on/off ({args.strategy}, {args.workers} workers): {ratio:.3f} "
          f"(target >= {TARGET:.2f}) {verdict}  [repeats: {min(ratios):.3f}-{max(ratios):.3f}]")
    if args.quick:
        print("--quick is a smoke run: too short for the ratio to mean much")
    return 0


if __name__ == "__main__":
    sys.exit(main())
