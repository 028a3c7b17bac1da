"""How a run is emulated: on a cluster of hosts inside this machine (the [cluster] section)
and with compute replaced by a sleep (compute = "emulated").

    [cluster]
    hosts = 4                    # network namespaces, one address each, on one bridge
    bandwidth = "100mbit"        # each host's link, each way (tc tbf); or one per host
    cpu = [1.0, 1.0, 0.5, 0.25]  # each host's CPU share in cores (cgroup quota)
    latency = "20ms"             # added to every message by the transport
    placement = "dedicated"      # servers on hosts of their own, or "collocated"

`workers_per_host` instead of `hosts` sizes the cluster from the run (one host per
`workers_per_host` workers, plus one per server when dedicated), so a sweep over workers
keeps the shape. Ranks are placed on hosts by `host_ranks`: the local launcher, torchrun on a
real cluster and the emulated cluster all follow it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from polyrhythm.errors import ConfigError
from polyrhythm.limits import (
    MAX_CPU,
    MAX_DELAY_S,
    MAX_RATE_BITS,
    MAX_SLOWDOWN,
    MIN_CPU,
    MIN_RATE_BITS,
)
from polyrhythm.metrics.records import measured_compute
from polyrhythm.settings import Param, Rule, Settings, at_least, each, number, one_of
from polyrhythm.units import DISTRIBUTIONS, Delay, duration, is_duration, is_rate, rate


def _duration_rule() -> Rule:
    return Rule(lambda v, run: is_duration(v) and duration(v) <= MAX_DELAY_S,
                lambda run: "be a duration such as 120ms, at most a day "
                f"({number(MAX_DELAY_S)}s)", MAX_DELAY_S)


def _link_rate(text: str) -> bool:
    return is_rate(text) and MIN_RATE_BITS <= rate(text) <= MAX_RATE_BITS


COMPUTE = (
    Param("compute", str, "real (forward and backward) or emulated (workers sleep instead; "
          "every message stays real and full-size)", "real",
          rule=one_of("real", "emulated")),
    Param("compute_time", str, "emulated compute: time per step, e.g. 120ms",
          metavar="TIME", rule=_duration_rule()),
    Param("compute_jitter", str, "emulated compute: spread of the time per step", "0ms",
          metavar="TIME", rule=_duration_rule()),
    Param("compute_distribution", str, "emulated compute: how the time spreads: normal "
          "(sd = jitter), uniform (± jitter) or exponential (a tail of mean jitter)", "normal",
          rule=one_of(*DISTRIBUTIONS)),
    Param("compute_from", str, "emulated compute: replay the compute times of a stored run "
          "(worker i replays worker i mod N of that run, step by step)", metavar="RUN_ID"),
    Param("slowdown", list, "per-worker compute time factor, one entry per worker (3: a worker "
          "three times slower, by sleeping twice its measured compute time after it), real "
          "or emulated compute", [], item=float,
          rule=each(lambda v: 1 <= v <= MAX_SLOWDOWN,
                    f"of at least 1 (and at most {number(MAX_SLOWDOWN)})", MAX_SLOWDOWN)),
    Param("dies_after_steps", list, "a fault on cue, per worker: its process ends as SIGKILL "
          "ends it right after this many of its steps (0: never), one entry per worker; with "
          "on_worker_failure = continue the others go on without it", [], item=int,
          rule=each(lambda v: v >= 0, "of at least 0")),
)

PLACEMENTS = ("dedicated", "collocated")

CLUSTER = (
    Param("hosts", int, "emulated hosts, each a network namespace of this machine (0: every "
          "rank on loopback)", derived="from workers_per_host if set, else 0",
          rule=at_least(0)),
    Param("workers_per_host", int, "workers on each worker host: sets hosts from the run",
          rule=at_least(1)),
    Param("placement", str, "servers on hosts of their own (dedicated) or one on each worker "
          "host (collocated: servers default to one per worker host)", "dedicated",
          rule=one_of(*PLACEMENTS)),
    Param("bandwidth", list, "each host's link rate each way, e.g. 100mbit (tc tbf): one "
          "value or one per host", [], item=str, metavar="RATE", single=True,
          rule=each(_link_rate, f"such as 100mbit or 1gbit, from {MIN_RATE_BITS / 1e3:g}kbit "
                    f"to {MAX_RATE_BITS / 1e9:g}gbit", MAX_RATE_BITS)),
    Param("cpu", list, "each host's CPU share in cores (cgroup quota): one value or one per "
          "host", [], item=float, metavar="CORES", single=True,
          rule=each(lambda v: MIN_CPU <= v <= MAX_CPU,
                    f"from {number(MIN_CPU)} to {number(MAX_CPU)}", MAX_CPU)),
    Param("latency", str, "extra one-way latency of every message, collectives included "
          "(added by the transport; also on loopback)", "0ms", metavar="TIME",
          rule=_duration_rule()),
    Param("latency_jitter", str, "spread of that latency (normal, cut at zero)", "0ms",
          metavar="TIME", rule=_duration_rule()),
)

_NEEDS_HOSTS = ("workers_per_host", "placement", "bandwidth", "cpu")


def check_compute(run: Settings) -> None:
    """compute = "emulated" takes one source of compute times; real compute takes none."""
    sources = [k for k in ("compute_time", "compute_from") if run[k] is not None]
    if run.compute == "real":
        given = sources + [k for k in ("compute_jitter", "compute_distribution")
                           if run[k] != _default(k)]
        if given:
            raise ConfigError(f"{given[0]} is for emulated compute: add --compute emulated")
    elif len(sources) != 1:
        raise ConfigError("emulated compute needs one of --compute-time (e.g. 120ms) or "
                          "--compute-from RUN_ID" + (", not both" if sources else ""))


def check_waits(run: Settings, cluster: Settings) -> None:
    """A peer waits at most `timeout` for a message: a step's emulated compute time and
    extra delay and a message's latency, as set (their jitter aside), must stay below it, or
    every run of these settings fails naming a peer that only did as it was told."""
    waits = {"compute_time": duration(run.compute_time) if run.compute_time else 0.0,
             "worker_delay_s": max(run.worker_delay_s, default=0.0),
             "latency": duration(cluster.latency)}
    if sum(waits.values()) >= run.timeout:
        given = " + ".join(f"{k} {number(v)}s" for k, v in waits.items() if v)
        raise ConfigError(f"{given} is not below timeout {number(run.timeout)}s: a peer would "
                          "give up waiting on every step; raise --timeout")


def _default(name: str) -> Any:
    return next(p.default for p in COMPUTE if p.name == name)


def collocated_servers(cluster: Settings, workers: int) -> int | None:
    """Servers a collocated cluster defaults to: one on each worker host (k = n)."""
    if cluster.placement != "collocated":
        return None
    if cluster.hosts is not None:
        return cluster.hosts
    if cluster.workers_per_host is not None:
        return math.ceil(workers / cluster.workers_per_host)
    return None


def server_hosts(placement: str, servers: int) -> int:
    """Hosts the servers have to themselves: one each when dedicated, none when collocated."""
    return servers if placement == "dedicated" else 0


def _check_per_host(values: dict[str, Any], hosts: int) -> None:
    """bandwidth and cpu: one value for every host, or one per host."""
    for key in ("bandwidth", "cpu"):
        if len(values[key]) not in (0, 1, hosts):
            raise ConfigError(f"{key} needs one value, or one per host ({hosts}), got "
                              f"{len(values[key])}")


def settle(cluster: Settings, workers: int, servers: int) -> Settings:
    """The cluster with its host count resolved and its settings checked against the run."""
    values = dict(cluster)
    changed = {p.name for p in CLUSTER if values[p.name] != p.default}
    if values["workers_per_host"] is not None:
        wanted = (math.ceil(workers / values["workers_per_host"])
                  + server_hosts(values["placement"], servers))
        if values["hosts"] not in (None, wanted):
            raise ConfigError(f"hosts = {values['hosts']} does not match workers_per_host = "
                              f"{values['workers_per_host']} ({wanted} hosts); give one")
        values["hosts"] = wanted
    hosts = values["hosts"] = values["hosts"] or 0
    if not hosts:
        if unused := [k for k in _NEEDS_HOSTS if k in changed]:
            flag = "--" + unused[0].replace("_", "-")
            raise ConfigError(f"{flag} is for an emulated cluster: add --hosts or "
                              "--workers-per-host")
        return Settings(values)
    if "placement" in changed and not servers:
        raise ConfigError("placement is for strategies with servers; drop --placement")
    holding = hosts - server_hosts(values["placement"], servers)
    if holding < 1:
        raise ConfigError(f"dedicated placement gives each of the {servers} servers a host of "
                          f"its own, so it needs at least {servers + 1} hosts (one more for "
                          f"the workers), got {hosts}")
    if holding > workers:
        raise ConfigError(f"{holding} worker hosts for {workers} workers: a host would "
                          "have no worker; use fewer hosts")
    _check_per_host(values, hosts)
    return Settings(values)


def unemulated_left_out(config: dict[str, Any]) -> dict[str, Any]:
    """A config in sections without the emulation settings it does not use: the emulated
    compute's while compute is real, the cluster's but latency while there are no hosts,
    placement without servers, and [cluster] altogether if nothing is left of it."""
    out = dict(config)
    if out.get("compute") == "real":
        out = {k: v for k, v in out.items()
               if not any(p.name == k and v == p.default for p in COMPUTE)}
    cluster = {k: v for k, v in out.pop("cluster", {}).items() if v is not None}
    if not cluster.get("hosts"):
        cluster = {k: v for k, v in cluster.items()
                   if k.startswith("latency") and v != "0ms"}
    elif not out.get("servers"):
        cluster.pop("placement", None)  # where servers go, without servers
    return out | ({"cluster": cluster} if cluster else {})


def standing_shape(given: dict[str, Any]) -> Settings:
    """The [cluster] settings of a standing cluster (`cluster up`): hosts (at least 1),
    bandwidth and cpu, checked; the others at their defaults."""
    values = {p.name: p.resolve(given.get(p.name), None) for p in CLUSTER}
    extra = set(given) - {"hosts", "bandwidth", "cpu"}
    if extra:
        raise ConfigError(f"a standing cluster is made of hosts, bandwidth and cpu; "
                          f"{sorted(extra)[0]} belongs to a run")
    if not values["hosts"]:
        raise ConfigError("a standing cluster needs --hosts (at least 1)")
    _check_per_host(values, values["hosts"])
    return Settings(values)


def per_host(values: list, hosts: int) -> list:
    """A per-host setting as one entry per host (None where it is not set)."""
    if not values:
        return [None] * hosts
    return list(values) * hosts if len(values) == 1 else list(values)


def host_ranks(cluster: Settings, servers: int, workers: int) -> list[list[int]]:
    """The job's ranks on each host, in host order: servers are ranks 0..S-1, workers follow.

    Dedicated: one host per server, then the workers split evenly over the other hosts.
    Collocated: the workers split evenly over every host, server s on host s mod hosts. On
    no cluster (hosts = 0): one host with every rank."""
    hosts = cluster.hosts
    if not hosts:
        return [list(range(servers + workers))]
    own = server_hosts(cluster.placement, servers)
    base, extra = divmod(workers, hosts - own)
    chunks, start = [], servers
    for j in range(hosts - own):
        size = base + (1 if j < extra else 0)
        chunks.append(list(range(start, start + size)))
        start += size
    if own:
        return [[s] for s in range(servers)] + chunks
    return [[s for s in range(servers) if s % hosts == j] + chunks[j] for j in range(hosts)]


def compute_times(config, worker: int) -> Callable[[], float] | None:
    """Worker `worker`'s source of compute seconds per step, or None for real compute: drawn
    from compute_time (its jitter and distribution, seeded by the run's seed and the worker),
    or replayed from a stored run (worker i replays its worker i mod N, looping). The
    runtime's emulated compute and the simulator draw from it alike."""
    if config.compute != "emulated":
        return None
    if config.compute_from is not None:
        return replay(measured_compute(config.out, config.compute_from), worker)
    delay = Delay(duration(config.compute_time), duration(config.compute_jitter),
                  config.compute_distribution)
    return delay.sampler(config.seed * 100_003 + worker)


def replay(measured: list[list[float]], worker: int) -> Callable[[], float]:
    """Worker `worker`'s steps replayed from per-worker measurements: worker i replays
    measured worker i mod N, looping."""
    return itertools.cycle(measured[worker % len(measured)]).__next__
