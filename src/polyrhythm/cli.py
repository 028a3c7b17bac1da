"""The `polyrhythm` command: train | runs | strategies | sweep | compare | report."""

from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path
from typing import Any

from polyrhythm.config import RunConfig, load_toml
from polyrhythm.errors import ConfigError, PolyrhythmError
from polyrhythm.metrics.store import RunStore
from polyrhythm.records import STORE_NAME, summary_json_line
from polyrhythm.sweep import (
    COMPARE_EPOCHS,
    COMPARE_STRATEGIES,
    compare_sweep,
    count,
    format_outcome,
    format_plan,
    load_sweep,
    outcome_json,
    report_sweep,
    report_target,
    report_writer,
    run_sweep,
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits with 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


_METAVARS = {"data_path": "PATH", "out": "DIR"}


def _add_config_flags(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """One flag per RunConfig field (--batch-size for batch_size), typed from the model."""
    for name, field in RunConfig.model_fields.items():
        if name in exclude:
            continue
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


def _config_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig fields given as flags (those a command has and the user set)."""
    return {name: value for name in RunConfig.model_fields
            if (value := getattr(args, name, None)) is not None}


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
    _add_sweep_commands(commands)
    return parser


def _add_sweep_commands(commands) -> None:
    sweep = commands.add_parser(
        "sweep", help="run a grid of configs x repeats from a sweep file (resumable)",
        description="Run every point of a sweep file's grid, `repeats` times each, skipping "
        "the runs an earlier start of the same sweep completed. See README: Sweeps.")
    sweep.add_argument("file", metavar="FILE.toml", help="sweep file: name, repeats, [base], "
                       "[grid]")
    sweep.add_argument("--out", metavar="DIR", help="runs directory (default: base.out or runs)")
    sweep.add_argument("--id", dest="sweep_id", metavar="ID",
                       help="sweep id (default: the slug of the file's name)")
    sweep.add_argument("--dry-run", action="store_true",
                       help="check every point and list the runs; run nothing")
    sweep.add_argument("--json", action="store_true",
                       help="print the outcome as one JSON object on the last line")
    compare = commands.add_parser(
        "compare", help="train the same job with several strategies and report",
        description="A sweep over --strategies sharing one config (the train flags).")
    compare.add_argument("--strategies", metavar="A,B,...",
                         default=",".join(COMPARE_STRATEGIES),
                         help=f"strategies to compare (default: {','.join(COMPARE_STRATEGIES)})")
    compare.add_argument("--repeats", type=int, default=1, metavar="N",
                         help="seeds per strategy: seed, seed+1, ... (default: 1)")
    compare.add_argument("--id", dest="sweep_id", metavar="ID",
                         help="sweep id (default: compare-<UTC time>); reuse one to resume")
    compare.add_argument("--config", metavar="FILE.toml", help="base config file; flags "
                         "override it")
    compare.add_argument("--json", action="store_true",
                         help="print the outcome as one JSON object on the last line")
    _add_config_flags(compare, exclude=("strategy",))
    for action in compare._actions:  # compare's own default: 5 strategies in a few minutes
        if action.dest == "epochs":
            action.help = f"passes over the training set (default: {COMPARE_EPOCHS})"
    report = commands.add_parser(
        "report", help="write a report of runs, a sweep or the latest sweep/comparison")
    report.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs to report on")
    report.add_argument("--sweep", metavar="SWEEP_ID", help="the completed runs of a sweep")
    report.add_argument("--latest", action="store_true",
                        help="the last sweep or comparison started")
    report.add_argument("--format", choices=("html", "md", "tensorboard"), default="html",
                        help="report format (default: html); tensorboard: event files to view "
                        "with `tensorboard --logdir`")
    report.add_argument("--out", default="runs", metavar="DIR",
                        help="runs directory (default: runs); the report goes to "
                        "DIR/reports/<name>/")


def _train(args: argparse.Namespace) -> int:
    from polyrhythm.api import train

    summary = train(args.config, show_progress=sys.stderr.isatty(), **_config_flags(args))
    if args.json:
        print(summary_json_line(summary))
    else:
        print(format_summary(summary))
    return 0


def format_summary(s: dict) -> str:
    """A few human lines about a finished run."""
    lines = [f"run {s['run_id']}: {s['status']}  ({s['strategy']}, "
             f"{count(s['workers'], 'worker')}, {count(s['servers'], 'server')}, "
             f"{count(s['epochs'], 'epoch')})"]
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


def _runs(args: argparse.Namespace) -> int:
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


def _sweep(args: argparse.Namespace) -> int:
    sweep = load_sweep(args.file, sweep_id=args.sweep_id, out=args.out)
    if args.dry_run:
        print(format_plan(sweep))
        return 0
    return _run_sweep(sweep, args.json)


def _run_sweep(sweep, as_json: bool) -> int:
    outcome = run_sweep(sweep)
    report_sweep(outcome)
    print(outcome_json(outcome) if as_json else format_outcome(outcome))
    return 0 if outcome.completed == len(outcome.plan) else 1


def _compare(args: argparse.Namespace) -> int:
    base = (load_toml(args.config) if args.config else {}) | _config_flags(args)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    sweep = compare_sweep(base, strategies, repeats=args.repeats, sweep_id=args.sweep_id)
    return _run_sweep(sweep, args.json)


def _report(args: argparse.Namespace) -> int:
    chosen = sum([bool(args.run_ids), args.sweep is not None, args.latest])
    if chosen != 1:
        raise ConfigError("give run ids, --sweep SWEEP_ID or --latest (one of them)")
    name, title, run_ids = report_target(args.out, args.run_ids, args.sweep, args.latest)
    write, why = report_writer()
    if write is None:
        raise PolyrhythmError(f"no report: {why}")
    path = write(Path(args.out) / STORE_NAME, run_ids, Path(args.out) / "reports" / name, title,
                 fmt=args.format)
    print(path)
    return 0


COMMANDS = {"train": _train, "runs": _runs, "strategies": _strategies, "sweep": _sweep,
            "compare": _compare, "report": _report}


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
