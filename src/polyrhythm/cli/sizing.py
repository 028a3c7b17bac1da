"""The run's model as `simulate` and `advise` size it when no stored run calibrates it: built
for the data the run would use (its sample shape and classes, from the data set's source as
the run opens it), so its size and its parameters' shapes are the run's; one step of it
timed on this machine, and each compressor's encoding and decoding of it. It lives here, not
in sim/, because building a model and running a codec load torch, which the simulator never
does (its import contract); the simulator gets the figures as Costs.

Opening a source is cheap for every registered data set: the packaged ones read one small
file, synthetic data is generated, and CIFAR's shape and classes are known without reading
its archive. An npz file and a user's function are loaded whole, as a run would.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple

from polyrhythm.errors import ConfigError
from polyrhythm.sim.setup import BYTES, Costs

# A larger model's codecs are timed on its first this many values (with their matrices),
# and the times scaled to the whole model.
TIMED_VALUES = 1 << 22


class ModelSize(NamedTuple):
    """The run's model on the run's data: its parameter count (float32 values), the
    sample shape, classes and loss it was built for, and its parameters' shapes in flat
    order."""

    parameters: int
    shape: tuple[int, ...]
    classes: int
    loss: str = "cross_entropy"
    shapes: tuple[tuple[int, ...], ...] = ()

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
    return ModelSize(sum(p.numel() for p in model.parameters()), shape, classes, config.loss,
                     tuple(tuple(p.shape) for p in model.parameters()))


def model_values(config, mb: float | None = None) -> tuple[int, tuple, str]:
    """The values a simulation of `config` moves, their parameters' shapes, and a line
    saying where they come from: a model of `mb` MB (float32) when given (--model-mb),
    which has no shapes, so no matrices (PowerSGD sends its values as they are), else
    `config`'s model built for its data (model_size)."""
    if mb is not None:
        if not mb > 0:
            raise ConfigError(f"--model-mb must be positive, got {mb}")
        parameters = int(mb * 1e6 / BYTES)
        return parameters, (), (f"model of {mb:g} MB (--model-mb): {parameters:,} "
                                "parameters")
    size = model_size(config)
    return (size.parameters, size.shapes,
            "model " + size.describe(config.model.name, config.data.name))


def model_parameters(config, mb: float | None = None) -> tuple[int, str]:
    """model_values without the shapes."""
    parameters, _, line = model_values(config, mb)
    return parameters, line


@contextmanager
def one_core() -> Iterator[None]:
    """torch on one thread inside the block, as a worker with a core of its own."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def median(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


def time_codecs(costs: Costs, compressions: Iterable, repeats: int = 3) -> Costs:
    """`costs` with the whole-model (encode, decode) seconds of each compression's codec
    (a config's compression settings) timed on one core here, for those not timed yet: the
    median of a few of each after a first, on random values of the model's size and
    shapes (a model over TIMED_VALUES: on its first TIMED_VALUES, scaled)."""
    import time

    import torch

    from polyrhythm.compression import COMPRESSORS
    from polyrhythm.compression.wire import extent_of
    from polyrhythm.sim.compressed import settings_key

    timed = dict(costs.codec_s)
    numel = min(costs.parameters, TIMED_VALUES)
    extent = extent_of(0, numel, costs.shapes)
    values = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    with one_core():
        for settings in compressions:
            key = settings_key(settings)
            if key in timed or not COMPRESSORS[settings.name].compresses or not numel:
                continue
            codec = COMPRESSORS[settings.name].build(settings, extent, 0)
            message, decoded = torch.empty(codec.words), torch.empty(numel)
            encode, decode = [], []
            for _ in range(repeats + 1):
                began = time.perf_counter()
                codec.encode(values, message)
                encoded = time.perf_counter()
                codec.decode(message, decoded)
                encode.append(encoded - began)
                decode.append(time.perf_counter() - encoded)
            scale = costs.parameters / numel
            timed[key] = [median(encode[1:]) * scale, median(decode[1:]) * scale]
    return replace(costs, codec_s=timed)


def describe_codecs(costs: Costs, keys: Iterable[str]) -> str:
    """A line: each compressor's encode and decode of the whole model as timed here."""
    shown = [f"{key}: {1000 * costs.codec_s[key][0]:.2f} + {1000 * costs.codec_s[key][1]:.2f}"
             for key in keys if key in costs.codec_s]
    return ("codecs timed here on one core, encode + decode of the whole model in ms: "
            + "; ".join(shown)) if shown else ""


def measure_compute(config, batch: int, steps: int = 5) -> float:
    """Seconds of one forward and backward of `config`'s model on a batch of `batch` samples
    of its data's shape, on one core of this machine (the median of a few steps after a
    first, which pays for allocation)."""
    import time

    import torch

    from polyrhythm.losses import LOSSES
    from polyrhythm.models.build import build_model

    shape, classes = data_shape(config)
    with one_core():
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
    return median(times[1:])
