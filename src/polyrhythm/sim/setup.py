"""What a simulation needs, from a run's config (the same flags as `polyrhythm train`) and
the costs of its pieces: who is on which host, each host's link, the latency, each worker's
compute time per step, the model's size and its buckets, the servers' update cost, and under
compression each message's size and the codecs' seconds (sim/compressed.py)."""

from __future__ import annotations

import itertools
import math
import struct
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from polyrhythm.config import RunConfig, layered, make_config
from polyrhythm.config.emulation import compute_times, host_ranks, per_host, replay
from polyrhythm.data.sharding import worker_batch_sizes
from polyrhythm.errors import ConfigError
from polyrhythm.layout import BucketLayout
from polyrhythm.sim.compressed import Part, Seconds, all_reduce_of, push_bytes, seconds
from polyrhythm.sim.network import Network
from polyrhythm.units import Delay, duration, rate

BYTES = 4  # float32
# Cluster settings that describe hosts: given without a host count, the simulator gives each
# worker a host (simulation_config).
HOST_SETTINGS = ("bandwidth", "cpu", "placement")
# A server's optimizer step (SGD with momentum, weight decay) when no run calibrates it:
# about 2 ns per parameter on this machine's CPU (FlatSGD on 25 M values).
UPDATE_S_PER_PARAMETER = 2e-9


@dataclass(frozen=True)
class Costs:
    """The costs a simulation cannot read from the config: the model's size (float32
    values), a server's optimizer step on the whole model (U_w) and the adding of one
    whole-model gradient (R_w), in seconds; `compute`, measured seconds per step of each
    worker to replay (calibration), else the config's compute time is drawn.

    Compression (sim/compressed.py): the parameters' `shapes` in flat order (PowerSGD's
    matrices; none: no matrices), each compressor's whole-model (encode, decode) seconds
    timed here (`codec_s`, by compressed.codec_key), and the seconds a run measured under
    its `compressor`: a worker's mean per step (`compress_s`) and a server's per
    whole-model push (`server_compress_s`); None where not measured."""

    parameters: int
    update_s: float = 0.0
    reduce_s: float = 0.0
    compute: list[list[float]] | None = None
    message_s: float = 0.0  # a process's own time to hand one message over (LogP's o)
    shapes: list[list[int]] = field(default_factory=list)
    codec_s: dict[str, list[float]] = field(default_factory=dict)
    compressor: str = "none"
    compress_s: float | None = None
    server_compress_s: float | None = None

    @classmethod
    def estimated(cls, parameters: int, update_s: float | None = None,
                  reduce_s: float = 0.0, shapes=()) -> Costs:
        """Costs no run calibrates, of a model of `parameters` values (cli/sizing.py sizes
        a registered one for the run's data) with parameters of `shapes`: the update time
        given, else estimated from the size (UPDATE_S_PER_PARAMETER)."""
        update = parameters * UPDATE_S_PER_PARAMETER if update_s is None else update_s
        return cls(parameters, update, reduce_s, shapes=[list(s) for s in shapes])


@dataclass
class Setup:
    """A simulation's cluster and costs, resolved."""

    workers: int
    servers: int
    host: list[int]  # each rank's host (ranks: servers first, then workers)
    rates: list[float]  # bytes/s of each host's link
    latency: Callable[[], float]
    compute: list[Callable[[], float]]  # each worker's seconds per step
    batch: list[int]  # each worker's samples per step
    buckets: list[tuple[int, int]]  # (server, bytes of a push) of each bucket
    replies: list[int]  # bytes of each bucket's reply
    values: list[int]  # values of each bucket (its share of the servers' costs)
    parts: list[Part]  # the collectives of one all-reduce of the model
    codecs: Seconds  # compression's seconds, worker's and server's (sim/compressed.py)
    costs: Costs
    iterations: int  # steps per worker (global batches where the servers count them)
    warmup: int = 0  # first steps of each worker left out of throughput, as in a run
    fixed_latency: float | None = None  # the latency, when it has no jitter
    # Parameter servers: the run is `iterations` global batches, counted in gradient applied
    # whichever workers computed it (each worker then steps until the servers end the run).
    shared_epochs: bool = False

    def network(self) -> Network:
        """The links, idle."""
        return Network(self.rates, self.latency, self.fixed_latency)

    def worker_host(self, w: int) -> int:
        return self.host[self.servers + w]

    @property
    def weights(self) -> list[float]:
        """Each worker's batch weight, its share of the global batch, as its pushes carry it
        (a float32 header field, comm/messages.py): what the servers count progress in."""
        total = sum(self.batch)
        return [struct.unpack("f", struct.pack("f", b / total))[0] for b in self.batch]


def simulation_config(*layers: Mapping[str, Any]) -> RunConfig:
    """The config of configs in layers (a file, then flags, the later winning, as
    load_config layers them) as the simulator reads it: a link speed, CPU shares or a
    placement given without hosts or workers_per_host mean a host per worker (and one per
    server where placement is dedicated). `train` asks for the count, as emulation makes the
    hosts (with root and tools); a simulation makes none, so it need not be told."""
    values = layered(*layers)
    cluster = values["cluster"]
    if (cluster.get("hosts") is None and cluster.get("workers_per_host") is None
            and any(cluster.get(key) for key in HOST_SETTINGS)):
        values["cluster"] = {**cluster, "workers_per_host": 1}
    return make_config(values)


def setup(config, costs: Costs, iterations: int) -> Setup:
    """The simulation of `config` with these costs, `iterations` steps per worker."""
    servers, workers = config.servers, config.workers
    cluster = config.cluster
    hosts, host = _rank_hosts(config)
    rates = [math.inf if b is None else rate(b, "bandwidth") / 8
             for b in per_host(cluster.bandwidth, hosts)]
    mean = duration(cluster.latency, "latency")
    jitter = duration(cluster.latency_jitter, "latency_jitter")
    latency = Delay(mean, jitter).sampler(config.seed)
    compute = [_compute(config, costs, w, factor)
               for w, factor in enumerate(compute_stretch(config))]
    sizes = worker_batch_sizes(config.batch_size, workers)
    layout = BucketLayout(costs.parameters, max(1, servers),
                          config.bucket_kb).buckets if servers else []
    pushes, replies = push_bytes(config.compression, layout, costs.shapes)
    buckets = [(s, size) for (s, _, _), size in zip(layout, pushes, strict=True)]
    parts = all_reduce_of(config.compression, costs.parameters, costs.shapes)
    return Setup(workers, servers, host, rates, latency, compute, sizes, buckets, replies,
                 [b - a for _, a, b in layout], parts, seconds(config, costs), costs,
                 iterations, config.warmup_steps, None if jitter else mean,
                 config.shared_epochs)


def compute_stretch(config) -> list[float]:
    """Each worker's compute time factor: its slowdown times its host's CPU factor (the
    fullest host's share over its own)."""
    hosts, host = _rank_hosts(config)
    shares = [None if c is None else float(c) for c in per_host(config.cluster.cpu, hosts)]
    full = max((s for s in shares if s is not None), default=None)
    factors = []
    for w in range(config.workers):
        share = shares[host[config.servers + w]]
        slowdown = config.slowdown[w] if w < len(config.slowdown) else 1.0
        factors.append(slowdown * (1.0 if share is None or full is None else full / share))
    return factors


def _rank_hosts(config) -> tuple[int, list[int]]:
    """The cluster's host count and each rank's host (ranks: servers first, then workers)."""
    layout = host_ranks(config.cluster, config.servers, config.workers)
    host = [0] * (config.servers + config.workers)
    for h, ranks in enumerate(layout):
        for r in ranks:
            host[r] = h
    return len(layout), host


def _compute(config, costs: Costs, worker: int, factor: float) -> Callable[[], float]:
    """Worker `worker`'s seconds per step: the calibrating run's measurements replayed
    (worker i replays its worker i mod N, looping; calibrate.py stored them unstretched),
    or what the config's emulated compute would draw, stretched by `factor`
    (compute_stretch)."""
    draw = replay(costs.compute, worker) if costs.compute else compute_times(config, worker)
    if draw is None:
        raise ConfigError("the simulator needs each step's compute time: emulated compute "
                          "(--compute-time) or a run to calibrate on (--calibrate)")
    return (lambda: draw() * factor) if factor != 1.0 else draw


def drawn(draw: Callable[[], float], chunk: int) -> Iterator[float]:
    """The successive values of `draw`, drawn `chunk` at a time: the same values in the same
    order, without calling `draw` while others' draws run in between."""
    return itertools.chain.from_iterable(array("d", [draw() for _ in range(chunk)])
                                         for _ in itertools.count())
