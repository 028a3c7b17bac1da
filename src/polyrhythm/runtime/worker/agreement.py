"""What the workers must agree on, checked exactly: the same initial model (a script's, at
job.wrap), and under the all-reduce family the same parameters and optimizer settings at
each epoch's end. A difference is one line naming its likely cause."""

from __future__ import annotations

import hashlib

import torch

from polyrhythm.comm.transport import Transport
from polyrhythm.errors import ConfigError
from polyrhythm.flat import FlatParameters


def check_same_start(transport: Transport, flat: FlatParameters) -> None:
    """Every worker's initial parameters are worker 0's (one line naming the first that
    differs): a digest each, gathered, compared exactly."""
    weights = torch.rand(len(flat), generator=torch.Generator().manual_seed(7),
                         dtype=torch.float64)
    digest = torch.stack([(flat.data.double() * weights).sum(), flat.data.double().abs().sum()])
    with transport.uncounted():  # bookkeeping, not the training's traffic
        rows = transport.rows_of_members(digest)
    differ = [w for w in range(1, len(rows)) if not torch.equal(rows[w], rows[0])]
    if differ:
        raise ConfigError(f"worker {differ[0]}'s initial parameters differ from worker "
                          "0's: build the model the same way on every worker (call "
                          "torch.manual_seed with the same seed before building it)")


def check_agreement(engine) -> None:
    """Where the workers must hold the same parameters (the all-reduce family), check that
    they do after the epoch now ending (a WorkerEngine's): a digest of their bits and their
    optimizer's settings, compared exactly."""
    if engine.workers < 2 or not engine.strategy.workers_agree:
        return
    transport = engine.ctx.transport
    digest = hashlib.blake2b(engine.flat.data.numpy().tobytes(), digest_size=6).digest()
    settings = agreed_settings(engine.optimizer)
    with transport.uncounted():  # bookkeeping, not the training's traffic
        rows = transport.rows_of_members(torch.tensor(
            [float(int.from_bytes(digest, "little")), *(v for _, v in settings)],
            dtype=torch.float64))
    other = next((w for w in range(1, len(rows)) if not torch.equal(rows[w], rows[0])), None)
    if other is None:
        return
    where = (f"workers 0 and {other} hold different parameters after epoch "
             f"{engine.epoch + 1}, though under {engine.ctx.config.strategy.name} every "
             "worker steps the same gradient")
    differs = [(key, float(rows[0, i + 1]), float(rows[other, i + 1]))
               for i, (key, _) in enumerate(settings) if rows[0, i + 1] != rows[other, i + 1]]
    if differs:
        key, mine, theirs = differs[0]
        raise ConfigError(f"{where}: their optimizers' {key} differ ({mine:g} on worker 0, "
                          f"{theirs:g} on worker {other}): a scheduler stepped on each "
                          "worker's own figure (ReduceLROnPlateau on its own validation "
                          "loss?); step it on job.mean(value), which every worker shares")
    raise ConfigError(f"{where}: something changed one worker's model or optimizer on its "
                      "own (a step or an edit outside opt.step()?)")


def agreed_settings(optimizer: torch.optim.Optimizer | None) -> list[tuple[str, float]]:
    """A script's optimizer's numeric settings per param group (`group 1 lr`, ...): what
    workers that must agree must agree on too (none for the run's own optimizer)."""
    if optimizer is None:
        return []
    return [(f"param group {g}'s {k}" if len(optimizer.param_groups) > 1 else k, float(x))
            for g, group in enumerate(optimizer.param_groups)
            for k, v in sorted(group.items()) if k != "params"
            for x in (v if isinstance(v, tuple | list) else [v])
            if isinstance(x, int | float) and not isinstance(x, bool)]
