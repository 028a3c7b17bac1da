"""The tests' user script (tests/scripts/user_loop.py) and what one process trains with it:
the reference a run of the script on loopback or on an emulated cluster is held to."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

from polyrhythm.runtime.script_data import ShardSampler

SCRIPT = Path(__file__).parent / "scripts" / "user_loop.py"
_spec = importlib.util.spec_from_file_location("user_loop", SCRIPT)
user_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(user_loop)
EPOCHS = 4  # 5 steps an epoch with 2 workers: 20 steps


def one_process(workers: int, optimizer: str = "adamw") -> dict[str, torch.Tensor]:
    """The script's model trained in this process on each step's union batch (every
    worker's batch of that step, which are the same size: the mean of their losses)."""
    model, opt, sched = user_loop.build(optimizer)
    data = user_loop.data()
    samplers = [ShardSampler(len(data), w, workers, seed=0) for w in range(workers)]
    for _ in range(EPOCHS):
        orders = [list(s) for s in samplers]
        for step in range(len(orders[0]) // user_loop.BATCH):
            losses = []
            for order in orders:
                x, y = data[order[step * user_loop.BATCH:(step + 1) * user_loop.BATCH]]
                losses.append(F.mse_loss(model(x), y))
            (sum(losses) / workers).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
    return model.state_dict()


def farthest(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)
