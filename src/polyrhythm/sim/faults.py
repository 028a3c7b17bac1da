"""A fault schedule and what a strategy keeps under it: a worker lost every T seconds, each
replaced R seconds later (or never), over a span of time; the throughput predicted from
simulations of each worker count the schedule passes through.

The workers left keep their own batch (a run told `--on-worker-failure continue` does: each
gradient keeps its weight b_i/B), so n workers train as a run of n workers with n of those
batches would. A loss costs the strategies whose steps wait for every worker's gradient one
more step: the step it interrupted is redone over the workers left (an all-reduce's sum
found short, a synchronous server's round); the others lose only the lost worker's step in
flight, which it never reports (local SGD's workers redo an average, taken as free). A
replacement trains from its first step (its start and the model it is sent are the
schedule's R).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polyrhythm.config import RunConfig, make_config
from polyrhythm.errors import ConfigError
from polyrhythm.settings import number
from polyrhythm.sim.result import SimResult
from polyrhythm.sim.run import simulate
from polyrhythm.sim.setup import Costs
from polyrhythm.strategies import STRATEGIES
from polyrhythm.strategies.spec import COLLECTIVE, EVERY_WORKERS, PARAMETER_SERVER, SWITCHING

MAX_LOSSES = 1_000_000  # in a schedule's span: the timeline walks each


@dataclass(frozen=True)
class FaultSchedule:
    """A worker lost every `every_s` seconds (the first at `every_s`), each replaced
    `replaced_after_s` later (None: never), over `over_s` seconds."""

    every_s: float
    over_s: float
    replaced_after_s: float | None = None

    def __post_init__(self) -> None:
        if not self.every_s > 0:
            raise ConfigError(f"--lose-every must be a positive duration, got "
                              f"{number(self.every_s)}s")
        if not self.over_s > 0:
            raise ConfigError(f"--over must be a positive duration, got {number(self.over_s)}s")
        if self.over_s / self.every_s > MAX_LOSSES:  # each one an event to walk through
            raise ConfigError(f"--over {number(self.over_s)}s holds more than "
                              f"{MAX_LOSSES:,} losses of --lose-every "
                              f"{number(self.every_s)}s: give a shorter span or a longer "
                              "period")
        if self.replaced_after_s is not None and self.replaced_after_s < 0:
            raise ConfigError("--replace-after must not be negative, got "
                              f"{number(self.replaced_after_s)}s")

    def describe(self) -> str:
        replaced = ("never replaced" if self.replaced_after_s is None else
                    f"each replaced after {number(self.replaced_after_s)} s")
        return (f"a worker lost every {number(self.every_s)} s, {replaced}, over "
                f"{number(self.over_s)} s")

    def timeline(self, workers: int, min_workers: int) -> Timeline:
        """The worker count through the span, from `workers`; it ends early, failed, where a
        loss would leave fewer than `min_workers`."""
        # (time, order, change): at one time an earlier loss's replacement comes first, then
        # a loss, then the replacement of that very loss (replaced after 0 s). Times on a
        # grid of a nanosecond: k·T and (k-1)·T + R computed apart must meet where equal.
        events = []
        for k in range(1, int(self.over_s / self.every_s) + 2):
            events.append((_on_grid(k * self.every_s), 1, -1))
            if self.replaced_after_s is not None:
                events.append((_on_grid(k * self.every_s + self.replaced_after_s),
                               0 if self.replaced_after_s > 0 else 2, +1))
        timeline = Timeline()
        n, since = workers, 0.0
        for t, _, change in sorted(events):
            if t >= _on_grid(self.over_s):
                break
            if n + change < min_workers:
                timeline.add(since, t, n)
                timeline.fails_at_s = t
                return timeline
            timeline.add(since, t, n)
            n, since = n + change, t
            if change < 0:
                timeline.losses.append((t, n + 1))
            else:
                timeline.replaced += 1
        timeline.add(since, self.over_s, n)
        return timeline


def _on_grid(seconds: float) -> float:
    return round(seconds, 9)


@dataclass
class Timeline:
    """(start, end, workers) spans in order; each loss's (time, workers before it); how many
    were replaced; when the run failed (None: it did not)."""

    spans: list[tuple[float, float, int]] = field(default_factory=list)
    losses: list[tuple[float, int]] = field(default_factory=list)
    replaced: int = 0
    fails_at_s: float | None = None

    def add(self, start: float, end: float, workers: int) -> None:
        if end > start:
            self.spans.append((start, end, workers))

    def counts(self) -> set[int]:
        return {n for _, _, n in self.spans} | {n for _, n in self.losses}


@dataclass
class FaultPrediction:
    """A strategy's throughput under a fault schedule: samples trained per second of the
    span (nothing after it failed, where it did), against the same run without faults; each
    worker count's samples/s and iteration seconds."""

    schedule: FaultSchedule
    timeline: Timeline
    samples_per_s: float
    fault_free_samples_per_s: float
    by_workers: dict[int, tuple[float, float]]

    @property
    def kept(self) -> float:
        free = self.fault_free_samples_per_s
        return self.samples_per_s / free if free else 0.0

    def summary(self) -> dict:
        return {"lose_every_s": self.schedule.every_s, "over_s": self.schedule.over_s,
                "replaced_after_s": self.schedule.replaced_after_s,
                "samples_per_s": self.samples_per_s, "kept": self.kept,
                "fault_free_samples_per_s": self.fault_free_samples_per_s,
                "lost": len(self.timeline.losses), "replaced": self.timeline.replaced,
                "fails_at_s": self.timeline.fails_at_s,
                "workers_samples_per_s": {str(n): x for n, (x, _) in
                                          sorted(self.by_workers.items())}}


def redoes_a_step(strategy: str) -> bool:
    """Whether a loss costs the workers left a step: each of their steps waits for every
    worker's gradient (the collective strategies, Strategy-Switch's first half, taken for
    the whole, and the parameter-server ones whose updates take every worker's). Local
    SGD's workers redo an average, not a step; asynchronous ones wait for nobody."""
    spec = STRATEGIES[strategy]
    return spec.family in (COLLECTIVE, SWITCHING) or (
        spec.family == PARAMETER_SERVER and spec.updates_from == EVERY_WORKERS)


def under_faults(config: RunConfig, costs: Costs, schedule: FaultSchedule,
                 iterations: int, simulated: SimResult | None = None) -> FaultPrediction:
    """`config`'s throughput under `schedule`, its workers going on with
    `--on-worker-failure continue` down to its min_workers; `simulated`: `config`'s own
    simulation, where the caller has it (a large one is not run twice)."""
    timeline = schedule.timeline(config.workers, config.min_workers)
    simulated = simulated or simulate(config, costs, iterations)
    by_workers = {n: _rate(config, costs, n, iterations) for n in timeline.counts()
                  if n != config.workers}
    by_workers[config.workers] = (simulated.samples_per_s, simulated.iteration_s)
    samples = sum((end - start) * by_workers[n][0] for start, end, n in timeline.spans)
    if redoes_a_step(config.strategy.name):
        samples -= sum(by_workers[n - 1][0] * by_workers[n][1] for _, n in timeline.losses
                       if n > 1)
    # Over the whole span: a run the schedule fails trains nothing after it failed.
    return FaultPrediction(schedule, timeline, max(0.0, samples) / schedule.over_s,
                           by_workers[config.workers][0], by_workers)


def _rate(config: RunConfig, costs: Costs, workers: int,
          iterations: int) -> tuple[float, float]:
    """(samples/s, iteration seconds) of `config` with fewer workers, `workers`, each
    keeping its batch."""
    values = config.to_dict()
    values.update(workers=workers, batch_size=config.batch_size // config.workers * workers)
    values.pop("slowdown", None)  # the first workers' slowdowns, as given, would stay
    cluster = dict(values.get("cluster", {}))
    if cluster.get("workers_per_host"):  # the hosts left: those of the workers left
        cluster.pop("hosts", None)
        values["cluster"] = cluster
    try:
        smaller = make_config(values)
    except ConfigError as exc:
        raise ConfigError(f"the fault schedule needs {config.strategy.name} with "
                          f"{workers} workers, which is not a run: {exc}") from None
    result = simulate(smaller, costs, iterations)
    return result.samples_per_s, result.iteration_s
