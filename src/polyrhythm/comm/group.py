"""Joining and leaving the job's process group: the one place a rank starts and ends
torch.distributed's default group (Gloo), over the store its launcher's rendezvous gives
(a file in the run's folder for polyrhythm's own launchers; rank 0's store behind its gate,
or torchrun's, for torchrun-style ranks: launch/rank/rendezvous.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from polyrhythm.comm.faults import PeerSilent

HERE = "polyrhythm/here/"  # a rank's key in the store, once it has come

# How long a rank waits in the job's store for the others to join: ranks start at different
# times (hosts, imports, a loaded machine), which --timeout, the bound on a peer's silence in
# training, is not about (a run with --timeout 3 failed to start under load).
JOIN_WAIT_S = 120.0


def join_wait(timeout_s: float) -> float:
    """The bound on a store's waits for a job whose --timeout is `timeout_s`."""
    return max(timeout_s, JOIN_WAIT_S)


def join(rank: int, world: int, timeout_s: float, store: dist.Store) -> None:
    """Join the job's Gloo group as `rank` of `world`, through `store`, once every rank has
    come to it (within the store's own bound: join_wait); every wait of the group's own
    bounded by `timeout_s`."""
    _all_here(store, rank, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def _all_here(store: dist.Store, rank: int, world: int) -> None:
    """Wait until every rank has come to the store. Gloo's connecting waits for each peer's
    address with the group's timeout (--timeout), not the store's: a rank starting later
    than that (another host, a loaded machine) failed the job's start."""
    store.set(f"{HERE}{rank}", "1")
    try:
        store.wait([f"{HERE}{r}" for r in range(world)])
    except dist.DistStoreError:
        missing = [r for r in range(world) if not store.check([f"{HERE}{r}"])]
        if not missing:
            raise
        wait = store.timeout.total_seconds()
        raise NotJoined(missing[0], TimeoutError(
            f"not within the store's wait of {wait:g} s (missing: "
            f"{'ranks' if len(missing) > 1 else 'rank'} {', '.join(map(str, missing))})"
        )) from None


class NotJoined(PeerSilent):
    """A rank never came to the job's store (its host or process did not start)."""

    what = "did not join the job"


def file_store(path: str | Path, world: int, timeout_s: float) -> dist.FileStore:
    """A store in the file `path`, which the `world` ranks on this machine meet through (no
    port to race for, nothing listening); each of its waits bounded by join_wait."""
    store = dist.FileStore(str(path), world)
    store.set_timeout(timedelta(seconds=join_wait(timeout_s)))
    return store


def leave() -> None:
    """Leave the group (every rank together: one tearing down Gloo early can abort its
    peers)."""
    dist.destroy_process_group()
