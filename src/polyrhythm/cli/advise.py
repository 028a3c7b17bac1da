"""`polyrhythm advise`: which strategy, how many servers and which compressor, for this model
and data on these hosts (sim/advise.py)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from polyrhythm.cli.fault_flags import add_fault_flags, fault_schedule, going_on
from polyrhythm.cli.flags import add_component_flags, config_flags, list_of
from polyrhythm.compression import COMPRESSORS
from polyrhythm.errors import ConfigError
from polyrhythm.units import duration

# The compressors paired with each option unless told (--compressors), with their defaults.
COMPRESSORS_ADVISED = tuple(spec.name for spec in COMPRESSORS.values() if spec.advised)

DEFAULT_EPOCH_SAMPLES = 50_000  # CIFAR-10's training set
DEFAULT_BANDWIDTH = "1gbit"


def add_parser(commands) -> None:
    adv = commands.add_parser(
        "advise", help="rank strategies, server counts and compressors for a model on a "
        "cluster",
        description="Simulate every strategy and server layout that fits the hosts (a worker "
        "on each; servers on worker hosts or on hosts of their own), each with every "
        "compressor of --compressors, rank them by predicted time per epoch, flag those "
        "whose staleness or compression is known to cost accuracy (from the store's runs of "
        "the same model and data where there are any, naming them; else the documents' "
        "figures for staleness, and for a compressor that its cost is unknown), and "
        "recommend one with its expected error. The model is sized for --dataset's samples. "
        "Lists take spaces or commas: --cpu 1 1 0.5 or 1,1,0.5.")
    adv.add_argument("--hosts", type=int, required=True, metavar="N", help="machines")
    adv.add_argument("--bandwidth", metavar="RATE", help="each host's link: one rate, or one "
                     f"per host (default: {DEFAULT_BANDWIDTH})", **list_of(str))
    adv.add_argument("--latency", metavar="DURATION", default="0ms",
                     help="one-way latency of a message (default: 0ms)")
    adv.add_argument("--cpu", metavar="CORES", help="each host's CPU share in cores: one, or "
                     "one per host (a host at half speed computes twice as long)",
                     **list_of(float))
    add_component_flags(adv, "model")
    adv.add_argument("--model-mb", type=float, metavar="MB", help="or the model's size in MB "
                     "(no matrices: PowerSGD then sends its values as they are)")
    add_component_flags(adv, "data", shared=False)
    adv.add_argument("--worker-batch-size", type=int, default=32, metavar="N",
                     help="samples per worker and step (default: 32)")
    adv.add_argument("--compute-time", metavar="DURATION", help="one step's forward and "
                     "backward on one host (default: measured here, on one core)")
    adv.add_argument("--calibrate", metavar="RUN_ID", help="take compute times, the "
                     "server update cost and, for its compressor, its encoding seconds from "
                     "this stored run (under --out)")
    adv.add_argument("--compressors", metavar="NAME", help="compressors to pair with each "
                     "option, with their default settings (default: "
                     f"{' '.join(COMPRESSORS_ADVISED)}; see `polyrhythm compressors`)",
                     **list_of(str))
    adv.add_argument("--epoch-samples", type=int, default=DEFAULT_EPOCH_SAMPLES, metavar="N",
                     help=f"samples per epoch (default: {DEFAULT_EPOCH_SAMPLES:,})")
    adv.add_argument("--out", default="runs", metavar="DIR",
                     help="the store whose runs tell what staleness and compression cost "
                     "(default: runs)")
    adv.add_argument("--json", action="store_true",
                     help="print the ranking as JSON on the last line")
    add_fault_flags(adv, min_workers=True)


def run(args: argparse.Namespace) -> int:
    from polyrhythm.cli.sizing import describe_codecs, model_values, time_codecs
    from polyrhythm.config import make_config, sectioned
    from polyrhythm.sim.advise import advise, options, recommend
    from polyrhythm.sim.compressed import settings_key
    from polyrhythm.sim.evidence import stored_runs

    if args.hosts < 2:
        raise ConfigError(f"--hosts must be at least 2, got {args.hosts}")
    if args.epoch_samples < 1:
        raise ConfigError(f"--epoch-samples must be at least 1, got {args.epoch_samples}")
    schedule = fault_schedule(args)
    given = sectioned(config_flags(args))
    job = {"model": given["model"], "data": given["data"], "out": args.out}  # every option's
    base = {**job, "worker_batch_size": args.worker_batch_size, "compute": "emulated",
            "bandwidth": args.bandwidth or [DEFAULT_BANDWIDTH], "latency": args.latency,
            **({"cpu": args.cpu} if args.cpu else {})}
    if schedule is not None:
        base = going_on({**base, **({"min_workers": args.min_workers}
                                    if args.min_workers is not None else {})})
    # The job and the hosts' settings checked (one line) before a step is timed.
    make_config({**base, **options(args.hosts)[0][1], "compute_time": "0ms"})
    names = list(dict.fromkeys(args.compressors or COMPRESSORS_ADVISED))
    compressions = [make_config({**job, "compress": name}).compression for name in names]
    config = make_config(job)
    parameters, shapes, sized = model_values(config, args.model_mb)
    costs, error, compute = _costs(args, config, parameters, shapes, base)
    costs = time_codecs(costs, compressions)
    print(f"{compute}; {sized}")
    runs = stored_runs(args.out, config.model.name, config.data.name)
    unranked: list[tuple[str, str]] = []
    ranked = advise(base, costs, args.hosts, runs=runs, compressors=names, schedule=schedule,
                    unranked=unranked)
    if schedule is not None:
        print(f"under faults: {schedule.describe()}; samples/s below are what each keeps")
        for label, why in unranked:
            print(f"  not ranked: {label}: it cannot go on without a lost worker ({why})")
    if not ranked:
        raise ConfigError("no option can go on without a lost worker under this schedule "
                          "(above): lower --min-workers, or give --compressors none")
    print(format_evidence(runs, ranked, f"{config.model.name} on {config.data.name}",
                          args.out))
    timed = describe_codecs(costs, [settings_key(c) for c in compressions])
    if timed:
        print(timed)
    print(format_ranking(ranked, args.epoch_samples))
    print(recommend(ranked, error))
    if args.json:
        print(json.dumps([{"option": o.label, **o.fields, "samples_per_s": o.samples_per_s,
                           "epoch_s": o.epoch_s(args.epoch_samples),
                           "staleness_mean": o.staleness, "flag": o.flag,
                           "caution": o.caution, "evidence": list(o.evidence),
                           **({"kept": o.kept} if o.kept is not None else {})}
                          for o in ranked]))
    return 0


def _costs(args, config, parameters: int, shapes, base: dict) -> tuple:
    """(costs, expected error, a line saying where the compute time comes from): a stored
    run's (--calibrate: its compression seconds too, for its compressor), else the time
    given or measured here; sets base's compute time."""
    from polyrhythm.cli.sizing import measure_compute
    from polyrhythm.sim import Costs
    from polyrhythm.sim.advise import VALIDATED_ERROR

    if args.calibrate:
        from polyrhythm.sim.calibrate import calibrate
        from polyrhythm.sim.study import predict_runs

        cal = calibrate(args.out, args.calibrate)
        # The run's costs, its update and compression times scaled to this model's size.
        scale = parameters / cal.costs.parameters

        def scaled(seconds: float | None) -> float | None:
            return None if seconds is None else seconds * scale

        costs = replace(cal.costs, parameters=parameters, shapes=[list(s) for s in shapes],
                        update_s=cal.costs.update_s * scale,
                        compress_s=scaled(cal.costs.compress_s),
                        server_compress_s=scaled(cal.costs.server_compress_s))
        error = max(VALIDATED_ERROR / 2, abs(predict_runs([cal])[0].error or 0.0))
        base["compute_time"] = "1s"  # replaced by the run's measured times
        encoding = (f", {costs.compressor} encoding seconds" if costs.compressor != "none"
                    else "")
        return costs, error, f"compute and update cost{encoding} of run {args.calibrate}"
    seconds = (duration(args.compute_time, "--compute-time") if args.compute_time
               else measure_compute(config, args.worker_batch_size))
    base["compute_time"] = f"{seconds * 1000:.3f}ms"
    how = "given" if args.compute_time else "measured here, on one core"
    return (Costs.estimated(parameters, shapes=shapes), VALIDATED_ERROR,
            f"compute {seconds * 1000:.1f} ms a step of {args.worker_batch_size} ({how})")


def format_evidence(runs, ranked, job: str, out: str) -> str:
    """Which of the store's runs of `job` the flags rest on, and what each showed; or that
    there were none, so the flags rest on the documents' figures (and a compressor's cost
    is unknown)."""
    documents = "the flags below rest on the documents' figures"
    if not runs:
        return (f"evidence: no completed run of {job} with real compute in the store under "
                f"{out}: {documents}")
    used = {run_id for o in ranked for run_id in o.evidence}
    lines = [f"evidence: {len(used)} of the {len(runs)} completed runs of {job} with real "
             f"compute in the store under {out}:"]
    for r in runs:
        shown = ("synchronous" if r.synchronous else "no synchronous run alike"
                 if r.points is None else f"{r.points:+.1f} points vs synchronous "
                 f"({r.baseline:.4f})")
        if r.compressor != "none":
            shown = f"{r.compressor}: " + (
                f"no uncompressed {r.strategy} run alike" if r.compression_points is None
                else f"{r.compression_points:+.1f} points vs uncompressed ({r.dense:.4f})")
        lines.append(f"  {'used' if r.run_id in used else 'not used':<8}  {r.run_id:<34} "
                     f"{r.strategy:<10} {r.workers:>3} workers {r.epochs:>3} epochs  "
                     f"val acc {r.accuracy:.4f}  {shown}")
    if not used:
        lines.append("  none judges an option: that takes an asynchronous run and a "
                     "synchronous one (or a compressed run and an uncompressed one of its "
                     "strategy) of the same workers, epochs and batch, with at least the "
                     f"option's workers; {documents}")
    return "\n".join(lines)


def format_ranking(ranked, epoch_samples: int) -> str:
    faults = any(o.kept is not None for o in ranked)
    lines = [f"{'#':>3}  {'option':<52} {'samples/s':>10} {'epoch s':>9} {'stale':>6}  "
             + ("kept   " if faults else "") + "flag"]
    for i, o in enumerate(ranked, 1):
        kept = f"{o.kept:>5.3f}  " if o.kept is not None else ""
        lines.append(f"{i:>3}  {o.label:<52} {o.samples_per_s:>10.1f} "
                     f"{o.epoch_s(epoch_samples):>9.1f} {o.staleness:>6.2f}  {kept}{o.flag}")
    return "\n".join(lines)
