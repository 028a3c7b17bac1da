"""Every figure of a report: a stable name (file `<name>.png`, HTML id), title and caption."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import matplotlib

from polyrhythm.report import compression, resources, shards, system, training
from polyrhythm.report.data import Group
from polyrhythm.report.plot import STYLE, NoData, png, title

_BANDS = ("Line: mean over repeats, drawn where every repeat has data; dark band: ±1 "
          "standard deviation; light band: min-max (bands only where a group has repeats).")
_BARS = ("Thick error bars: ±1 standard deviation over repeats; thin capped bars: min-max "
         "(only where a group has repeats).")


def _always(groups: list[Group]) -> bool:
    return True


@dataclass(frozen=True)
class FigureSpec:
    name: str
    title: str
    caption: str
    draw: Callable[[list[Group]], object]
    # Whether a report on these groups has the figure at all (else it is left out, where a
    # figure without data says so).
    shown: Callable[[list[Group]], bool] = _always


FIGURES = (
    FigureSpec("accuracy_vs_time", "Validation accuracy over wall time",
               "Validation accuracy at the end of each epoch against the wall time since "
               "training started (x: mean over repeats); dotted lines mark where "
               "Strategy-Switch runs switched. " + _BANDS,
               training.accuracy_vs_time),
    FigureSpec("accuracy_vs_epoch", "Validation accuracy per epoch",
               "Validation accuracy at the end of each epoch; dotted lines mark the epoch "
               "after which Strategy-Switch runs switched. " + _BANDS,
               training.accuracy_vs_epoch),
    FigureSpec("throughput_vs_time", "Throughput over time",
               "Training samples per second of all workers together in each time bin, from "
               "the iterations they finished; dashed lines mark where a run lost a worker "
               "and went on without it. " + _BANDS, training.throughput_vs_time),
    FigureSpec("throughput_vs_workers", "Throughput against workers",
               "Training samples per second of all workers together (warm-up excluded), per "
               "strategy and worker count. " + _BARS, training.throughput_vs_workers),
    FigureSpec("speedup_vs_workers", "Speed-up against workers",
               "Throughput over the mean throughput of the same strategy at its smallest "
               "worker count N0; dashed: linear speed-up. " + _BARS,
               training.speedup_vs_workers),
    FigureSpec("efficiency_vs_workers", "Scaling efficiency against workers",
               "Speed-up divided by N/N0: 1 is linear scaling. " + _BARS,
               training.efficiency_vs_workers),
    FigureSpec("time_breakdown", "Time per iteration by phase",
               "Mean milliseconds per training iteration spent in compute, push, wait, pull, "
               "apply, compress (encoding and decoding compressed messages) and the rest "
               "('other': data loading, bookkeeping), each worker's warm-up steps left out; "
               "phases no group spent time in are left out. Error bars are on the total. "
               + _BARS, system.time_breakdown),
    FigureSpec("idleness", "Worker idleness",
               "Share of each worker's iteration time spent waiting (for a barrier, a quorum "
               "or a server); dots are single workers of single runs. " + _BARS,
               system.idleness_figure),
    FigureSpec("staleness_histogram", "Staleness of applied gradients",
               "Share of the gradients the servers applied, by staleness: server updates "
               "between the worker's pull and its push. " + _BARS,
               system.staleness_histogram),
    FigureSpec("staleness_over_time", "Staleness over time",
               "Mean staleness of the gradients applied in each time bin. " + _BANDS,
               system.staleness_over_time),
    FigureSpec("weight_updates", "Weight updates applied to the model",
               "Weight updates the model received (per server shard; without servers one "
               "per step). " + _BARS, system.weight_updates_figure),
    FigureSpec("push_pull_latency", "Push and pull latency per iteration",
               "Distribution of the milliseconds each iteration spent pushing gradients and "
               "pulling parameters, over all workers and repeats (each worker's warm-up "
               "steps left out).", system.push_pull_latency),
    FigureSpec("cpu_over_time", "CPU use over time",
               "CPU use of each process (100 % is one core), averaged over the processes of "
               "a role; servers and workers apart. " + _BANDS, resources.cpu_over_time),
    FigureSpec("memory_over_time", "Memory over time",
               "Resident memory of each process, averaged over the processes of a role. "
               + _BANDS, resources.memory_over_time),
    FigureSpec("network_over_time", "Network traffic over time",
               "Bytes each process sent and received per second (from its cumulative "
               "counters), averaged over the processes of a role. " + _BANDS,
               resources.network_over_time),
    FigureSpec("bytes_vs_accuracy", "Bytes per step against validation accuracy",
               "Final validation accuracy against the bytes sent per worker step, one point "
               "per group: a strategy and what it compressed its messages with (and any "
               "other field that varies). Bytes per step: the bytes every rank sent, point "
               "to point plus the payload it handed to Gloo's own collectives (not Gloo's "
               "wire traffic, which depends on its algorithm), summed over the ranks and "
               "divided by the steps of all workers together; log scale. Marker: the "
               "compressor; colour: the strategy where there are several. Only in reports "
               "with a compressed run; error bars on both axes. " + _BARS,
               compression.bytes_vs_accuracy, shown=compression.compressed),
    FigureSpec("shards", "How the training set was split across workers",
               "Examples of each class on each worker (one group of bars per worker; "
               "'+k copies': examples every worker holds, distribution-aware sharding's "
               "sparse neighbourhoods), for the first run of each group.",
               shards.shards_figure),
)


@dataclass(frozen=True)
class Rendered:
    spec: FigureSpec
    png: bytes | None  # None: no data, and `reason` says why
    reason: str | None = None

    @property
    def file_name(self) -> str:
        return f"{self.spec.name}.png"


def render(groups: list[Group]) -> list[Rendered]:
    """Every figure the groups call for (FigureSpec.shown) as PNG bytes, or the reason it
    has no data."""
    rendered = []
    with matplotlib.rc_context(STYLE):
        for spec in FIGURES:
            if not spec.shown(groups):
                continue
            try:
                fig = spec.draw(groups)
            except NoData as exc:
                rendered.append(Rendered(spec, None, str(exc)))
                continue
            title(fig, spec.title)
            rendered.append(Rendered(spec, png(fig)))
    return rendered
