"""This worker's shard of a script's data set, for torch's DataLoader: every worker holds as
many examples (the extra few of an uneven split are left out, as every synchronous strategy
needs the workers to take as many steps), reshuffled each epoch the same way anywhere; and
the loader's passes as epochs, where a script does not count them (job.loader)."""

from __future__ import annotations

from collections.abc import Iterator

import torch.utils.data

from polyrhythm.data.sharding import epoch_order, random_shards


class ShardSampler(torch.utils.data.Sampler):
    """Indices of worker `worker`'s shard of `n` examples (a seeded random split), in a new
    order each time it is iterated (each epoch; `epoch` counts them, a resumed run sets it)."""

    def __init__(self, n: int, worker: int, workers: int, shuffle: bool = True,
                 seed: int = 0) -> None:
        if n < workers:
            raise ValueError(f"{n} examples cannot be shared by {workers} workers")
        self.shard = random_shards(n, workers, seed)[worker][:n // workers]
        self.worker, self.shuffle, self.seed = worker, shuffle, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.shard)

    def __iter__(self) -> Iterator[int]:
        order = (epoch_order(self.shard, self.epoch, self.seed, self.worker) if self.shuffle
                 else self.shard)
        self.epoch += 1
        return iter(order.tolist())


def shard_loader(sampler: ShardSampler, dataset, batch_size: int,
                 **kwargs) -> torch.utils.data.DataLoader:
    """A DataLoader of `dataset` over the sampler's indices (kwargs: DataLoader's own)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                                       **kwargs)


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
