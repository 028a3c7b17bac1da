"""The advisor: every strategy and server layout that fits the user's hosts, ranked by the
simulator's time per epoch, with a flag where staleness is known to cost accuracy, and a
recommendation with its expected error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polyrhythm.config import make_config
from polyrhythm.metrics.records import STORE_NAME, config_fields
from polyrhythm.metrics.store import RunStore
from polyrhythm.sim.run import simulate
from polyrhythm.sim.setup import Costs
from polyrhythm.strategies import STRATEGIES

SYNCHRONOUS = {"bsp", "allreduce", "ring", "tree", "reduce-broadcast"}
# The simulator's largest error against the emulated cluster's measurements (bsp, ring and
# asp at 2-16 workers; tests/test_sim.py asserts 20 %): the error a prediction carries when
# no run of the user's calibrates it.
VALIDATED_ERROR = 0.20
STALE = 1.0  # mean staleness above which a strategy is flagged without stored evidence


@dataclass
class Option:
    """One way to train on the hosts: its fields (train's flags), predicted samples/s and
    staleness, and a flag if its staleness is known to cost accuracy."""

    label: str
    fields: dict
    samples_per_s: float
    staleness: float
    flag: str = ""

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
           out: str | Path | None = None) -> list[Option]:
    """Every option, fastest first; `base`: the fields every option shares (cluster links,
    compute, batch), `out` a store whose runs say what staleness costs."""
    evidence = accuracy_cost(out) if out is not None else {}
    ranked = []
    for label, fields in options(hosts):
        config = make_config({**base, **fields})
        result = simulate(config, costs, iterations)
        option = Option(label, fields, result.samples_per_s, result.staleness_mean)
        option.flag = _flag(fields["strategy"], result.staleness_mean, evidence)
        ranked.append(option)
    return sorted(ranked, key=lambda o: -o.samples_per_s)


def accuracy_cost(out: str | Path) -> dict[str, float]:
    """Per strategy, how many points of final validation accuracy its completed runs in the
    store lost against the synchronous ones of the same model and data (mean over runs;
    runs of emulated compute left out)."""
    path = Path(out) / STORE_NAME
    if not path.exists():
        return {}
    # Runs of emulated compute learn nothing (their gradients are zeros): no evidence.
    rows = [r for r in RunStore(path).runs() if r["status"] == "completed"
            and r["final_val_accuracy"] is not None
            and config_fields(r["config"]).get("compute") != "emulated"]
    cost: dict[str, list[float]] = {}
    for key in {(r["model"], r["dataset"]) for r in rows}:
        same = [r for r in rows if (r["model"], r["dataset"]) == key]
        sync = [r["final_val_accuracy"] for r in same if r["strategy"] in SYNCHRONOUS]
        if not sync:
            continue
        best = sum(sync) / len(sync)
        for r in same:
            if r["strategy"] not in SYNCHRONOUS:
                cost.setdefault(r["strategy"], []).append(100 * (best - r["final_val_accuracy"]))
    return {name: sum(v) / len(v) for name, v in cost.items()}


def _flag(strategy: str, staleness: float, evidence: dict[str, float]) -> str:
    if strategy in SYNCHRONOUS:
        return ""
    if strategy in evidence:
        lost = evidence[strategy]
        return f"stored runs: {lost:+.1f} points vs synchronous" if lost > 0.5 else ""
    if strategy == "localsgd":
        return ("models drift apart between averagings (tau 4 local steps); no stored run "
                "to judge")
    if staleness > STALE:
        return (f"staleness {staleness:.1f}: asynchronous updates cost accuracy (the "
                "Strategy-Switch thesis: asynchronous PS -0.9 to -2.9 points); no stored run "
                "to judge")
    return ""


def recommend(ranked: list[Option], error: float) -> str:
    """One paragraph: the fastest option without a staleness flag, and the fastest overall
    if that one is flagged."""
    best = next((o for o in ranked if not o.flag), ranked[0])
    text = (f"Recommended: {best.label} (--strategy {best.fields['strategy']}"
            + (f" --servers {best.fields['servers']}" if "servers" in best.fields else "")
            + f"), {best.samples_per_s:.0f} samples/s predicted, expected error "
            f"±{100 * error:.0f} %.")
    if ranked[0] is not best:
        text += (f" Faster still: {ranked[0].label} ({ranked[0].samples_per_s:.0f} samples/s), "
                 f"but {ranked[0].flag}.")
    return text
