"""The emulated-cluster launcher: the job's ranks started by torchrun inside each host's
namespace, exactly as on a real cluster (`torchrun --nnodes H --node-rank h ... -m
polyrhythm.node`), with each host's processes in its CPU group.

The launcher makes the run record and the cluster (unless a standing one of the same shape
is up), watches the hosts' torchruns, and stops and removes everything when the run ends,
fails or is interrupted; a janitor process does so if the launcher itself is killed. While
the run goes on, the fidelity guard samples whether the emulator was the bottleneck; its
verdict is added to the run's summary (`cluster`).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from polyrhythm.config.emulation import host_ranks
from polyrhythm.errors import RunFailed
from polyrhythm.launch.cgroups import CpuGroup
from polyrhythm.launch.cluster import ClusterShape, EmulatedCluster, standing_of_shape
from polyrhythm.launch.fidelity import FidelityGuard
from polyrhythm.launch.janitor import Janitor
from polyrhythm.launch.local import (
    CHILD_ENVIRONMENT,
    GRACE_S,
    raise_interrupt,
    recorded_failure,
    signal_handlers,
)
from polyrhythm.metrics.records import RunRecord, amend_run, read_summary

PORT = 29500
POLL_S = 0.2


def launch_emulated(config, record: RunRecord, show_progress: bool = False) -> dict:
    """Run the job on an emulated cluster; return the summary or raise RunFailed."""
    shape = ClusterShape.of(config.cluster)
    cluster = standing_of_shape(shape)
    own = cluster is None
    cluster = cluster or EmulatedCluster.temporary(shape)
    layout = host_ranks(config.cluster, config.servers, config.workers)
    janitor = Janitor(cluster, own, record)
    hosts: list[subprocess.Popen] = []
    groups: list[CpuGroup] = []
    try:
        with signal_handlers(sigterm=raise_interrupt):
            if own:
                cluster.up()
            groups = cluster.run_groups(record.run_id)
            guard = FidelityGuard([g.threads for g in groups], list(shape.cpu)).start()
            port = PORT if own else random.randint(20000, 60000)
            hosts = [_start(cluster, h, len(ranks), port, record, groups[h])
                     for h, ranks in enumerate(layout)]
            _supervise(hosts, layout, record, show_progress)
            ended = (record.dir / "summary.json").stat().st_mtime  # rank 0 wrote it last
            fidelity = guard.stop(ended - read_summary(record)["wall_s"], ended)
        return amend_run(record, {"cluster": {"name": cluster.name if not own else None,
                                              "placement": config.cluster.placement,
                                              "layout": layout,
                                              "bandwidth": list(shape.bandwidth),
                                              **fidelity}})
    except BaseException as exc:
        raise recorded_failure(record, exc) from None
    finally:
        with signal_handlers(sigterm=signal.SIG_IGN, sigint=signal.SIG_IGN):
            _stop(hosts)
            for group in groups:
                group.remove()
            if own:
                cluster.down()
            janitor.dismiss()


def _start(cluster: EmulatedCluster, host: int, ranks: int, port: int, record: RunRecord,
           group: CpuGroup) -> subprocess.Popen:
    """Host `host`'s torchrun, in its namespace and CPU group, logging to logs/host<h>.log."""
    link = cluster.links[host]
    torchrun = [sys.executable, "-m", "torch.distributed.run",
                "--nnodes", str(cluster.shape.hosts), "--node-rank", str(host),
                "--nproc-per-node", str(ranks), "--master-addr", cluster.links[0].address,
                "--master-port", str(port), "--max-restarts", "0",
                "-m", "polyrhythm.node", str(record.dir / "config.toml"),
                "--run-id", record.run_id]
    # Gloo finds its address from the interface, not the machine's host name (which
    # resolves to an address no namespace has).
    env = {**CHILD_ENVIRONMENT, **os.environ, "GLOO_SOCKET_IFNAME": link.device,
           "PYTHONUNBUFFERED": "1"}
    log = open(record.dir / "logs" / f"host{host}.log", "ab")  # noqa: SIM115 (child's)
    procs = str(group.path / "cgroup.procs").encode()
    with log:
        return subprocess.Popen(cluster.command(host, torchrun), env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=lambda: _join(procs))


def _join(procs: bytes) -> None:
    """(In the child, before exec.) Move this process into its host's CPU group."""
    fd = os.open(procs, os.O_WRONLY)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)


def _supervise(hosts: list[subprocess.Popen], layout: list[list[int]], record: RunRecord,
               show_progress: bool) -> None:
    shown = [0] * len(hosts)
    while True:
        codes = [p.poll() for p in hosts]
        if show_progress:
            _show_progress(record, shown)
        failed = [h for h, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            raise RunFailed(_failure(failed[0], codes[failed[0]], layout, record))
        if all(code == 0 for code in codes):
            return
        time.sleep(POLL_S)


def _log_lines(record: RunRecord, host: int) -> list[str]:
    path = record.dir / "logs" / f"host{host}.log"
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def _show_progress(record: RunRecord, shown: list[int]) -> None:
    """Echo the epoch lines the hosts' workers log (polyrhythm.node prints one per epoch)."""
    for host in range(len(shown)):
        lines = _log_lines(record, host)
        for line in lines[shown[host]:]:
            if line.lstrip().startswith("[worker"):
                print(f"host {host} {line.strip()}", file=sys.stderr, flush=True)
        shown[host] = len(lines)


def _failure(host: int, code: int, layout: list[list[int]], record: RunRecord) -> str:
    errors = [line.split("polyrhythm: error: ", 1)[1] for line in _log_lines(record, host)
              if "polyrhythm: error: " in line]
    why = errors[0] if errors else f"torchrun exit code {code}"
    return (f"host {host} (ranks {', '.join(map(str, layout[host]))}) failed: {why} (log: "
            f"{Path(record.dir) / 'logs' / f'host{host}.log'})")


def _stop(hosts: list[subprocess.Popen]) -> None:
    """SIGTERM each host's torchrun (it stops its ranks), then SIGKILL what is left (the
    caller then empties the CPU groups)."""
    for p in hosts:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in hosts:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, deadline - time.monotonic()))
        if p.poll() is None:
            p.kill()
            p.wait()
