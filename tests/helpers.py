"""Shared test helpers: small run configs, a single-process reference trainer, and waits on
a launched run's processes and progress."""

from __future__ import annotations

import io
import math
import struct
import subprocess
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import psutil
import pytest
import torch
import torch.distributed as dist

from polyrhythm.comm.transport import Transport
from polyrhythm.config import RunConfig, make_config
from polyrhythm.context import RankContext, Topology
from polyrhythm.data.sharding import batch_slice, epoch_order, steps_per_epoch, worker_batch_sizes
from polyrhythm.errors import ClusterError
from polyrhythm.flat import RunningStatistics
from polyrhythm.launch.cluster.hosts import can_emulate
from polyrhythm.launch.process import forkserver
from polyrhythm.losses import LOSSES, Loss
from polyrhythm.models.build import build_model
from polyrhythm.optim import TORCH_OPTIMIZERS, lr_at, optimizer_name
from polyrhythm.runtime.checkpoint import complete_epochs
from polyrhythm.runtime.job import agree_on_plan, build_role, whole_data

# How long a test waits for a launched run's progress (its ranks up, a checkpoint, its end)
# before it calls the run hung. Only a hang guard: a wait ends as soon as the progress
# comes, and a loaded machine is slow, never this slow.
HANG_GUARD_S = 180.0

# Spark's JVMs in a test's seconds-long run: the quick compiler alone and the serial
# collector start them faster on 2 cores (the first job 3.3 s instead of 6.3 here); the code
# that runs is the same.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_CONF = [f"spark.driver.extraJavaOptions={QUICK_JVM}",
              f"spark.executor.extraJavaOptions={QUICK_JVM}"]


def small_config(tmp_path, **fields):
    """A quick run: a few steps per epoch, records under tmp_path."""
    values = {"epochs": 2, "steps_per_epoch": 10, "out": str(tmp_path / "runs"),
              "lr_decay_every": 1, "lr_decay": 0.5, **fields}
    return make_config(values)


def equivalence_config(tmp_path, **fields):
    """A quick run whose workers each use one thread, as reference_parameters does: the
    same operations in the same order, whatever the machine's core count."""
    return small_config(tmp_path, threads=1, **fields)


def worker_gradient(model, x: torch.Tensor, y: torch.Tensor,
                    loss: Loss = LOSSES["cross_entropy"]) -> list[torch.Tensor]:
    """One worker's gradient: the mean loss over its own batch, as a worker computes it."""
    model.zero_grad(set_to_none=True)
    loss(model(x), y).backward()
    return [p.grad for p in model.parameters()]


def reference_parameters(config, weights: list[float] | None = None,
                         own_statistics: list | None = None,
                         leaves: dict[int, int] | None = None,
                         lr_by_epoch: bool = False, renormalised: bool = False) -> torch.Tensor:
    """Train in one process with the global batch; return the flat state (parameters, and
    running statistics as the workers' batch-weighted mean).

    Every step takes each worker's batch, computes its gradient as a worker does (with the
    workers' thread count, one by one) and applies the batch-weighted sum, sum_i (b_i/B) g_i
    (added in float64 and rounded once, as a server does), with the run's torch.optim. The
    distributed strategies must take exactly these steps: the computation is the same, so
    the difference is a few rounding errors, not the ones a different summation order (a
    union batch, another thread count) lets grow over the steps. That the weighted sum is
    the gradient of the mean loss over the union of the batches is
    test_equivalence.py::test_weighted_worker_gradients_are_the_global_gradient. Other
    `weights` (one per worker) make the reference of a wrongly weighted sum. Each worker's
    running statistics (BatchNorm) are its own, swapped in for its forward pass (and, with
    `own_statistics`, added to it at the end, one flat vector per worker). `leaves`: the
    workers lost during training, each with the steps it took: after them its gradient is
    missing from every step and the others keep their weights, so a step carries their share
    of a global batch, and the learning rate follows the global batches' worth applied (a
    parameter server's rule, runtime/server/bucket.py), or with `lr_by_epoch` the epoch (the
    collective strategies' rule: their workers step through the epochs together); with
    `renormalised` the workers left take the lost ones' share, their weights divided by
    what they sum to (a mean of models over the workers left: local SGD's rule).
    """
    with torch_threads(config.threads):
        return _train_reference(config, weights, own_statistics, leaves or {}, lr_by_epoch,
                                renormalised)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's thread count in this process for a while, then the one it had: a test that
    left it changed would change every later test's sums (conftest.py checks that none
    does)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reference_optimizer(settings, params) -> torch.optim.Optimizer:
    """The run's [optimizer] as plain torch.optim on the model's own parameters."""
    name = optimizer_name(settings)
    if name == "sgd":
        return torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum,
                               weight_decay=settings.weight_decay)
    cls = TORCH_OPTIMIZERS[name]
    given = {"betas": None if settings.betas is None else tuple(settings.betas),
             "eps": settings.eps}
    return cls(params, lr=settings.lr, weight_decay=settings.weight_decay,
               **{k: v for k, v in given.items() if v is not None})


def _train_reference(config, weights: list[float] | None, own_statistics: list | None,
                     leaves: dict[int, int], lr_by_epoch: bool,
                     renormalised: bool) -> torch.Tensor:
    plan, train, _ = whole_data(config)
    model = build_model(config.model, train.shape, train.classes, config.seed, config.loss)
    optimizer = reference_optimizer(config.optimizer, model.parameters())
    shards = plan.shards
    sizes = worker_batch_sizes(config.batch_size, config.workers)
    weights = weights or [size / config.batch_size for size in sizes]
    statistics = RunningStatistics(model)
    own = [statistics.get() for _ in sizes]
    steps = steps_per_epoch(len(train), config.batch_size, config.steps_per_epoch)
    taken, progress = 0, 0.0  # the run's steps, and the global batches' worth applied
    for epoch in range(config.epochs):
        orders = [epoch_order(s, epoch, config.seed, i) for i, s in enumerate(shards)]
        for step in range(steps):
            for group in optimizer.param_groups:  # 1e-6: weights like 1/3 add up short
                group["lr"] = lr_at(config.optimizer, epoch if lr_by_epoch
                                    else math.floor(progress / steps + 1e-6))
            here = [i for i in range(len(sizes)) if taken < leaves.get(i, taken + 1)]
            taken, progress = taken + 1, progress + sum(weights[i] for i in here)
            scale = 1 / sum(weights[i] for i in here) if renormalised else 1.0
            total = [torch.zeros_like(p, dtype=torch.float64) for p in model.parameters()]
            for i, (order, size, weight) in enumerate(zip(orders, sizes, weights, strict=True)):
                if i not in here:
                    continue
                idx = torch.from_numpy(batch_slice(order, size, step))
                statistics.set(own[i])
                grads = worker_gradient(model, *train.batch(idx), LOSSES[config.loss])
                own[i] = statistics.get()
                for t, g in zip(total, grads, strict=True):
                    t.add_(g, alpha=weight * scale)
            for p, t in zip(model.parameters(), total, strict=True):
                p.grad = t.float()
            optimizer.step()
    if own_statistics is not None:
        own_statistics.extend(own)
    statistics.set(sum(s * size / config.batch_size for s, size in zip(own, sizes, strict=True)))
    return flat(model.state_dict())


def flat(state_dict: dict) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in state_dict.values()])


def stored_parameters(summary: dict) -> torch.Tensor:
    """The final parameters a run stored in model.pt."""
    return flat(torch.load(f"{summary['run_dir']}/model.pt", weights_only=True))


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def _play_rank(rank: int, values: dict, store: str, play, results) -> None:
    """One rank of a job run by hand: join, build its role, `play(role, build)`, leave."""
    try:
        config = RunConfig(**values)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                world_size=config.world_size)
        topology = Topology(config.servers, config.workers)
        transport = Transport()
        transport.open(rank, topology.world_size, topology.worker_ranks)
        ctx = RankContext(config, rank, topology, transport)
        torch.set_num_threads(1)
        plan, source = agree_on_plan(ctx)
        role = build_role(ctx, plan, source)
        transport.barrier()
        got = play(role, lambda: build_role(ctx, plan, source))
        transport.barrier()
        dist.destroy_process_group()
        buffer = io.BytesIO()  # as bytes: states must save with torch.save
        torch.save(got, buffer)
        results.put((rank, topology.role(rank), buffer.getvalue()))
    except BaseException as exc:  # the test process reports it
        results.put((rank, "error", repr(exc)))


def play_ranks(tmp_path: Path, config: RunConfig,
               play: Callable[..., object]) -> dict[int, tuple[str, object]]:
    """Run every rank of `config`'s job in a process of its own, each doing
    `play(role, build)` (a module-level function) with its built role (worker or server
    shard) in place of the job's run, `build()` making another such role; returns
    {rank: (role name, what play returned)}. States travel through torch.save and come back
    through torch.load(weights_only=True)."""
    ctx = forkserver.context()  # as the launcher: torch imported once
    results = ctx.Queue()
    procs = [ctx.Process(target=_play_rank, args=(rank, config.to_dict(),
                                                  str(tmp_path / "rendezvous"), play, results))
             for rank in range(config.world_size)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, role, data = results.get(timeout=120)
        assert role != "error", f"rank {rank}: {data}"
        got[rank] = (role, torch.load(io.BytesIO(data), weights_only=True))
    for p in procs:
        p.join(timeout=30)
    return dict(sorted(got.items()))  # ranks in order, not in the order they finished


def rank_processes(launcher_pid: int) -> dict[int, psutil.Process]:
    """{rank: process} of a launcher's ranks (children of its forkserver, so searched among
    all its descendants); a process that ends while being looked at is left out."""
    found = {}
    for p in psutil.Process(launcher_pid).children(recursive=True):
        try:
            name = p.name()
        except psutil.NoSuchProcess:
            continue
        if name.startswith("polyrhythm-r"):
            found[int(name.removeprefix("polyrhythm-r"))] = p
    return found


def wait_for_ranks(launcher: subprocess.Popen, count: int,
                   timeout: float = HANG_GUARD_S) -> dict[int, psutil.Process]:
    """Wait until every one of the launcher's `count` ranks runs; {rank: process}."""
    deadline = time.monotonic() + timeout
    while (ranks := rank_processes(launcher.pid)).keys() != set(range(count)):
        if launcher.poll() is not None or time.monotonic() > deadline:
            give_up(launcher, f"its {count} ranks (up: {sorted(ranks)})", timeout)
        time.sleep(0.05)
    return ranks


def wait_for_checkpoint(out: Path, launcher: subprocess.Popen, workers: int, servers: int,
                        epochs: int = 1, earlier: frozenset[Path] = frozenset(),
                        timeout: float = HANG_GUARD_S) -> tuple[Path, int]:
    """Wait until the launched run in `out` (a run folder not among `earlier`) has a complete
    checkpoint of `epochs` epochs or more: it trains. Older checkpoints are pruned as it goes
    on, so a later one counts. (Its run folder, the newest complete checkpoint's epochs.)"""
    deadline = time.monotonic() + timeout
    while launcher.poll() is None and time.monotonic() < deadline:
        for run_dir in (d for d in Path(out).glob("2*") if d.is_dir() and d not in earlier):
            done = complete_epochs(run_dir, workers, servers)
            if done and done[-1] >= epochs:
                return run_dir, done[-1]
        time.sleep(0.02)
    give_up(launcher, f"a complete checkpoint of {epochs} epochs", timeout)


def finished(launcher: subprocess.Popen, after: str,
             timeout: float = HANG_GUARD_S) -> tuple[str, str]:
    """The launcher's (stdout, stderr) once it has ended; if it hangs, it is killed (its
    ranks die with it) and the test fails saying so."""
    try:
        return launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        launcher.kill()
        _, stderr = launcher.communicate()
        pytest.fail(f"the run did not end within {timeout:.0f} s {after}: it hung "
                    f"(stderr: {(stderr or '')[-1000:]!r})")


def give_up(launcher: subprocess.Popen, awaited: str, timeout: float) -> NoReturn:
    """Fail the test, which waited for `awaited`: the launched run ended first, or it did not
    come in `timeout` s (the run, hung, is ended)."""
    ended = launcher.poll() is not None
    if not ended:
        launcher.kill()
    _, stderr = launcher.communicate()
    why = "the run ended first" if ended else f"it did not come in {timeout:.0f} s"
    pytest.fail(f"waiting for {awaited}: {why} (stderr: {(stderr or '')[-1000:]!r})")


def no_emulated_cluster() -> str | None:
    """Why no emulated cluster can be made here (not root, no ip or tc), or None."""
    try:
        can_emulate()
    except ClusterError as exc:
        return str(exc)
    return None


# A test (or module: pytestmark) that makes emulated clusters: skipped, saying why, where none
# can be made.
needs_emulated_cluster = pytest.mark.skipif(no_emulated_cluster() is not None,
                                            reason=f"no emulated cluster here: "
                                                   f"{no_emulated_cluster()}")


def flip_tensor_bytes(path: Path) -> None:
    """Flip bytes in the middle of the largest tensor a torch.save file holds: the damage a
    disk or a copy does, which torch.load does not notice (it still loads, other numbers)."""
    with zipfile.ZipFile(path) as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    with path.open("r+b") as f:
        f.seek(record.header_offset + 26)  # the local header's name and extra lengths
        name, extra = struct.unpack("<HH", f.read(4))
        f.seek(record.header_offset + 30 + name + extra + record.file_size // 2)
        middle = f.read(8)
        f.seek(-8, io.SEEK_CUR)
        f.write(bytes(b ^ 0x5A for b in middle))
    torch.load(path, weights_only=True)  # still loads
