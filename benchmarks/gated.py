"""What the run's secret costs (`benchmarks/overhead.py --gate`): the same job's ranks joining
through rank 0's gate (launch/rank/gate.py: the store on loopback, each rank proving the secret
through its relay) and through torch's own store (env://, what the ranks did before), side by
side.

Two figures, each paired:

1. the rendezvous: two ranks joining a group again and again, through torch's store and
   through the gate in turn (the pair's order alternating), from the start of the join to
   the end of the group's first barrier, the slowest rank's seconds;
2. the steps: a whole run of `polyrhythm.node`'s ranks (`run_node`, with torchrun's
   variables, rank 0 hosting the store as a Spark task's rank does), its epochs' samples/s
   after warm-up, both sides at once, each pinned to a core of its own (every rank of a
   side on its core; the cores swap between pairs); the steps' messages go over Gloo's own
   connections, not the store.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import statistics
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from baselines import free_port, run_spawned  # benchmarks/
from polyrhythm.config import make_config
from polyrhythm.launch.rank.gate import SECRET_VARIABLE, new_secret
from polyrhythm.launch.rank.rendezvous import join_group
from polyrhythm.launch.rank.torchrun import run_node

SIDES = ("torch's store", "the gate")
WORLD = 2


def _as_rank(rank: int, port: int, secret: str | None) -> None:
    """This process's environment as torchrun's (or a Spark task's) rank `rank`."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
                       "GROUP_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"})
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    if secret:  # without one, rank 0 warns that its store admits anyone: that side's line
        os.environ[SECRET_VARIABLE] = secret


def joins_main(rank: int, turns: list[tuple[int, bool]], secret: str, results) -> None:
    """Rank `rank` joining a group once per turn (port, through the gate or not): through
    torch's store (env://, what join_group does without a secret, less its warning) or
    through the gate. Each join's seconds, to the group's first barrier."""
    seconds = []
    for port, gated in turns:
        _as_rank(rank, port, secret if gated else None)
        started = time.perf_counter()
        if gated:
            join_group(rank, WORLD, timedelta(seconds=120))
        else:
            dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=WORLD,
                                    timeout=timedelta(seconds=120))
        dist.barrier()
        seconds.append(time.perf_counter() - started)
        dist.destroy_process_group()
    results.put((rank, seconds))


def node_main(rank: int, port: int, secret: str | None, config: str, results) -> None:
    _as_rank(rank, port, secret)
    summary = run_node(config)
    results.put((rank, [e["samples_per_s"] for e in summary["epoch_metrics"]]
                 if summary else None))


def fixed_ports(count: int) -> list[int]:
    """`count` ports free now below Linux's ephemeral range (32768 up), where the sockets
    that the ranks open meanwhile without a port (each round's store and relay, their
    connections) cannot take one before its round."""
    ports: list[int] = []
    for port in random.sample(range(20000, 32000), 4 * count):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"not {count} free ports in 20000-31999")


def rendezvous_pairs(pairs: int, secret: str) -> list[tuple[float, float]]:
    """`pairs` pairs of rendezvous (torch's store, the gate) by the same two ranks, one after
    the other, which comes first alternating: the slowest rank's seconds of each."""
    ports = fixed_ports(2 * pairs)
    gated = [side == (k % 2 == 0) for k in range(pairs) for side in (False, True)]
    turns = list(zip(ports, gated, strict=True))
    ranks = run_spawned(joins_main, [(r, turns, secret) for r in range(WORLD)])
    slowest = [max(times) for times in zip(*ranks, strict=True)]
    plain = [s for s, g in zip(slowest, gated, strict=True) if not g]
    through_gate = [s for s, g in zip(slowest, gated, strict=True) if g]
    return list(zip(plain, through_gate, strict=True))


def run_rates(secret: str | None, config: str) -> list[float]:
    """One run's epochs' samples/s."""
    port = free_port()
    return run_spawned(node_main, [(r, port, secret, config) for r in range(WORLD)])[0]


def pinned(index: int, core: int, work, args: tuple, results) -> None:
    """`work(*args)` in a process pinned to `core`, leading a process group (its ranks
    inherit both)."""
    os.setpgrp()
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {core})
    results.put((index, work(*args)))


@dataclass
class GateCost:
    """The paired figures of the two sides (without the gate, with it)."""

    joins: list[tuple[float, float]] = field(default_factory=list)
    rates: list[tuple[float, float]] = field(default_factory=list)

    def pair(self, work, args: tuple[tuple, tuple], cores: list[int], swap: bool) -> tuple:
        """Both sides of `work` at once, a core each (swapped if `swap`), or in turn."""
        order = [1, 0] if swap else [0, 1]
        if len(cores) > 1:
            done = run_spawned(pinned, [(i, core, work, args[side]) for i, (side, core) in
                                        enumerate(zip(order, cores, strict=True))])
        else:
            done = [work(*args[side]) for side in order]
        by_side = dict(zip(order, done, strict=True))
        return by_side[0], by_side[1]

    def measure(self, joins: int, runs: int, values: dict, out: str, warmup: int,
                cores: list[int]) -> None:
        secret = new_secret()
        self.joins = rendezvous_pairs(joins + 1, secret)[1:]  # the first warms the ranks up
        for i, (plain, gated) in enumerate(self.joins):
            print(f"  rendezvous {i + 1}/{joins}  {SIDES[0]} {plain * 1e3:7.1f} ms  {SIDES[1]} "
                  f"{gated * 1e3:7.1f} ms", flush=True)
        configs = []
        for side in SIDES:
            path = Path(out) / f"{'gated' if side == SIDES[1] else 'plain'}.toml"
            path.write_text(make_config({**values, "out": str(Path(out) / path.stem)}).to_toml())
            configs.append(str(path))
        for i in range(runs):
            plain, gated = self.pair(run_rates, ((None, configs[0]), (secret, configs[1])),
                                     cores, bool(i % 2))
            self.rates.append((statistics.median(plain[warmup:]),
                               statistics.median(gated[warmup:])))
            print(f"  run {i + 1}/{runs}  {SIDES[0]} {self.rates[-1][0]:7.0f}/s  {SIDES[1]} "
                  f"{self.rates[-1][1]:7.0f}/s  ratio {self.rates[-1][1] / self.rates[-1][0]:.3f}",
                  flush=True)

    def print_table(self) -> None:
        print(f"{'figure':<34} {SIDES[0]:>14} {SIDES[1]:>10} {'ratio':>6}")
        for name, pairs, scale in (("rendezvous (slowest rank), ms", self.joins, 1e3),
                                   ("steps, samples/s", self.rates, 1.0)):
            without = statistics.median(p[0] for p in pairs) * scale
            with_gate = statistics.median(p[1] for p in pairs) * scale
            ratio = statistics.median(p[1] / p[0] for p in pairs)
            print(f"{name:<34} {without:>14.1f} {with_gate:>10.1f} {ratio:>6.3f}")
        print("medians over the pairs; ratio: the median of the paired ratios (the gate's over "
              "torch's store)")
