"""The advisor: every strategy and server layout that fits the user's hosts, each with every
compressor asked for (its default settings), ranked by the simulator's time per epoch, with
what is known of each one's accuracy (the store's runs, else the documents, else that it is
unknown: sim/evidence.py), and a recommendation with its expected error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polyrhythm.compression import NONE
from polyrhythm.config import make_config
from polyrhythm.errors import ConfigError
from polyrhythm.sim.compressed import settings_key
from polyrhythm.sim.evidence import StoredRun, judge
from polyrhythm.sim.faults import FaultSchedule, under_faults
from polyrhythm.sim.run import simulate
from polyrhythm.sim.setup import Costs
from polyrhythm.strategies import STRATEGIES

# The simulator's largest error against the emulated cluster's measurements (bsp, ring and
# asp at 2-16 workers; tests/test_sim.py asserts 20 %): the error a prediction carries when
# no run of the user's calibrates it.
VALIDATED_ERROR = 0.20


@dataclass
class Option:
    """One way to train on the hosts: its fields (train's flags), predicted samples/s and
    staleness, what is known of its accuracy (`flag`), whether that cautions against it, and
    the stored runs that say so."""

    label: str
    fields: dict
    samples_per_s: float
    staleness: float
    flag: str = ""
    caution: bool = False
    evidence: tuple[str, ...] = ()
    kept: float | None = None  # of its fault-free samples/s, under a fault schedule

    def epoch_s(self, samples: int) -> float:
        return samples / self.samples_per_s if self.samples_per_s else float("inf")


def options(hosts: int) -> list[tuple[str, dict]]:
    """The strategies and layouts that fit `hosts` hosts, a worker on each (servers on
    worker hosts, or on hosts of their own)."""
    every = {"workers": hosts, "workers_per_host": 1}
    out = [(name, {"strategy": name, **every})
           for name in ("allreduce", "ring", "tree", "reduce-broadcast", "localsgd")]
    for name in ("bsp", "asp", "ssp", "kbsp", "backup"):
        whole = STRATEGIES[name].whole_gradient({})  # its policy needs the whole gradient
        for servers in sorted({1} if whole else {1, hosts}):
            out.append((f"{name}, {servers} server{'s' * (servers > 1)} on worker hosts",
                        {"strategy": name, "servers": servers, "placement": "collocated",
                         **every}))
        if hosts > 2 and name in ("bsp", "asp"):
            out.append((f"{name}, 1 server on a host of its own",
                        {"strategy": name, "servers": 1, "workers": hosts - 1,
                         "workers_per_host": 1}))
    out.append(("switch (allreduce, then asp at half-way)",
                {"strategy": "switch", "placement": "collocated", **every}))
    return out


def advise(base: dict, costs: Costs, hosts: int, iterations: int = 60,
           runs: Sequence[StoredRun] = (), compressors: Sequence[str] = (NONE,),
           schedule: FaultSchedule | None = None,
           unranked: list[tuple[str, str]] | None = None) -> list[Option]:
    """Every option with every compressor of `compressors` (its defaults), fastest first;
    `base`: the fields every option shares (cluster links, compute, batch, model and data),
    `runs` the stored runs that say what staleness and compression cost
    (evidence.stored_runs); `costs` has each compressor's codec timed (Costs.codec_s).
    Under a fault `schedule` (`base` going on without lost workers), ranked by the
    samples/s each keeps under it; one that the schedule fails is cautioned against, and
    one that cannot go on (a compressed collective sum, fewer workers than min_workers) is
    left out, with why, in `unranked`."""
    ranked = []
    for label, strategy in options(hosts):
        for name in compressors:
            fields = {**strategy, "compress": name}
            named = label if name == NONE else f"{label} + {name}"
            try:
                config = make_config({**base, **fields})
            except ConfigError as exc:
                if schedule is None or unranked is None:
                    raise
                unranked.append((named, str(exc)))
                continue
            result = simulate(config, costs, iterations)
            said = judge(fields["strategy"], fields["workers"], result.staleness_mean, runs,
                         settings_key(config.compression))
            option = Option(named, fields, result.samples_per_s, result.staleness_mean,
                            said.text, said.caution, said.run_ids)
            if schedule is not None:
                fault = under_faults(config, costs, schedule, iterations, result)
                option.samples_per_s, option.kept = fault.samples_per_s, fault.kept
                if fault.timeline.fails_at_s is not None:
                    option.caution = True
                    option.flag = "; ".join(filter(None, [
                        f"fails at {fault.timeline.fails_at_s:g} s: fewer than min_workers "
                        "would be left", option.flag]))
            ranked.append(option)
    return sorted(ranked, key=lambda o: -o.samples_per_s)


def recommend(ranked: list[Option], error: float) -> str:
    """One paragraph: the fastest option nothing cautions against, and the fastest overall
    if something does."""
    best = next((o for o in ranked if not o.caution), ranked[0])
    text = (f"Recommended: {best.label} (--strategy {best.fields['strategy']}"
            + (f" --servers {best.fields['servers']}" if "servers" in best.fields else "")
            + (f" --compress {best.fields['compress']}"
               if best.fields.get("compress", NONE) != NONE else "")
            + f"), {best.samples_per_s:.0f} samples/s predicted, expected error "
            f"±{100 * error:.0f} %.")
    if ranked[0] is not best:
        text += (f" Faster still: {ranked[0].label} ({ranked[0].samples_per_s:.0f} samples/s), "
                 f"but {ranked[0].flag}.")
    return text
