"""`polyrhythm run`: a user's training script (one that calls polyrhythm.init()) as a job on
this machine."""

from __future__ import annotations

import argparse

from polyrhythm.cli.flags import add_config_flags, config_flags
from polyrhythm.cli.train import format_summary, resumed, start_forkserver
from polyrhythm.config import load_config
from polyrhythm.errors import ConfigError
from polyrhythm.metrics.records import summary_json_line


def add_parser(commands) -> None:
    run = commands.add_parser(
        "run", help="run your own training script as a job on this machine",
        description="Run SCRIPT (a PyTorch script that calls polyrhythm.init() and "
        "job.wrap(model, opt)) as every rank of a job, on loopback or, with --hosts, on an "
        "emulated cluster: the flags set the strategy, workers, servers, cluster and the "
        "rest; the script's own model, data, loss and optimizer are trained. "
        "Arguments after SCRIPT (or after --) go to the script.")
    run.add_argument("--config", metavar="FILE.toml", help="config file; flags override it")
    run.add_argument("--json", action="store_true",
                     help="print the summary as one JSON object on the last line")
    run.add_argument("--resume", metavar="RUN_ID", help="carry on this failed or "
                     "interrupted script run (under --out) from its last checkpoint, in the "
                     "same record: its script, with its arguments, from the folder it ran in "
                     "(no SCRIPT here), its job.epochs(n) going on after the last epoch done; "
                     "--servers and --checkpoint-every may change")
    run.add_argument("script", metavar="SCRIPT", nargs="?", help="the training script")
    run.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...",
                     help="arguments for the script")
    add_config_flags(run)


def run(args: argparse.Namespace) -> int:
    if args.resume:
        if args.script or args.script_args:
            raise ConfigError("--resume starts the run's own script with its own arguments: "
                              "drop SCRIPT and what follows it")
        start_forkserver(scripts=True)
        from polyrhythm.api import resume_script

        return resumed(args, resume_script)
    if args.script is None:
        raise ConfigError("polyrhythm run needs SCRIPT (or --resume RUN_ID)")
    config = load_config(args.config, **config_flags(args))  # bad input fails before torch
    if not config.cluster.hosts:
        start_forkserver(scripts=True)
    from polyrhythm.api import run_script

    script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
    summary = run_script(args.script, script_args, config)
    print(summary_json_line(summary) if args.json else format_summary(summary))
    return 0
