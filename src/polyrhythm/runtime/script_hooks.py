"""What a job puts into a user's script's objects: the loader's passes as epochs, the wrapped
optimizer's step, the check that no other optimizer steps, and the loss each backward ran on
(runtime/script.py's Job uses them)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from polyrhythm.errors import ConfigError

_ACTIVE: list = []  # the job whose optimizer steps now (one per process)


class EpochOfBatches:
    """A worker's DataLoader over its shard. Where the script does not count its epochs
    with job.epochs, going through it once is an epoch: it ends when the next pass begins
    (or the job finishes), so what the script logs after a pass is that epoch's."""

    def __init__(self, job, loader: torch.utils.data.DataLoader) -> None:
        self.job, self.loader = job, loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        job = self.job
        if job.close_pass():  # what the script logged after the last pass is that epoch's
            job.begin_epoch(job.epoch + 1)
        yield from self.loader
        job.ended_pass = job.total_epochs is None


def wrapped_step(optimizer: torch.optim.Optimizer, closure=None) -> None:
    """What a wrapped optimizer's step does (bound to it)."""
    if closure is not None:
        raise ConfigError("a wrapped optimizer's step takes no closure (LBFGS-style "
                          "optimizers re-evaluate the loss, which no strategy can share)")
    optimizer._opt_called = True  # what a scheduler's own wrapper of step would mark
    optimizer._polyrhythm_job.step()


# It marks _opt_called itself, as a scheduler's wrapper of step would: so a scheduler made
# before or after wrap sees a step it can track (torch's lr_scheduler reads this attribute).
wrapped_step._wrapped_by_lr_sched = True


def stepping_unwrapped(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """A global optimizer pre-step hook in a job: an optimizer stepped that is neither the
    job's wrapped one (stepping through its class) nor one of the servers' own is one line."""
    if getattr(optimizer, "_polyrhythm_job", None) is not None or getattr(
            optimizer, "polyrhythm_internal", False):
        return
    raise ConfigError(f"an optimizer ({type(optimizer).__name__}) was stepped without "
                      "job.wrap: in a polyrhythm job write model, opt = job.wrap(model, opt) "
                      "and step that")


def recording_backward(original):
    """Tensor.backward that also keeps the loss it ran on (a scalar), for the step's record."""
    def backward(tensor: torch.Tensor, *args, **kwargs):
        if _ACTIVE and tensor.dim() == 0:
            _ACTIVE[0].losses.append(tensor.detach())
        return original(tensor, *args, **kwargs)
    return backward
