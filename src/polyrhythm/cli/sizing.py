"""The run's model as `simulate` and `advise` size it when no stored run calibrates it: built
for the data the run would use (its sample shape and classes, from the data set's source as
the run opens it), so its size is the run's; and one step of it timed on this machine. It
lives here, not in sim/, because building a model loads torch, which the simulator never
does (its import contract); the simulator gets the count as Costs.

Opening a source is cheap for every registered data set: the packaged ones read one small
file, synthetic data is generated, and CIFAR's shape and classes are known without reading
its archive. An npz file and a user's function are loaded whole, as a run would.
"""

from __future__ import annotations

from typing import NamedTuple

from polyrhythm.errors import ConfigError
from polyrhythm.sim.setup import BYTES


class ModelSize(NamedTuple):
    """The run's model on the run's data: its parameter count (float32 values), and the
    sample shape, classes and loss it was built for."""

    parameters: int
    shape: tuple[int, ...]
    classes: int
    loss: str = "cross_entropy"

    def describe(self, model: str, dataset: str) -> str:
        """`cnn on mnist5k (1x28x28, 10 classes): 105,866 parameters`; a loss of one output
        is named in place of the classes (`mlp on csv (90, loss mse): ...`)."""
        shape = "x".join(map(str, self.shape))
        target = (f"{self.classes} classes" if self.loss == "cross_entropy"
                  else f"loss {self.loss}")
        return f"{model} on {dataset} ({shape}, {target}): {self.parameters:,} parameters"


def data_shape(config) -> tuple[tuple[int, ...], int]:
    """The sample shape and class count of the data set `config` names (with its settings:
    --synthetic-shape, --labels ...). One-line errors for data that cannot be read."""
    from polyrhythm.data.datasets import open_source

    source = open_source(config.data, config.seed)
    return tuple(source.shape), source.classes


def model_size(config) -> ModelSize:
    """`config`'s model built for its data, counted as a run counts it (its summary's
    `parameters`). A model that does not fit the data is the one-line error a run gives."""
    from polyrhythm.models.build import build_model

    shape, classes = data_shape(config)
    model = build_model(config.model, shape, classes, seed=config.seed, loss=config.loss)
    return ModelSize(sum(p.numel() for p in model.parameters()), shape, classes, config.loss)


def model_parameters(config, mb: float | None = None) -> tuple[int, str]:
    """The values a simulation of `config` moves, and a line saying where the count comes
    from: a model of `mb` MB (float32) when given (--model-mb), else `config`'s model built
    for its data (model_size)."""
    if mb is not None:
        if not mb > 0:
            raise ConfigError(f"--model-mb must be positive, got {mb}")
        parameters = int(mb * 1e6 / BYTES)
        return parameters, f"model of {mb:g} MB (--model-mb): {parameters:,} parameters"
    size = model_size(config)
    return size.parameters, "model " + size.describe(config.model.name, config.data.name)


def measure_compute(config, batch: int, steps: int = 5) -> float:
    """Seconds of one forward and backward of `config`'s model on a batch of `batch` samples
    of its data's shape, on one core of this machine (the median of a few steps after a
    first, which pays for allocation)."""
    import time

    import torch

    from polyrhythm.losses import LOSSES
    from polyrhythm.models.build import build_model

    shape, classes = data_shape(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        net = build_model(config.model, shape, classes, seed=config.seed, loss=config.loss)
        loss = LOSSES[config.loss]
        # Class ids fit every loss (mse and bce take them as values): the time is the same.
        x, y = torch.randn(batch, *shape), torch.randint(0, classes, (batch,))
        times = []
        for _ in range(steps + 1):
            began = time.perf_counter()
            net.zero_grad()
            loss(net(x), y).backward()
            times.append(time.perf_counter() - began)
    finally:
        torch.set_num_threads(threads)
    return sorted(times[1:])[len(times[1:]) // 2]
