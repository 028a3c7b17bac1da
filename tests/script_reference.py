"""The tests' user script (tests/scripts/user_loop.py) and what one process trains with it:
the reference a run of the script on loopback or on an emulated cluster is held to."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from polyrhythm.runtime.worker.script_data import ShardSampler

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


def downpour_one_worker(fetch_every: int) -> dict[str, torch.Tensor]:
    """Downpour of one worker (a push every step, a fetch every `fetch_every`) with the
    script's plain SGD over two groups ("sgd-groups"), in this process: the server's model
    steps each push at the groups' rates then; between fetches the worker's replica steps
    its own gradient at the same rates. Returns the server's model, which the run stores."""
    model, opt, sched = user_loop.build("sgd-groups")
    server = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = user_loop.data()
    sampler, steps = ShardSampler(len(data), 0, 1, seed=0), 0
    for _ in range(EPOCHS):
        order = list(sampler)
        for step in range(len(order) // user_loop.BATCH):
            x, y = data[order[step * user_loop.BATCH:(step + 1) * user_loop.BATCH]]
            model.zero_grad()
            F.mse_loss(model(x), y).backward()
            steps += 1
            with torch.no_grad():
                for group in opt.param_groups:
                    named = {id(p): n for n, p in model.named_parameters()}
                    for p in group["params"]:
                        server[named[id(p)]].add_(p.grad, alpha=-group["lr"])
                        if steps % fetch_every:  # the replica's own step
                            p.add_(p.grad, alpha=-group["lr"])
                if steps % fetch_every == 0:
                    for n, p in model.named_parameters():
                        p.copy_(server[n])
            with warnings.catch_warnings():  # it steps by hand, not through opt.step()
                warnings.filterwarnings("ignore", "Detected call of", UserWarning)
                sched.step()
    return server


def farthest(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)
