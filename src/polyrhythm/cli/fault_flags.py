"""The fault-schedule flags `simulate` and `advise` share: predict each strategy going on
without lost workers (as `--on-worker-failure continue` does) under a worker lost every T
seconds, replaced after R or never, over a span."""

from __future__ import annotations

import argparse

from polyrhythm.errors import ConfigError
from polyrhythm.sim.faults import FaultSchedule
from polyrhythm.units import duration

PERIODS = 10  # the span's default: this many of --lose-every


def add_fault_flags(parser: argparse.ArgumentParser, min_workers: bool = False) -> None:
    """The flags; with `min_workers`, --min-workers too (where the config's flags are not)."""
    faults = parser.add_argument_group(
        "a fault schedule", "predict throughput with workers lost (spot or preemptible "
        "nodes): the others go on without them, as --on-worker-failure continue does, down "
        "to --min-workers")
    faults.add_argument("--lose-every", metavar="DURATION", help="a worker lost every this "
                        "long (the first after it)")
    faults.add_argument("--replace-after", metavar="DURATION", help="each lost worker "
                        "replaced this long after its loss (default: never)")
    faults.add_argument("--over", metavar="DURATION", help="the span the schedule covers "
                        f"(default: {PERIODS} times --lose-every)")
    if min_workers:
        faults.add_argument("--min-workers", type=int, metavar="N", help="the fewest workers "
                            "a run goes on with: a loss that would leave fewer fails it "
                            "(default: 1)")


def fault_schedule(args: argparse.Namespace) -> FaultSchedule | None:
    """The schedule the flags give; None without --lose-every (the others then one line)."""
    if args.lose_every is None:
        given = [flag for flag, value in (("--replace-after", args.replace_after),
                                          ("--over", args.over),
                                          ("--min-workers", getattr(args, "min_workers", None)))
                 if value is not None]
        if given:
            raise ConfigError(f"{given[0]} is part of a fault schedule: give --lose-every too")
        return None
    every = duration(args.lose_every, "--lose-every")
    return FaultSchedule(
        every, duration(args.over, "--over") if args.over else PERIODS * every,
        duration(args.replace_after, "--replace-after") if args.replace_after else None)


def going_on(flags: dict) -> dict:
    """A run's flags under a fault schedule: its workers go on without the lost ones."""
    if flags.get("on_worker_failure") == "abort":
        raise ConfigError("a fault schedule predicts the workers going on without the lost "
                          "ones: drop --on-worker-failure abort")
    return {**flags, "on_worker_failure": "continue"}


def describe(fault) -> str:
    """One line of a FaultPrediction: what the strategy keeps, and through which counts."""
    counts = ", ".join(f"{n} worker{'s' * (n != 1)} {x:.1f}" for n, (x, _) in
                       sorted(fault.by_workers.items(), reverse=True))
    timeline = fault.timeline
    failed = (f"; FAILS at {timeline.fails_at_s:g} s: fewer than --min-workers would be left"
              if timeline.fails_at_s is not None else "")
    return (f"{fault.samples_per_s:.1f} samples/s, {fault.kept:.3f} of fault-free "
            f"({counts} samples/s); {len(timeline.losses)} lost, {timeline.replaced} "
            f"replaced{failed}")
