"""`polyrhythm strategies`, `datasets` and `models`: each component with its summary and
source, then its parameters, indented, with their defaults. From the declarations alone."""

from __future__ import annotations

import argparse

from polyrhythm.cli.flags import default_text, metavar
from polyrhythm.config import COMPONENTS

COMMANDS = {"strategies": "strategy", "datasets": "data", "models": "model"}


def add_parser(commands) -> None:
    for command, section in COMMANDS.items():
        kind = COMPONENTS[section].registry.kind
        commands.add_parser(command, help=f"list the {command} and their parameters",
                            description=f"Every registered {kind}, its source and its "
                            "parameters with their defaults.")


def run(args: argparse.Namespace) -> int:
    registry = COMPONENTS[COMMANDS[args.command]].registry
    width = max([20, *(len(f"{p.flag} {metavar(p)}") for c in registry.values()
                       for p in c.params)])
    for component in registry.values():
        source = f" [{component.source}]" if component.source else ""
        print(f"{component.name:<17} {component.summary}{source}")
        for p in component.params:
            flag = f"{p.flag} {metavar(p)}"
            print(f"    {flag:<{width}} {p.help}{default_text(p)}")
    return 0
