"""Ranks started by torchrun and other launchers of torchrun-style ranks (polyrhythm.node):

    torchrun --nnodes 2 --nproc-per-node 3 --rdzv-endpoint HOST:PORT -m polyrhythm.node run.toml

Every rank reads the same config and takes its role from its rank (servers first, then
workers). Rank 0 creates the run record under the config's `out` directory on its host as it
starts (before the rendezvous, so a job that never gathers is recorded as failed too).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from datetime import timedelta

import torch.distributed as dist

from polyrhythm.config import load_config
from polyrhythm.context import Topology
from polyrhythm.errors import ConfigError, PolyrhythmError
from polyrhythm.launch.rank import lifecycle
from polyrhythm.metrics.records import fail_run, start_run, summary_json_line


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise ConfigError(f"{name} is not set: start this module with torchrun") from None


def _log_progress(event: dict) -> None:
    if event["step"] == event["steps"]:  # one line per worker and epoch
        print(f"[worker {event['worker']}] epoch {event['epoch']}/{event['epochs']} "
              f"loss {event['loss']:.4f} {event['samples_per_s']:.1f} samples/s",
              file=sys.stderr, flush=True)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _local_workers(rank: int, servers: int) -> int:
    """Workers on this host: the ranks torchrun started here, less the servers among them."""
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    first = rank - int(os.environ.get("LOCAL_RANK", 0))
    return sum(r >= servers for r in range(first, first + local_size))


def run_node(config_path: str) -> dict | None:
    """Run this rank of a torchrun job; rank 0 returns the completed summary."""
    config = load_config(config_path)
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if world != config.world_size:
        raise ConfigError(f"torchrun started {world} processes but the config needs "
                          f"{config.world_size} ({config.servers} servers + {config.workers} "
                          "workers)")
    record = start_run(config) if rank == 0 else None
    # torchrun stops the surviving ranks with SIGTERM when one fails: let rank 0 record it.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return lifecycle(config, rank,
                         lambda: dist.init_process_group("gloo", timeout=timedelta(seconds=600)),
                         record, progress=_log_progress,
                         local_workers=_local_workers(rank, config.servers))
    except BaseException as exc:
        if record:
            who = Topology(config.servers, config.workers).describe(rank)
            reason = "stopped by torchrun" if isinstance(exc, KeyboardInterrupt) else (
                f"{type(exc).__name__}: {exc}".splitlines()[0])
            fail_run(record, f"rank {rank} ({who}): {reason}")
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polyrhythm.node")
    parser.add_argument("config", help="run config (TOML), the same file on every host")
    args = parser.parse_args(argv)
    try:
        summary = run_node(args.config)
    except PolyrhythmError as exc:
        print(f"polyrhythm: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("polyrhythm: stopped", file=sys.stderr)
        return 130
    except Exception as exc:  # a peer failed, the network broke: one line, torchrun reports
        print(f"polyrhythm: error: {type(exc).__name__}: {exc}".splitlines()[0],
              file=sys.stderr)
        return 1
    if summary:
        print(summary_json_line(summary))
    return 0
