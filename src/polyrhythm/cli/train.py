"""`polyrhythm train`: train one job on this machine."""

from __future__ import annotations

import argparse
import sys

from polyrhythm.cli.flags import add_config_flags, config_flags
from polyrhythm.config import load_config
from polyrhythm.errors import ConfigError
from polyrhythm.metrics.records import summary_json_line
from polyrhythm.sweep import count


def add_parser(commands) -> None:
    train = commands.add_parser("train", help="train one job on this machine")
    train.add_argument("--config", metavar="FILE.toml", help="config file; flags override it")
    train.add_argument("--json", action="store_true",
                       help="print the summary as one JSON object on the last line")
    train.add_argument("--resume", metavar="RUN_ID", help="carry on this failed or "
                       "interrupted run (under --out) from its last checkpoint, in the same "
                       "record; --servers, --epochs and --checkpoint-every may change")
    add_config_flags(train)


def run(args: argparse.Namespace) -> int:
    if args.resume:
        start_forkserver()
        from polyrhythm.api import resume

        return resumed(args, resume, show_progress=sys.stderr.isatty())
    config = load_config(args.config, **config_flags(args))  # bad input fails before torch
    if not config.cluster.hosts:
        start_forkserver()
    from polyrhythm.api import train

    summary = train(config, show_progress=sys.stderr.isatty())
    print(summary_json_line(summary) if args.json else format_summary(summary))
    return 0


def start_forkserver(scripts: bool = False) -> None:
    """A local run's ranks' forkserver (for a script's ranks, or polyrhythm train's),
    started before this process imports torch, to import it at the same time
    (launch/process/forkserver.py)."""
    from polyrhythm.launch.process import forkserver

    forkserver.start(scripts)


def resumed(args: argparse.Namespace, resume, **options) -> int:
    """`--resume RUN_ID` (of train, or of run: `resume` is the API's for its runs): the run
    goes on with its own config, the flags given changing what they may; its summary."""
    flags = config_flags(args)
    out = flags.pop("out", "runs")
    if args.config:
        raise ConfigError("--resume takes the run's own config: drop --config")
    summary = resume(args.resume, out, say=lambda line: print(line, file=sys.stderr),
                     **options, **flags)
    print(summary_json_line(summary) if args.json else format_summary(summary))
    return 0


def format_summary(s: dict) -> str:
    """A few human lines about a finished run."""
    lines = [f"run {s['run_id']}: {s['status']}  ({s['strategy']}, "
             f"{count(s['workers'], 'worker')}, {count(s['servers'], 'server')}, "
             f"{count(s['epochs'], 'epoch')})"]
    for e in s.get("epoch_metrics", []):
        accuracy = e.get("val_accuracy")  # None: a loss without accuracy (mse)
        lines.append(f"  epoch {e['epoch'] + 1}: train loss {e['train_loss']:.4f}  "
                     f"val loss {e['val_loss']:.4f}  "
                     + (f"val acc {accuracy:.4f}  " if accuracy is not None else "")
                     + f"{e['samples_per_s']:.0f} samples/s"
                     + (f"  {e['phase']}" if e.get("phase") else ""))
    lines.append(f"  {final_line(s)}; {s['samples_per_s']:.0f} samples/s; {s['wall_s']:.1f} s")
    lines.append(f"  weight updates {s['weight_updates']}; staleness mean "
                 f"{s['staleness_mean']:.2f}, max {s['staleness_max']}")
    for lost in s.get("lost_workers", []):
        lines.append("  " + lost_line(lost))
    if "switch_rule" in s:
        lines.append("  " + switch_line(s))
    if compression := s.get("compression"):
        lines.append("  " + compression_line(compression))
    if cluster := s.get("cluster"):
        lines.append("  " + cluster_line(cluster))
    lines.append(f"  stored in {s['run_dir']}")
    return "\n".join(lines)


def final_line(s: dict) -> str:
    """The final model's figures; for a script that did not evaluate it (no
    job.finish(evaluate=...)), that they are unknown, and what worker 0 logged last of its
    own model."""
    if s.get("final_evaluated", True):
        accuracy = s.get("final_val_accuracy")
        return ("final validation " + (f"accuracy {accuracy:.4f}, " if accuracy is not None
                                       else "") + f"loss {s['final_val_loss']:.4f}")
    line = "final model not evaluated (job.finish(evaluate=...) evaluates it)"
    if logged := s.get("last_logged"):
        figures = ", ".join(f"{k.removeprefix('val_').replace('accuracy', 'acc')} {v:.4f}"
                            for k, v in logged.items() if k != "worker")
        line += f"; worker {logged['worker']} logged val {figures} last"
    return line


def cluster_line(cluster: dict) -> str:
    """The emulated cluster a run had and the fidelity guard's verdict, in one line."""
    hosts = cluster["hosts"]
    which = f"standing cluster {cluster['name']!r}" if cluster.get("name") else "emulated cluster"
    line = (f"{which} of {count(len(hosts), 'host')}; machine "
            f"{cluster['machine_busy']:.0%} busy: ")
    if cluster["emulator_bound"] is None:
        return line + "too short for the fidelity guard to judge (under half a second)"
    bound = [str(h["host"]) for h in hosts if h["emulator_bound"]]
    if bound:
        return line + (f"the emulator was the bottleneck on host {', '.join(bound)} (starved "
                       "of CPU its share promised): do not trust its timings")
    return line + "the emulator kept up"


def compression_line(c: dict) -> str:
    """What a run compressed with, its share of the dense bytes, and its encoding time."""
    feedback = "with error feedback" if c["error_feedback"] else "without error feedback"
    replies = ", replies too" if c["compress_replies"] else ""
    return (f"compressed by {c['compressor']} {feedback}{replies}: {c['dense_share']:.2%} of "
            f"the dense bytes a message; {c['compress_s']:.2f} s encoding and decoding on the "
            f"workers, {c['server_compress_s']:.2f} s on the servers")


def lost_line(lost: dict) -> str:
    """A worker the run went on without (on_worker_failure = continue)."""
    when = ("after its last message" if lost["at_s"] is None
            else f"at {lost['at_s']:.1f} s")
    did = (f"after {count(lost['pushes'], 'round')} with the others"
           if lost.get("counted") == "rounds"  # runtime/survivors.py's ROUNDS
           else f"having pushed {count(lost['pushes'], 'gradient')}")
    return f"worker {lost['worker']} was lost {when}, {did}; the others carried on without it"


def switch_line(s: dict) -> str:
    """When a switch run switched, why, how long the switch took and each phase's time."""
    (first, before), (then, after) = s["phase_s"].items()
    phases = f"{first} {before:.1f} s, {then} {after:.1f} s"
    if s["switch_epoch"] is None:
        return f"never switched (rule {s['switch_rule']}: {s['switch_why']}); {phases}"
    return (f"switched {first} -> {then} after epoch {s['switch_epoch']} (rule "
            f"{s['switch_rule']}: {s['switch_why']}) in {s['switch_s']:.3f} s; {phases}")
