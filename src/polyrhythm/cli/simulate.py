"""`polyrhythm simulate`: predict how strategies behave on a cluster this machine cannot
hold (sim/), from the same flags as `train`, a sweep file, or stored runs to calibrate on."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from polyrhythm.cli.fault_flags import add_fault_flags, describe, fault_schedule, going_on
from polyrhythm.cli.flags import add_config_flags, config_flags, list_of
from polyrhythm.config import load_toml
from polyrhythm.errors import ConfigError
from polyrhythm.units import duration

DEFAULT_ITERATIONS = 100


def add_parser(commands) -> None:
    sim = commands.add_parser(
        "simulate", help="predict strategies on a simulated cluster (thousands of workers)",
        description="Simulate the run `train` would make with these flags (one or several "
        "strategies and worker counts), or every point of a sweep file, on the cluster the "
        "flags describe (--bandwidth, --latency, --hosts or --workers-per-host, --placement, "
        "--cpu, --slowdown; a link speed or CPU share without a host count means a host per "
        "worker), with each step's compute time (--compute-time) or the costs measured by "
        "stored runs (--calibrate RUN_ID). The model is sized for the data set the run "
        "would use (--dataset), or by --model-mb. With --compress, messages have their "
        "compressed sizes and each step its encoding time (timed here on the model, or the "
        "calibrating run's). Prints a table (samples/s, efficiency, "
        "iteration time, idleness, staleness, server load) and writes the throughput and "
        "efficiency plot. Lists take spaces or commas: --workers 2 8 64 or 2,8,64.")
    sim.add_argument("--config", metavar="FILE.toml", help="config file; flags override it")
    sim.add_argument("--strategy", metavar="NAME", help="strategies to simulate "
                     "(default: bsp)", **list_of(str))
    sim.add_argument("--workers", metavar="N", help="worker counts (default: 4)",
                     **list_of(int))
    sim.add_argument("--sweep", metavar="FILE.toml", help="simulate every point of this "
                     "sweep file instead")
    sim.add_argument("--calibrate", metavar="RUN_ID", action="append", default=[],
                     help="a stored run (under --out) to predict from its own measured "
                     "costs, beside its measurement; repeat for several")
    sim.add_argument("--model-mb", type=float, metavar="MB", help="the model's size in MB "
                     "(float32), instead of --model's size on --dataset's samples; it has "
                     "no matrices, so PowerSGD sends its values as they are")
    sim.add_argument("--update-time", metavar="DURATION", help="a server's optimizer step "
                     "on the whole model (default: 2 ns per parameter)")
    sim.add_argument("--reduce-time", metavar="DURATION", default="0ms",
                     help="adding one whole-model gradient (default: 0ms)")
    sim.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS, metavar="N",
                     help=f"steps per worker (default: {DEFAULT_ITERATIONS})")
    sim.add_argument("--plot", metavar="FILE.png", help="where the plot goes (default: "
                     "OUT/simulations/<time>.png)")
    sim.add_argument("--json", action="store_true",
                     help="print the predictions as JSON on the last line")
    add_fault_flags(sim)
    add_config_flags(sim, exclude=("strategy", "workers"))


def run(args: argparse.Namespace) -> int:
    from polyrhythm.sim.calibrate import calibrate
    from polyrhythm.sim.faults import under_faults
    from polyrhythm.sim.study import predict, predict_runs

    if args.iterations < 1:
        raise ConfigError(f"--iterations must be at least 1, got {args.iterations}")
    if args.plot and Path(args.plot).suffix.lower() != ".png":
        raise ConfigError(f"--plot writes a PNG file: {args.plot!r} does not end in .png")
    schedule = fault_schedule(args)
    flags = {k: v for k, v in config_flags(args).items() if k not in ("strategy", "workers")}
    if schedule is not None:
        flags = going_on(flags)
    out = flags.get("out", "runs")
    calibrations = [calibrate(out, run_id) for run_id in args.calibrate]
    configs = _configs(args, flags) if (args.sweep or not calibrations or args.strategy
                                        or args.workers) else []
    predictions = predict_runs(calibrations)
    faults = {}  # by prediction: its throughput under the fault schedule
    if schedule is not None:
        faults = {id(p): under_faults(cal.config, cal.costs, schedule, cal.iterations,
                                      p.result)
                  for p, cal in zip(predictions, calibrations, strict=True)}
    costs: dict = {}  # one sizing for each model on each data set
    for config in configs:
        key = repr((config.model.to_dict(), config.data.to_dict()))
        if key not in costs:
            costs[key] = _costs(args, config)
        costs[key] = _codecs_timed(costs[key], config)
        predictions += predict([config], costs[key], args.iterations)
        if schedule is not None:
            faults[id(predictions[-1])] = under_faults(config, costs[key], schedule,
                                                       args.iterations, predictions[-1].result)
    print(format_predictions(predictions))
    if schedule is not None:
        print(f"under faults ({schedule.describe()}):")
        for p in predictions:  # each has its faults' prediction
            print(f"  {p.result.strategy:<18} {p.result.workers:>5} workers: "
                  f"{describe(faults[id(p)])}")
    from polyrhythm.sim.plot import scaling_png

    path = Path(args.plot or Path(out) / "simulations" / f"{time.strftime('%Y%m%d-%H%M%S')}.png")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(scaling_png(predictions, "Simulated throughput and efficiency"))
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)!r}: {exc.strerror}") from None
    print(f"wrote {path}")
    if args.json:
        rows = [{**_row(p), **({"faults": faults[id(p)].summary()} if id(p) in faults
                               else {})} for p in predictions]
        print(json.dumps(rows[0] if len(rows) == 1 else rows))
    return 0


def _configs(args, flags: dict) -> list:
    if args.sweep:
        from polyrhythm.sweep.plan import load_sweep

        return [planned.config for planned in load_sweep(args.sweep, out=flags.get("out")
                                                         ).plan()]
    from polyrhythm.sim.setup import simulation_config

    if "compute_time" in flags and "compute" not in flags:
        flags["compute"] = "emulated"  # a compute time means: simulate steps that long
    given = load_toml(args.config) if args.config else {}
    configs = [simulation_config(given, flags, {k: v for k, v in (("strategy", strategy),
                                                                  ("workers", workers)) if v})
               for strategy in args.strategy or [None] for workers in args.workers or [None]]
    if any(c.compute != "emulated" for c in configs):
        raise ConfigError("simulate needs each step's compute time: give --compute-time "
                          "(e.g. 8s), or --calibrate RUN_ID to take a stored run's")
    return configs


def _costs(args, config):
    """The costs of `config`'s model, sized for its data (or by --model-mb); says so."""
    from polyrhythm.cli.sizing import model_values
    from polyrhythm.sim import Costs

    parameters, shapes, sized = model_values(config, args.model_mb)
    print(sized)
    update = duration(args.update_time, "--update-time") if args.update_time else None
    return Costs.estimated(parameters, update, duration(args.reduce_time, "--reduce-time"),
                           shapes)


def _codecs_timed(costs, config):
    """`costs` with `config`'s compressor's encoding and decoding timed here, once (said)."""
    from polyrhythm.cli.sizing import describe_codecs, time_codecs
    from polyrhythm.sim.compressed import settings_key

    key = settings_key(config.compression)
    if key == "none" or key in costs.codec_s:
        return costs
    costs = time_codecs(costs, [config.compression])
    print(describe_codecs(costs, [key]))
    return costs


def _row(p) -> dict:
    from polyrhythm.sim.compressed import settings_key

    return {**p.result.summary(), "samples_per_s": p.samples_per_s,
            "hosts_samples_per_s": p.result.samples_per_s, "cores_bound": p.cores_bound,
            "compression": settings_key(p.config.compression),
            "efficiency": p.efficiency, "measured_samples_per_s":
            p.measured, "error": p.error, "run_id": p.run_id}


def format_predictions(predictions) -> str:
    """The table `simulate` prints; a prediction its emulating machine's cores bound is
    starred, with what hosts of their own would do below."""
    lines = [f"{'strategy':<18} {'N':>5} {'S':>3} {'samples/s':>10} {'eff %':>6} "
             f"{'iter ms':>8} {'idle %':>6} {'stale':>6} {'max':>5} {'srv load %':>10} "
             f"{'measured':>9} {'error':>7}"]
    for p in predictions:
        r = p.result
        load = f"{100 * max(r.server_load):.0f}" if r.server_load else "-"
        measured = f"{p.measured:.0f}" if p.measured else "-"
        error = f"{100 * p.error:+.1f}%" if p.error is not None else "-"
        lines.append(f"{r.strategy:<18} {r.workers:>5} {r.servers:>3} "
                     f"{p.samples_per_s:>10.1f} {100 * p.efficiency:>6.0f} "
                     f"{1000 * r.iteration_s:>8.1f} {100 * r.idleness:>6.1f} "
                     f"{r.staleness_mean:>6.2f} {max(r.staleness, default=0):>5} "
                     f"{load:>10} {measured:>9} {error:>7}" + " *" * p.bound_by_cores)
    lines += [f"* run {p.run_id}'s emulated hosts shared this machine's cores, which allow "
              f"{p.cores_bound:.1f} samples/s (the fidelity guard: the CPU its hosts ran per "
              f"sample); as hosts of their own: {p.result.samples_per_s:.1f}"
              for p in predictions if p.bound_by_cores]
    return "\n".join(lines)
