"""`polyrhythm shard`: split a data set across workers as a run would, without training, and
show each worker's share (a table; `--plot` draws the per-worker class histograms)."""

from __future__ import annotations

import argparse
from pathlib import Path

from polyrhythm.cli.flags import add_config_flags, config_flags
from polyrhythm.config import load_config
from polyrhythm.errors import ConfigError
from polyrhythm.sweep import count

MAX_CLASS_COLUMNS = 20  # more classes: their counts' range instead of one column each


def add_parser(commands) -> None:
    shard = commands.add_parser(
        "shard", help="split a data set across workers without training and show the shards",
        description="Run the splitter a training run would (--sharding, --workers, --seed, "
        "the data set's flags) and print, per worker: its examples, the copies it shares "
        "with others, its examples per class, its imbalance (largest class share over "
        "smallest) and the distance of its class mix from the whole training set's (total "
        "variation: 0 is the same mix).")
    shard.add_argument("--config", metavar="FILE.toml", help="config file; flags override it")
    shard.add_argument("--plot", metavar="FILE.png", help="also draw the per-worker class "
                       "histograms to this PNG file")
    add_config_flags(shard)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, **config_flags(args))
    if args.plot and Path(args.plot).suffix.lower() != ".png":
        raise ConfigError(f"--plot writes a PNG file: {args.plot!r} does not end in .png")
    from polyrhythm.runtime.job import plan_data

    plan = plan_data(config)
    print(format_shards(config, plan.summary()))
    if args.plot:
        _plot(args.plot, config, plan.summary())
    return 0


def format_shards(config, data: dict) -> str:
    shards = data["shards"]
    classes = len(shards[0]["class_counts"])
    lines = [f"{config.data.name}, {count(config.workers, 'worker')}, sharding "
             f"{data['sharding']} (seed {config.seed}): {data['train_examples']:,} training "
             f"examples, {data['val_examples']:,} validating; split in {data['split_s']:.2f} s"]
    per_class = ("examples per class" if classes <= MAX_CLASS_COLUMNS
                 else f"examples per class (min-max of {classes})")
    lines.append(f"{'worker':>6} {'examples':>8} {'copies':>6} {'imbalance':>9} "
                 f"{'distance':>8}  {per_class}")
    for s in shards:
        counts = s["class_counts"]
        shown = (" ".join(str(c) for c in counts) if classes <= MAX_CLASS_COLUMNS
                 else f"{min(counts)}-{max(counts)}")
        imbalance = "inf" if s["imbalance"] is None else f"{s['imbalance']:.3f}"
        lines.append(f"{s['worker']:>6} {s['examples']:>8,} {s['copies']:>6,} "
                     f"{imbalance:>9} {s['distance']:>8.4f}  {shown}")
    return "\n".join(lines)


def _plot(path: str, config, data: dict) -> None:
    import matplotlib

    from polyrhythm.report.plot import STYLE, png
    from polyrhythm.report.shards import shard_figure

    heading = (f"{config.data.name}: {data['sharding']} sharding over "
               f"{count(config.workers, 'worker')} (seed {config.seed})")
    with matplotlib.rc_context(STYLE):
        image = png(shard_figure(data["shards"], heading))
    try:
        Path(path).write_bytes(image)
    except OSError as exc:
        raise ConfigError(f"cannot write {path!r}: {exc.strerror}") from None
    print(f"wrote {path}")
