"""Stored runs as TensorBoard event files (`polyrhythm report ... --format tensorboard`).

One directory per completed run, named by its run id, under `<out_dir>/tensorboard/`; view
them with `tensorboard --logdir <out_dir>/tensorboard`. Each run holds:

- `epoch/val_accuracy`, `epoch/val_loss`, `epoch/train_loss`, `epoch/samples_per_s`
  (step: epochs completed);
- `worker<i>/<span>_ms` for compute, push, wait, pull, apply and the whole iteration
  (step: the worker's step);
- `server<r>/staleness` of every applied gradient and `server<r>/update_ms` of every weight
  update (step: their order on that server);
- `worker<i>/cpu_percent`, `worker<i>/rss_mib` and the same under `server<r>/` for every
  process (step: the sample's index);
- the run's config as hyperparameters, with its final accuracy, samples/s and wall time as
  their metrics (TensorBoard's HPARAMS tab compares runs).

Every event's wall time is the run's creation time plus its time since the job started, so
TensorBoard's "relative" axis reads as training time. Every process is named by its role and
its index in that role, as everywhere else (worker 0 is `worker0`, whatever its rank), so one
process's spans and resources sit under one prefix. Needs the `tensorboard` package.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from polyrhythm.errors import ConfigError
from polyrhythm.metrics.recorder import SPAN_NAMES
from polyrhythm.report.data import Run

EPOCH_SCALARS = ("val_accuracy", "val_loss", "train_loss", "samples_per_s")
SPANS = (*SPAN_NAMES, "total")
FINAL = {"final/val_accuracy": "final_val_accuracy", "final/samples_per_s": "samples_per_s",
         "final/wall_s": "wall_s"}


def write_tensorboard(runs: list[Run], out_dir: Path) -> Path:
    """Write each completed run's event file under out_dir; return out_dir."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("the tensorboard format needs the tensorboard package "
                          "(pip install tensorboard)") from None
    for run in (r for r in runs if r.completed):
        start = datetime.fromisoformat(run.row["created"]).timestamp()
        with SummaryWriter(str(out_dir / run.run_id)) as writer:
            _epochs(writer, run, start)
            _iterations(writer, run, start)
            _servers(writer, run, start)
            _resources(writer, run, start)
            _hyperparameters(writer, run)
    return out_dir


def _epochs(writer, run: Run, start: float) -> None:
    for e in run.epochs:
        for name in EPOCH_SCALARS:
            if e.get(name) is not None:
                writer.add_scalar(f"epoch/{name}", e[name], e["epoch"] + 1,
                                  walltime=start + (e.get("wall_s") or 0.0))


def _iterations(writer, run: Run, start: float) -> None:
    it = run.series.get("iterations", {})
    for row in range(len(it.get("worker", ()))):
        worker, step, t = int(it["worker"][row]), int(it["step"][row]), float(it["t"][row])
        for span in SPANS:
            writer.add_scalar(f"worker{worker}/{span}_ms", 1000 * it[f"{span}_s"][row], step,
                              walltime=start + t)


def _servers(writer, run: Run, start: float) -> None:
    for table, column, tag, scale in (("pushes", "staleness", "staleness", 1),
                                      ("updates", "seconds", "update_ms", 1000)):
        columns = run.series.get(table, {})
        counts: dict[int, int] = {}
        for row in range(len(columns.get("server", ()))):
            server = int(columns["server"][row])
            counts[server] = counts.get(server, 0) + 1
            writer.add_scalar(f"server{server}/{tag}", scale * columns[column][row],
                              counts[server], walltime=start + float(columns["t"][row]))


def _resources(writer, run: Run, start: float) -> None:
    r = run.series.get("resources", {})
    servers = int(run.row["servers"])  # ranks: servers first, then workers
    counts: dict[str, int] = {}
    for row in range(len(r.get("rank", ()))):
        role, rank, when = r["role"][row], int(r["rank"][row]), start + float(r["t"][row])
        process = f"{role}{rank - servers if role == 'worker' else rank}"
        counts[process] = counts.get(process, 0) + 1
        writer.add_scalar(f"{process}/cpu_percent", r["cpu_percent"][row], counts[process],
                          walltime=when)
        writer.add_scalar(f"{process}/rss_mib", r["rss_bytes"][row] / 2**20, counts[process],
                          walltime=when)


def _hyperparameters(writer, run: Run) -> None:
    """Scalars as they are; lists and other values as text (what the HPARAMS tab takes)."""
    hparams = {k: v if isinstance(v, bool | int | float | str) else str(v)
               for k, v in sorted(run.config.items())}
    metrics = {tag: run.summary[key] for tag, key in FINAL.items()
               if isinstance(run.summary.get(key), int | float)}
    writer.add_hparams(hparams, metrics, run_name=".")
