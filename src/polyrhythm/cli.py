"""The `polyrhythm` command: train | runs | strategies."""

from __future__ import annotations

import argparse
import json
import sys
import typing
from typing import Any

from polyrhythm.config import RunConfig
from polyrhythm.errors import PolyrhythmError
from polyrhythm.metrics.store import RunStore
from polyrhythm.records import STORE_NAME, summary_json_line


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits with 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


_METAVARS = {"data_path": "PATH", "out": "DIR"}


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field (--batch-size for batch_size), typed from the model."""
    for name, field in RunConfig.model_fields.items():
        annotation = str(field.annotation)
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, default=None,
                                action=argparse.BooleanOptionalAction,
                                help=f"{field.description}{_default_text(field)}")
            continue
        kwargs: dict[str, Any] = {"dest": name, "default": None, "type": _kind(field),
                                  "metavar": _metavar(name, field),
                                  "help": f"{field.description}{_default_text(field)}"}
        if annotation.startswith("list["):
            kwargs["nargs"] = "+"
        parser.add_argument(flag, **kwargs)


def _kind(field) -> type:
    annotation = str(field.annotation)
    return float if "float" in annotation else int if "int" in annotation else str


def _metavar(name: str, field) -> str:
    return _METAVARS.get(name) or {int: "N", float: "X", str: "NAME"}[_kind(field)]


def _default_text(field) -> str:
    if field.default_factory is not None or field.default in (None, []):
        return ""
    return f" (default: {field.default})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="polyrhythm", description="Distributed data-parallel training with "
                     "parameter servers, all-reduce and more.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = commands.add_parser("train", help="train one job on this machine")
    train.add_argument("--config", metavar="FILE.toml", help="config file; flags override it")
    train.add_argument("--json", action="store_true",
                       help="print the summary as one JSON object on the last line")
    _add_config_flags(train)
    runs = commands.add_parser("runs", help="list stored runs")
    runs.add_argument("--out", default="runs", help="runs directory (default: runs)")
    runs.add_argument("--json", action="store_true", help="one JSON object per run")
    commands.add_parser("strategies", help="list the strategies and their parameters")
    return parser


def _train(args: argparse.Namespace) -> int:
    from polyrhythm.api import train

    overrides = {name: getattr(args, name) for name in RunConfig.model_fields
                 if getattr(args, name) is not None}
    summary = train(args.config, show_progress=sys.stderr.isatty(), **overrides)
    if args.json:
        print(summary_json_line(summary))
    else:
        print(format_summary(summary))
    return 0


def format_summary(s: dict) -> str:
    """A few human lines about a finished run."""
    lines = [f"run {s['run_id']}: {s['status']}  ({s['strategy']}, "
             f"{_count(s['workers'], 'worker')}, {_count(s['servers'], 'server')}, "
             f"{_count(s['epochs'], 'epoch')})"]
    for e in s.get("epoch_metrics", []):
        lines.append(f"  epoch {e['epoch'] + 1}: train loss {e['train_loss']:.4f}  "
                     f"val loss {e['val_loss']:.4f}  val acc {e['val_accuracy']:.4f}  "
                     f"{e['samples_per_s']:.0f} samples/s")
    lines.append(f"  final validation accuracy {s['final_val_accuracy']:.4f}, loss "
                 f"{s['final_val_loss']:.4f}; {s['samples_per_s']:.0f} samples/s; "
                 f"{s['wall_s']:.1f} s")
    lines.append(f"  weight updates {s['weight_updates']}; staleness mean "
                 f"{s['staleness_mean']:.2f}, max {s['staleness_max']}")
    lines.append(f"  stored in {s['run_dir']}")
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _runs(args: argparse.Namespace) -> int:
    from pathlib import Path

    rows = RunStore(Path(args.out) / STORE_NAME).runs()
    if args.json:
        for r in rows:
            print(json.dumps({k: v for k, v in r.items() if k not in ("config", "summary")}))
        return 0
    if not rows:
        print(f"no runs stored in {args.out}")
        return 0
    print(f"{'run id':<36} {'status':<10} {'strategy':<16} {'N':>3} {'S':>3} {'ep':>3} "
          f"{'val acc':>8} {'samples/s':>10} {'wall s':>8}")
    for r in rows:
        acc = f"{r['final_val_accuracy']:.4f}" if r["final_val_accuracy"] is not None else "-"
        sps = f"{r['samples_per_s']:.0f}" if r["samples_per_s"] is not None else "-"
        wall = f"{r['wall_s']:.1f}" if r["wall_s"] is not None else "-"
        print(f"{r['run_id']:<36} {r['status']:<10} {r['strategy']:<16} {r['workers']:>3} "
              f"{r['servers']:>3} {r['epochs']:>3} {acc:>8} {sps:>10} {wall:>8}")
    return 0


def _strategies(args: argparse.Namespace) -> int:
    from polyrhythm.strategies import STRATEGIES

    fields = RunConfig.model_fields
    for spec in STRATEGIES.values():
        print(f"{spec.name:<17} {spec.summary}")
        for name in spec.parameters:
            flag = f"--{name.replace('_', '-')} {_metavar(name, fields[name])}"
            # Descriptions start with the strategies they concern ("ssp: ..."): known here.
            about = fields[name].description.split(": ", 1)[-1]
            print(f"    {flag:<20} {about}{_default_text(fields[name])}")
    return 0


COMMANDS = {"train": _train, "runs": _runs, "strategies": _strategies}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except PolyrhythmError as exc:
        print(f"polyrhythm: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("polyrhythm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
