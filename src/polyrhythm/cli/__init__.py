"""The `polyrhythm` command. Each command is a module here with `add_parser(commands)` and
`run(args)`; a new command is a module and one line in COMMANDS."""

from __future__ import annotations

import sys

from polyrhythm.cli import (
    advise,
    cluster,
    compare,
    listing,
    report,
    runs,
    shard,
    simulate,
    sweep,
    train,
)
from polyrhythm.cli.flags import Parser
from polyrhythm.errors import PolyrhythmError

# Command name -> its module (listing serves strategies, datasets and models).
COMMANDS = {"train": train, "runs": runs, **dict.fromkeys(listing.COMMANDS, listing),
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
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command].run(args)
    except PolyrhythmError as exc:
        print(f"polyrhythm: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("polyrhythm: interrupted", file=sys.stderr)
        return 130
