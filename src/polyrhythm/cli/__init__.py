"""The `polyrhythm` command. Each command is a module here with `add_parser(commands)` and
`run(args)`; a new command is a module and one line in COMMANDS."""

from __future__ import annotations

import os
import sys

from polyrhythm.cli import (
    advise,
    cluster,
    compare,
    listing,
    report,
    run,
    runs,
    shard,
    simulate,
    sweep,
    train,
)
from polyrhythm.cli.flags import Parser
from polyrhythm.errors import PolyrhythmError

# Command name -> its module (listing serves strategies, datasets and models).
COMMANDS = {"train": train, "run": run, "runs": runs, **dict.fromkeys(listing.COMMANDS, listing),
            "sweep": sweep, "compare": compare, "report": report, "cluster": cluster,
            "shard": shard, "simulate": simulate, "advise": advise}


def build_parser() -> Parser:
    parser = Parser(prog="polyrhythm", description="Distributed data-parallel training with "
                    "parameter servers, all-reduce and more.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in dict.fromkeys(COMMANDS.values()):
        module.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _command(argv)
    except BrokenPipeError:
        # The reader of our output is gone (`| head` read what it wanted): a normal end for a
        # command-line tool. What is still buffered can reach no one; sending the streams to
        # devnull keeps the interpreter's last flush from raising the same error again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            os.dup2(devnull, stream.fileno())
        os.close(devnull)
        return 128 + 13  # as a tool ended by SIGPIPE (13) exits, which Python ignores


def _command(argv: list[str] | None) -> int:
    """Parse and run one command; a user's mistake is one line on stderr and its exit code."""
    try:
        args = build_parser().parse_args(argv)
        code = COMMANDS[args.command].run(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except PolyrhythmError as exc:
        print(f"polyrhythm: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("polyrhythm: interrupted", file=sys.stderr)
        return 130
