"""The table and figure of experiments/mapreduce.toml, from its runs in the store:

    python experiments/mapreduce_figure.py [--out runs] [--figure docs/figures/mapreduce.png]

Per run (strategy, model, mini-batch): milliseconds per mini-batch after the warm-up steps and
their parts, and reading throughput (rows per second of reading time). `mapreduce`'s parts
are its own (summary `mapreduce`: along each mini-batch's critical path, they add up to it);
a parameter-server run's are its workers' spans (compute, read, push + pull, wait, apply),
their mean over workers and measured steps, the rest of the step as `other`. The figure
draws the parts as stacked bars, a panel per model, as the asynchronous-training thesis's
Figures 2.7 and 2.9 split MLlib's and TensorFlow's time per mini-batch.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

import numpy as np

from polyrhythm.metrics.records import STORE_NAME
from polyrhythm.sweep.store import SweepStore

PARTS = ("compute", "read", "communication", "scheduling", "update", "other")
TASKS = {"mse": "linear regression (90 features)", "bce": "logistic regression (28 features)"}
SYSTEMS = ("mapreduce", "bsp", "asp")


def run_rows(out: Path, sweep: str) -> list[dict]:
    store = SweepStore(out / STORE_NAME)
    rows = []
    for run_id in store.run_ids(sweep):
        summary = json.loads(store.run(run_id)["summary"])
        config = tomllib.loads((out / run_id / "config.toml").read_text())
        rows.append(_row(store, run_id, summary, config))
    return rows


def _row(store: SweepStore, run_id: str, summary: dict, config: dict) -> dict:
    row = {"strategy": summary["strategy"], "loss": config["loss"],
           "batch": config["batch_size"], "run_id": run_id,
           "cpu": _worker_cpu(store.series("resources", run_id))}
    if summary["strategy"] == "mapreduce":
        m = summary["mapreduce"]
        ms = {p: 1000 * m[f"{p}_s"] for p in ("schedule", "read", "broadcast", "compute",
                                             "aggregate", "update")}
        row["parts"] = {"compute": ms["compute"], "read": ms["read"],
                        "communication": ms["broadcast"] + ms["aggregate"],
                        "scheduling": ms["schedule"], "update": ms["update"], "other": 0.0}
        row["step_ms"] = 1000 * m["step_s"]
        row["read_rate"] = m["read_examples_per_s"]
        # Each executor's own reading of its partition, as a worker's of its shard (the first
        # job's start-up, Python workers and their imports, left out).
        row["load_rate"] = m["load_rows"] / m["load_slowest_s"]
        return row
    warmup = summary["warmup_steps"]
    steps = [s for s in store.series("iterations", run_id) if s["step"] >= warmup]
    mean = {k: 1000 * float(np.mean([s[k] for s in steps])) for k in (
        "compute_s", "read_s", "push_s", "pull_s", "wait_s", "apply_s", "total_s")}
    parts = {"compute": mean["compute_s"], "read": mean["read_s"],
             "communication": mean["push_s"] + mean["pull_s"], "scheduling": mean["wait_s"],
             "update": mean["apply_s"]}
    parts["other"] = max(0.0, mean["total_s"] - sum(parts.values()))
    row["parts"], row["step_ms"] = parts, mean["total_s"]
    batch = config["batch_size"] / config["workers"]  # each worker reads its share
    read_s = [s["read_s"] for s in steps if s["read_s"] > 0]
    row["read_rate"] = config["workers"] * batch / float(np.mean(read_s)) if read_s else None
    row["load_rate"] = summary["data"].get("read_examples_per_s")
    return row


def _worker_cpu(samples: list[dict]) -> float | None:
    """The workers' mean CPU (% of a core) over the run's samples, a worker's processes
    together (an executor's JVM and Python workers)."""
    values = [s["cpu_percent"] for s in samples if s["role"] == "worker"]
    return float(np.mean(values)) if values else None


def table(rows: list[dict]) -> str:
    head = ("| model | system | mini-batch | ms per mini-batch | " +
            " | ".join(f"{p} (ms)" for p in PARTS) +
            " | reading, rows/s per mini-batch | first read, rows/s | a worker's CPU (%) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(rows, key=lambda r: (r["loss"], SYSTEMS.index(r["strategy"]), r["batch"])):
        parts = " | ".join(f"{r['parts'][p]:,.1f}" for p in PARTS)
        lines.append(f"| {TASKS[r['loss']].split(' (')[0]} | `{r['strategy']}` | "
                     f"{r['batch']:,} | {r['step_ms']:,.1f} | {parts} | "
                     f"{_rate(r['read_rate'])} | {_rate(r['load_rate'])} | "
                     f"{_rate(r['cpu'])} |")
    return "\n".join(lines)


def _rate(value) -> str:
    return "–" if value is None else f"{value:,.0f}"


def figure(rows: list[dict], path: Path) -> None:
    """A row per model: each mini-batch's time in its parts, stacked (as Figure 2.7), and
    its reading time alone on a log scale (as Figure 2.9)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = [loss for loss in TASKS if any(r["loss"] == loss for r in rows)]
    fig, axes = plt.subplots(len(losses), 2, figsize=(13, 4.2 * len(losses)), squeeze=False)
    colours = dict(zip(PARTS, plt.get_cmap("tab10").colors, strict=False))
    width = 0.8 / len(SYSTEMS)
    for (parts_ax, read_ax), loss in zip(axes, losses, strict=True):
        mine = [r for r in rows if r["loss"] == loss]
        batches = sorted({r["batch"] for r in mine})
        for s, system in enumerate(SYSTEMS):
            for b, batch in enumerate(batches):
                found = [r for r in mine if r["strategy"] == system and r["batch"] == batch]
                if not found:
                    continue
                bottom, x = 0.0, b + (s - (len(SYSTEMS) - 1) / 2) * width
                for part in PARTS:
                    value = found[0]["parts"][part]
                    parts_ax.bar(x, value, width * 0.9, bottom=bottom, color=colours[part],
                                 label=part if (s, b) == (0, 0) else None)
                    bottom += value
                parts_ax.text(x, bottom, system[0].upper(), ha="center", va="bottom",
                              fontsize=7)
                read_ax.bar(x, max(found[0]["parts"]["read"], 1e-3), width * 0.9,
                            color=plt.get_cmap("Set2").colors[s],
                            label=system if b == 0 else None)
        for ax in (parts_ax, read_ax):
            ax.set_xticks(range(len(batches)), [f"{b:,}" for b in batches])
            ax.set_xlabel("mini-batch (rows)")
            # Beside the plot: inside, it covers the tall mapreduce bars.
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        # Room above the tallest stack for its letter (autoscale's margin stops at the
        # stacked bars' sticky edges).
        tallest = max(sum(r["parts"].values()) for r in mine)
        parts_ax.set_ylim(0, tallest * 1.1)
        parts_ax.set_ylabel("ms per mini-batch")
        parts_ax.set_title(f"{TASKS[loss]}: a mini-batch's time (M mapreduce, B bsp, A asp)",
                           fontsize=10)
        read_ax.set_yscale("log")
        read_ax.set_ylabel("ms reading per mini-batch")
        read_ax.set_title(f"{TASKS[loss]}: reading", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs", help="the store's folder")
    parser.add_argument("--sweep", default="mapreduce")
    parser.add_argument("--figure", default="docs/figures/mapreduce.png")
    args = parser.parse_args(argv)
    rows = run_rows(Path(args.out), args.sweep)
    if not rows:
        print(f"no completed run of sweep {args.sweep!r} in {args.out}", file=sys.stderr)
        return 1
    print(table(rows))
    figure(rows, Path(args.figure))
    print(f"\nfigure: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
