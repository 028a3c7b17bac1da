"""The tabular models of the Strategy-Switch thesis's comparison of Spark MLlib with a
parameter server, as a polyrhythm job: linear regression on YearPredictionMSD, logistic
regression and the 28-15-15-2 perceptron on HIGGS.

    python examples/tabular.py --make-shaped higgs.csv.gz --rows 20000 --layout higgs
    polyrhythm run --strategy asp --workers 2 examples/tabular.py -- --data higgs.csv.gz
    polyrhythm run --strategy bsp --workers 2 examples/tabular.py -- --model mlp \\
        --data HIGGS.csv.gz --rows 500000 --optimizer adam
    python examples/tabular.py --model linear --data YearPredictionMSD.txt --optimizer adam

The data are the UCI Machine Learning Repository's files, as they come (comma-separated, no
header; gzip is read as is): HIGGS.csv.gz (the class, 0 or 1, then 28 features; 11 million
rows) and YearPredictionMSD.txt (the year, then 90 features; 515,345 rows), which comes
zipped (unzip YearPredictionMSD.txt.zip). Download them once yourself: this script never
fetches anything. `--rows` reads only a big file's first rows. `--make-shaped` writes a file
of either layout with a signal to learn, for a try without them.

The first column is the target, the rest the features; features (and the linear model's
target, the year) are standardised with the training rows' mean and deviation. The losses:
mean squared error on the standardised year (linear), binary cross-entropy on the logit
(logistic), cross-entropy over the 2 classes (mlp, sigmoid hidden layers as MLlib's
perceptron has). A seeded tenth of the rows is held out; each epoch logs its val_loss (and
val_accuracy for the classifiers; for linear, worker 0 prints val_rmse, in years).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import polyrhythm as pr
from polyrhythm.errors import DataError, PolyrhythmError

LAYOUTS = {"higgs": 28, "msd": 90}  # features after the target column
VALIDATION_FRACTION = 0.1


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["linear", "logistic", "mlp"], default="logistic")
    parser.add_argument("--data", help="a CSV file in the UCI layout (.gz read as is)")
    parser.add_argument("--rows", type=int,
                        help="read only the first ROWS rows (with --make-shaped: rows to write)")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    parser.add_argument("--lr", type=float, help="learning rate (default 0.1 sgd, 0.01 adam)")
    parser.add_argument("--batch", type=int, default=64, help="rows per worker and step")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--save", help="the run's final model's state_dict goes here (job.save)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the model, the held-out rows and --make-shaped's data")
    parser.add_argument("--make-shaped", metavar="FILE",
                        help="write a synthetic file of --layout's shape to FILE and stop")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="higgs")
    args = parser.parse_args(argv)
    if args.make_shaped is None and args.data is None:
        parser.error("give --data FILE (or --make-shaped FILE to write one)")
    for name in ("rows", "batch", "epochs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be at least 1, not {value}")
    if args.lr is None:
        args.lr = 0.1 if args.optimizer == "sgd" else 0.01
    return args


# -- the data ----------------------------------------------------------------------------

def make_shaped(path: str, rows: int, layout: str, seed: int) -> None:
    """A file of the layout's shape whose target follows its features: for HIGGS a class
    from a noisy nonlinear score, for YearPredictionMSD a year (1922-2011) linear in the
    features plus noise. Features come at several scales, as the real ones do."""
    rng = np.random.default_rng(seed)
    width = LAYOUTS[layout]
    features = rng.normal(size=(rows, width)) * rng.uniform(0.5, 5.0, size=width)
    score = (features / features.std(0)) @ rng.normal(size=width) / np.sqrt(width)
    noise = rng.normal(scale=0.3, size=rows)
    if layout == "higgs":
        target = (score + 0.5 * np.tanh(2 * score) + noise > 0).astype(float)
    else:
        target = np.clip(np.round(1998 + 8 * (score + noise)), 1922, 2011)
    np.savetxt(path, np.column_stack([target, features]), delimiter=",", fmt="%.6g")


def read_table(path: str, rows: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The target column and the features of a UCI-layout CSV file (one line if unreadable)."""
    if not Path(path).is_file():
        raise DataError(f"no data file {path!r}")
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.float64, max_rows=rows, ndmin=2)
    except (ValueError, OSError, EOFError) as exc:  # a bad number, a broken gzip stream
        raise DataError(f"{path}: not a comma-separated table of numbers ({exc})") from None
    if table.shape[0] < 10 or table.shape[1] < 2:
        raise DataError(f"{path}: {table.shape[0]} rows of {table.shape[1]} columns; a target "
                        "column and feature columns, at least 10 rows, are needed")
    return table[:, 0], table[:, 1:]


def datasets(args):
    """Training and validation sets (a seeded tenth held out), standardised by the training
    rows; the target's deviation (to give the linear model's error in years)."""
    target, features = read_table(args.data, args.rows)
    if args.model != "linear" and not np.isin(target, (0.0, 1.0)).all():
        raise DataError(f"{args.data}: the {args.model} model needs classes 0 and 1 in the "
                        "first column (HIGGS's layout); use --model linear for a number")
    order = np.random.default_rng(args.seed).permutation(len(target))
    held = max(1, int(len(target) * VALIDATION_FRACTION))
    train, validation = order[held:], order[:held]
    mean, deviation = features[train].mean(0), features[train].std(0)
    features = (features - mean) / np.where(deviation > 0, deviation, 1.0)
    target_scale = 1.0
    if args.model == "linear":
        target_scale = target[train].std() or 1.0
        target = (target - target[train].mean()) / target_scale
    x = torch.tensor(features, dtype=torch.float32)
    y = (torch.tensor(target, dtype=torch.float32) if args.model == "linear"
         else torch.tensor(target, dtype=torch.long))
    sets = [torch.utils.data.TensorDataset(x[rows], y[rows]) for rows in (train, validation)]
    return *sets, target_scale


# -- the models --------------------------------------------------------------------------

def build(args, features: int):
    """The model (the same on every worker: seeded) and its optimizer."""
    torch.manual_seed(args.seed)
    if args.model == "mlp":  # 28-15-15-2 on HIGGS: two hidden layers of 15, two classes
        model = nn.Sequential(nn.Linear(features, 15), nn.Sigmoid(), nn.Linear(15, 15),
                              nn.Sigmoid(), nn.Linear(15, 2))
    else:  # one output: the year (linear) or the logit of class 1 (logistic)
        model = nn.Linear(features, 1)
    optimizer = (torch.optim.SGD(model.parameters(), lr=args.lr) if args.optimizer == "sgd"
                 else torch.optim.Adam(model.parameters(), lr=args.lr))
    return model, optimizer


def loss_of(kind: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if kind == "linear":
        return F.mse_loss(output.squeeze(1), target)
    if kind == "logistic":
        return F.binary_cross_entropy_with_logits(output.squeeze(1), target.float())
    return F.cross_entropy(output, target)


@torch.no_grad()
def validate(kind: str, model: nn.Module, validation, target_scale: float) -> dict[str, float]:
    x, y = validation.tensors
    output = model(x)
    figures = {"val_loss": float(loss_of(kind, output, y))}
    if kind == "linear":
        figures["val_rmse"] = figures["val_loss"] ** 0.5 * target_scale
    else:
        predicted = (output.squeeze(1) > 0).long() if kind == "logistic" else output.argmax(1)
        figures["val_accuracy"] = float((predicted == y).float().mean())
    return figures


def main(args: argparse.Namespace) -> None:
    train_set, validation, target_scale = datasets(args)  # before joining: errors end it all
    job = pr.init()
    model, opt = build(args, train_set.tensors[0].shape[1])
    model, opt = job.wrap(model, opt)
    batches = job.loader(train_set, batch_size=args.batch)
    for epoch in job.epochs(args.epochs):
        for x, y in batches:
            job.backward(loss_of(args.model, model(x), y))
            opt.step()
            opt.zero_grad()
        figures = validate(args.model, model, validation, target_scale)
        job.log(**figures)
        if job.worker == 0:
            print(f"epoch {epoch + 1} " + " ".join(f"{k} {v:.4f}" for k, v in figures.items()),
                  flush=True)
    job.finish(evaluate=lambda final: validate(args.model, final, validation, target_scale))
    if args.save:
        job.save(args.save)  # the run's final model, written once


if __name__ == "__main__":
    options = arguments()
    try:
        if options.make_shaped:
            make_shaped(options.make_shaped, options.rows or 10_000, options.layout,
                        options.seed)
        else:
            main(options)
    except PolyrhythmError as error:
        sys.exit(f"tabular: error: {error}")
