"""Shared test helpers: small run configs and a single-process reference trainer."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from polyrhythm.config import make_config
from polyrhythm.data.sharding import (
    batch_slice,
    epoch_order,
    random_shards,
    steps_per_epoch,
    worker_batch_sizes,
)
from polyrhythm.models.build import build_model
from polyrhythm.optim import lr_at
from polyrhythm.runtime.job import prepare_data


def small_config(tmp_path, **fields):
    """A quick run: a few steps per epoch, records under tmp_path."""
    values = {"epochs": 2, "steps_per_epoch": 10, "out": str(tmp_path / "runs"),
              "lr_decay_every": 1, "lr_decay": 0.5, **fields}
    return make_config(values)


def reference_parameters(config) -> torch.Tensor:
    """Train in one process on the union of the workers' batches; return flat parameters.

    The mean loss over the union of the per-worker batches equals the batch-weighted mean of
    the workers' mean losses, which is what the distributed strategies apply.
    """
    torch.set_num_threads(2)
    train, _ = prepare_data(config)
    model = build_model(config.model, train.shape, train.classes, config.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.optimizer.lr,
                                momentum=config.optimizer.momentum,
                                weight_decay=config.optimizer.weight_decay)
    shards = random_shards(len(train), config.workers, config.seed)
    sizes = worker_batch_sizes(config.batch_size, config.workers)
    for epoch in range(config.epochs):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(config.optimizer, epoch)
        orders = [epoch_order(s, epoch, config.seed, i) for i, s in enumerate(shards)]
        for step in range(steps_per_epoch(len(train), config.batch_size,
                                          config.steps_per_epoch)):
            idx = torch.cat([torch.from_numpy(batch_slice(o, b, step))
                             for o, b in zip(orders, sizes, strict=True)])
            optimizer.zero_grad()
            F.cross_entropy(model(train.x[idx]), train.y[idx]).backward()
            optimizer.step()
    return flat(model.state_dict())


def flat(state_dict: dict) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in state_dict.values()])


def stored_parameters(summary: dict) -> torch.Tensor:
    """The final parameters a run stored in model.pt."""
    return flat(torch.load(f"{summary['run_dir']}/model.pt", weights_only=True))
