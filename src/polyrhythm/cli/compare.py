"""`polyrhythm compare`: train the same job with several strategies, then report."""

from __future__ import annotations

import argparse

from polyrhythm.cli.flags import add_config_flags, config_flags, list_of
from polyrhythm.cli.sweep import run_and_report
from polyrhythm.config import flat_config, load_toml
from polyrhythm.sweep import COMPARE_EPOCHS, COMPARE_STRATEGIES, compare_sweep


def add_parser(commands) -> None:
    compare = commands.add_parser(
        "compare", help="train the same job with several strategies and report",
        description="A sweep over --strategies sharing one config (the train flags).")
    compare.add_argument("--strategies", metavar="NAME", **list_of(str),
                         help=f"strategies to compare (default: {','.join(COMPARE_STRATEGIES)})")
    compare.add_argument("--repeats", type=int, default=1, metavar="N",
                         help="seeds per strategy: seed, seed+1, ... (default: 1)")
    compare.add_argument("--id", dest="sweep_id", metavar="ID",
                         help="sweep id (default: compare-<UTC time>); reuse one to resume")
    compare.add_argument("--config", metavar="FILE.toml", help="base config file; flags "
                         "override it")
    compare.add_argument("--json", action="store_true",
                         help="print the outcome as one JSON object on the last line")
    add_config_flags(compare, exclude=("strategy",))
    for action in compare._actions:  # compare's own default: 5 strategies in a few minutes
        if action.dest == "epochs":
            action.help = f"passes over the training set (default: {COMPARE_EPOCHS})"


def run(args: argparse.Namespace) -> int:
    base = flat_config(load_toml(args.config) if args.config else {}, config_flags(args))
    strategies = list(COMPARE_STRATEGIES) if args.strategies is None else args.strategies
    sweep = compare_sweep(base, strategies, repeats=args.repeats, sweep_id=args.sweep_id)
    return run_and_report(sweep, args.json)
