"""`polyrhythm advise`: which strategy and how many servers, for this model on these hosts
(sim/advise.py)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from polyrhythm.errors import ConfigError
from polyrhythm.units import duration

DEFAULT_EPOCH_SAMPLES = 50_000  # CIFAR-10's training set


def add_parser(commands) -> None:
    adv = commands.add_parser(
        "advise", help="rank strategies and server counts for a model on a cluster",
        description="Simulate every strategy and server layout that fits the hosts (a worker "
        "on each; servers on worker hosts or on hosts of their own), rank them by predicted "
        "time per epoch, flag those whose staleness is known to cost accuracy (from the "
        "store's runs where there are any), and recommend one with its expected error.")
    adv.add_argument("--hosts", type=int, required=True, metavar="N", help="machines")
    adv.add_argument("--bandwidth", metavar="RATE", default="1gbit",
                     help="each host's link, one rate or one per host, comma-separated "
                     "(default: 1gbit)")
    adv.add_argument("--latency", metavar="DURATION", default="0ms",
                     help="one-way latency of a message (default: 0ms)")
    adv.add_argument("--cpu", metavar="SHARES", help="each host's CPU share in cores, "
                     "comma-separated: 1,1,0.5 (a host at half speed computes twice as long)")
    adv.add_argument("--model", default="cnn", metavar="NAME",
                     help="a registered model (default: cnn)")
    adv.add_argument("--model-mb", type=float, metavar="MB", help="or the model's size in MB")
    adv.add_argument("--worker-batch-size", type=int, default=32, metavar="N",
                     help="samples per worker and step (default: 32)")
    adv.add_argument("--compute-time", metavar="DURATION", help="one step's forward and "
                     "backward on one host (default: measured here, on one core)")
    adv.add_argument("--calibrate", metavar="RUN_ID", help="take compute times and the "
                     "server update cost from this stored run (under --out)")
    adv.add_argument("--epoch-samples", type=int, default=DEFAULT_EPOCH_SAMPLES, metavar="N",
                     help=f"samples per epoch (default: {DEFAULT_EPOCH_SAMPLES:,})")
    adv.add_argument("--out", default="runs", metavar="DIR",
                     help="the store whose runs tell what staleness costs (default: runs)")
    adv.add_argument("--json", action="store_true",
                     help="print the ranking as JSON on the last line")


def run(args: argparse.Namespace) -> int:
    from polyrhythm.sim import Costs
    from polyrhythm.sim.advise import VALIDATED_ERROR, advise, recommend

    if args.hosts < 2:
        raise ConfigError(f"--hosts must be at least 2, got {args.hosts}")
    if args.epoch_samples < 1:
        raise ConfigError(f"--epoch-samples must be at least 1, got {args.epoch_samples}")
    costs = Costs.estimated(args.model, args.model_mb)
    parameters = costs.parameters
    error = VALIDATED_ERROR
    base = {"worker_batch_size": args.worker_batch_size, "compute": "emulated",
            "bandwidth": args.bandwidth.split(","), "latency": args.latency,
            "model": args.model, "out": args.out}
    if args.cpu:
        base["cpu"] = _shares(args.cpu)
    if args.calibrate:
        from polyrhythm.sim.calibrate import calibrate
        from polyrhythm.sim.study import predict_runs

        cal = calibrate(args.out, args.calibrate)
        # The run's costs, its update time scaled to this model's size.
        costs = replace(cal.costs, parameters=parameters,
                        update_s=cal.costs.update_s * parameters / cal.costs.parameters)
        error = max(VALIDATED_ERROR / 2, abs(predict_runs([cal])[0].error or 0.0))
        base["compute_time"] = "1s"  # replaced by the run's measured times
    else:
        seconds = (duration(args.compute_time, "--compute-time") if args.compute_time
                   else measure_compute(args.model, args.worker_batch_size))
        base["compute_time"] = f"{seconds * 1000:.3f}ms"
        how = "given" if args.compute_time else "measured here, on one core"
        print(f"compute {seconds * 1000:.1f} ms a step of {args.worker_batch_size} "
              f"({how}); model {parameters:,} parameters")
    ranked = advise(base, costs, args.hosts, out=args.out)
    print(format_ranking(ranked, args.epoch_samples))
    print(recommend(ranked, error))
    if args.json:
        print(json.dumps([{"option": o.label, **o.fields, "samples_per_s": o.samples_per_s,
                           "epoch_s": o.epoch_s(args.epoch_samples),
                           "staleness_mean": o.staleness, "flag": o.flag} for o in ranked]))
    return 0


def _shares(text: str) -> list[float]:
    """--cpu's shares: positive numbers, comma-separated."""
    try:
        shares = [float(c) for c in text.split(",")]
    except ValueError:
        shares = []
    if not shares or min(shares) <= 0:
        raise ConfigError(f"--cpu takes positive numbers, comma-separated, got {text!r}")
    return shares


def format_ranking(ranked, epoch_samples: int) -> str:
    lines = [f"{'#':>2}  {'option':<44} {'samples/s':>10} {'epoch s':>9} {'stale':>6}  flag"]
    for i, o in enumerate(ranked, 1):
        lines.append(f"{i:>2}  {o.label:<44} {o.samples_per_s:>10.1f} "
                     f"{o.epoch_s(epoch_samples):>9.1f} {o.staleness:>6.2f}  {o.flag}")
    return "\n".join(lines)


def measure_compute(model: str, batch: int, steps: int = 5) -> float:
    """Seconds of one forward and backward of `model` on a batch of 32x32 images, on one
    core of this machine (the median of a few steps after a first)."""
    import time

    import torch
    import torch.nn.functional as F

    from polyrhythm.models.build import build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        net = build_model(model, (3, 32, 32), 10, seed=0)
        x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
        times = []
        for _ in range(steps + 1):
            began = time.perf_counter()
            net.zero_grad()
            F.cross_entropy(net(x), y).backward()
            times.append(time.perf_counter() - began)
    finally:
        torch.set_num_threads(threads)
    return sorted(times[1:])[len(times[1:]) // 2]
