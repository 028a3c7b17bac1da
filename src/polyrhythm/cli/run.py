"""`polyrhythm run`: a user's training script (one that calls polyrhythm.init()) as a job on
this machine."""

from __future__ import annotations

import argparse

from polyrhythm.cli.flags import add_config_flags, config_flags
from polyrhythm.cli.train import format_summary
from polyrhythm.config import load_config
from polyrhythm.metrics.records import summary_json_line


def add_parser(commands) -> None:
    run = commands.add_parser(
        "run", help="run your own training script as a job on this machine",
        description="Run SCRIPT (a PyTorch script that calls polyrhythm.init() and "
        "job.wrap(model, opt)) as every rank of a job: the flags set the strategy, workers, "
        "servers and the rest; the script's own model, data, loss and optimizer are trained. "
        "Arguments after SCRIPT (or after --) go to the script.")
    run.add_argument("--config", metavar="FILE.toml", help="config file; flags override it")
    run.add_argument("--json", action="store_true",
                     help="print the summary as one JSON object on the last line")
    run.add_argument("script", metavar="SCRIPT", help="the training script")
    run.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...",
                     help="arguments for the script")
    add_config_flags(run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, **config_flags(args))  # bad input fails before torch
    from polyrhythm.api import run_script

    script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
    summary = run_script(args.script, script_args, config)
    print(summary_json_line(summary) if args.json else format_summary(summary))
    return 0
