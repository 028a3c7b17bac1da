"""`polyrhythm strategies`, `datasets`, `models` and `compressors`: each component with its
summary and source (a model also with its size), then its parameters, indented, with their
defaults (the compressors' shared ones after them). From the declarations alone."""

from __future__ import annotations

import argparse

from polyrhythm.cli.flags import default_text, usage
from polyrhythm.config import COMPONENTS, load_config
from polyrhythm.config.servers import CONTINUE
from polyrhythm.config.spark import on_spark
from polyrhythm.errors import ConfigError

COMMANDS = {"strategies": "strategy", "datasets": "data", "models": "model",
            "compressors": "compression"}


def add_parser(commands) -> None:
    for command, section in COMMANDS.items():
        kind = COMPONENTS[section].registry.kind
        commands.add_parser(command, help=f"list the {command} and their parameters",
                            description=f"Every registered {kind}, its source and its "
                            "parameters with their defaults.")


def run(args: argparse.Namespace) -> int:
    kind = COMPONENTS[COMMANDS[args.command]]
    registry = kind.registry
    width = max([20, *(len(usage(p)) for c in registry.values() for p in c.params)])
    sized = args.command == "models"
    for component in registry.values():
        source = f" [{component.source}]" if component.source else ""
        size = f"{model_size(component.parameters)}  " if sized else ""
        print(f"{component.name:<17} {size}{component.summary}{source}")
        for p in component.params:
            print(f"    {usage(p):<{width}} {p.help}{default_text(p)}")
        if args.command == "strategies":
            print(f"    {'a worker lost':<{width}} {after_a_loss(component.name)}")
    if sized:
        print("(parameter counts and float32 sizes for a 3x32x32 sample and 10 classes)")
    if args.command == "compressors":  # what every compressor reads
        print("every compressor:")
        for p in kind.shared:
            print(f"    {usage(p):<{width}} {p.help}{default_text(p)}")
    return 0


def after_a_loss(strategy: str, workers: int = 4) -> str:
    """What a run of `strategy` (its defaults, `workers` workers) does when a worker is lost
    during training (on_worker_failure), as its config resolves it."""
    config = load_config(strategy=strategy, workers=workers)
    fails = "the run fails, naming it" + (" (a Spark run is started afresh)" if on_spark(config)
                                          else "; --resume goes on from the last checkpoint")
    try:
        load_config(strategy=strategy, workers=workers, on_worker_failure=CONTINUE)
    except ConfigError:  # continue refused: every worker waits for the others
        return f"{fails}: every worker waits for the others"
    if config.on_worker_failure == CONTINUE:
        return "the others go on without it (on_worker_failure = continue, the default)"
    if not config.servers:
        how = ("the others regroup from the step it was found gone: their sums, averages "
               "and rings over the workers left, their gossip and tree neighbours without it "
               "(worker 0 records the run: its loss still fails it)")
    elif config.strategy.name == "switch":
        how = ("the others sum over themselves until the switch, and the servers go on "
               "without it after")
    else:
        how = "the others go on"
    return f"{fails} (abort, the default); with --on-worker-failure continue {how}"


def model_size(parameters: int | None) -> str:
    """A model's declared parameter count and float32 size, ' 0.27 M parameters,   1.1 MB'
    (aligned), or as many blanks when it declares none."""
    if parameters is None:
        return " " * len(model_size(0))
    return f"{parameters / 1e6:>5.2f} M parameters, {4 * parameters / 1e6:>5.1f} MB"
