"""The emulated-cluster launcher: the job's ranks started by torchrun inside each host's
namespace, exactly as on a real cluster (`torchrun --nnodes H --node-rank h ... -m
polyrhythm.node`, or a user's script: `RankProgram`), with each host's processes in its CPU
group.

The launcher makes the run record and the cluster (unless a standing one of the same shape
is up), watches the hosts' torchruns, and stops and removes everything when the run ends,
fails or is interrupted; a janitor process does so if the launcher itself is killed. A
failed run is resumed on a cluster of its shape (`node_program`'s ranks go on from its
newest usable checkpoint). With on_worker_failure = continue, a host whose ranks were all
workers, lost (killed, or cut off), is gone without ending the run, as the local launcher
goes on without a lost worker; a failure is explained by the rank that raised an error of
its own, else by a host whose link is down, else by a host killed. While
the run goes on, the fidelity guard samples whether the emulator was the bottleneck; its
verdict is added to the run's summary (`cluster`).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from polyrhythm.config.emulation import host_ranks
from polyrhythm.config.servers import CONTINUE
from polyrhythm.context import Topology
from polyrhythm.errors import ClusterError, RunFailed
from polyrhythm.launch.cluster.cgroups import CpuGroup
from polyrhythm.launch.cluster.fidelity import FidelityGuard
from polyrhythm.launch.cluster.hosts import ClusterShape, EmulatedCluster, standing_of_shape
from polyrhythm.launch.cluster.janitor import Janitor
from polyrhythm.launch.process.failures import (
    Kind,
    cause,
    clear_reports,
    completed_summary,
    have_left,
    how,
    left_behind,
    never_joined,
    rank_failed,
    read_reports,
    recorded_failure,
)
from polyrhythm.launch.process.forkserver import CHILD_ENVIRONMENT
from polyrhythm.launch.process.signals import raise_interrupt, signal_handlers
from polyrhythm.launch.process.supervisor import Popened, Supervisor, stop
from polyrhythm.launch.rank.gate import SECRET_VARIABLE, new_secret
from polyrhythm.metrics.records import RunRecord, amend_run, read_summary
from polyrhythm.runtime.checkpoint import Resume, resumed_config

PORT = 29500
POLL_S = 0.2
RENDEZVOUS_TIMEOUT_S = 120  # a host that cannot reach host 0 fails after this, not 600 s


@dataclass(frozen=True)
class RankProgram:
    """What every rank runs under its host's torchrun, and what the launcher shows of it.

    `argv`: torchrun's arguments after its own (a module or a script, and its arguments);
    `environment(host)`: what host `host`'s ranks find in their environment beside the
    launcher's; `labelled`: torchrun starts each line a rank writes with `[default<its local
    rank>]:`, so that a host's log tells its ranks apart; `show(host, line)`: shows a line of
    host `host`'s log, or passes it over; `script`: a user's script (resumed with `polyrhythm
    run --resume`), not polyrhythm train's job."""

    argv: tuple[str, ...]
    environment: Callable[[int], dict[str, str]]
    labelled: bool
    show: Callable[[int, str], None]
    script: bool = False


def node_program(config, record: RunRecord, resume: Resume | None = None) -> RankProgram:
    """`polyrhythm train`'s job: every rank runs polyrhythm.node, whose workers each log a
    line an epoch; the launcher shows those, each with its host. Resumed (`resume`, the
    checkpoint the launcher chose), every rank goes on from the run's newest usable
    checkpoint, which nothing writes any more, so each finds that one too."""
    if resume is None:
        argv = (str(record.dir / "config.toml"), "--run-id", record.run_id)
    else:
        argv = (str(resumed_config(config, record.dir)), "--run-id", record.run_id,
                "--resume", record.run_id)
    return RankProgram(("-m", "polyrhythm.node", *argv), lambda host: {}, False,
                       _show_epoch_line)


def _show_epoch_line(host: int, line: str) -> None:
    if line.lstrip().startswith("[worker"):
        print(f"host {host} {line.strip()}", file=sys.stderr, flush=True)


def launch_emulated(config, record: RunRecord, show_progress: bool = False,
                    program: RankProgram | None = None, resume: Resume | None = None) -> dict:
    """Run the job on an emulated cluster, each rank running `program` (polyrhythm.node by
    default, going on from `resume` if given); return the summary or raise RunFailed."""
    program = program or node_program(config, record, resume)
    clear_reports(record.dir)  # an earlier launch's, which would name its failures
    shape = ClusterShape.of(config.cluster)
    layout = host_ranks(config.cluster, config.servers, config.workers)
    own: EmulatedCluster | None = None
    janitor: Janitor | None = None
    hosts: list[Popened] = []
    groups: list[CpuGroup] = []
    guard: FidelityGuard | None = None
    try:
        with signal_handlers(sigterm=raise_interrupt):
            cluster = standing_of_shape(shape)
            if cluster is None:
                cluster = own = EmulatedCluster.temporary(shape)
            else:  # someone made it and may be using it: say so, not leave them to guess
                print(f"polyrhythm: on the standing cluster {cluster.name!r} "
                      f"({shape.summary()}), not one of the run's own", file=sys.stderr)
            janitor = Janitor(cluster, own is not None, record)
            if own is not None:
                own.up()
            groups = cluster.run_groups(record.run_id)
            port = PORT if own is not None else random.randint(20000, 60000)
            secret = new_secret()  # the ranks' proof at rank 0's gate (launch/rank/gate.py)
            for host, ranks in enumerate(layout):
                hosts.append(Popened(_start(cluster, host, len(ranks), port, record,
                                            groups[host], program, secret), tuple(ranks)))
            guard = FidelityGuard([g.threads for g in groups], list(shape.cpu)).start()
            topology = Topology(config.servers, config.workers)
            EmulatedSupervisor(hosts, topology, record, program.show if show_progress else None,
                               cluster, carry_on=config.on_worker_failure == CONTINUE,
                               min_workers=config.min_workers).run()
            if program.script and completed_summary(record) is None:
                # A script that never joined its job ran alone in every rank and ended well.
                for rank in range(topology.world_size):
                    if (unjoined := never_joined(record.dir, rank, 0, topology)) is not None:
                        raise unjoined
            fidelity = guard.verdict_over(*read_summary(record)["training_window"])
        return amend_run(record, {"cluster": {"name": None if own else cluster.name,
                                              "placement": config.cluster.placement,
                                              "layout": layout,
                                              "bandwidth": list(shape.bandwidth),
                                              "tcp": cluster.network.congestion_control(),
                                              **fidelity}})
    except BaseException as exc:
        if isinstance(exc, RunFailed) and (summary := completed_summary(record)) is not None:
            return summary  # a host lost once the run was recorded, as the job left
        raise recorded_failure(record, exc, config, script=program.script) from None
    finally:
        with signal_handlers(sigterm=signal.SIG_IGN, sigint=signal.SIG_IGN):
            _tear_down(hosts, groups, own, guard, janitor)


def _tear_down(hosts: list[Popened], groups: list[CpuGroup],
               own: EmulatedCluster | None, guard: FidelityGuard | None,
               janitor: Janitor | None) -> None:
    """Stop the hosts, remove the run's groups and (if the run made it) the cluster, each
    step whatever the others do. If any failed, the janitor tries again at once, as if the
    launcher had been killed; if it cannot either, one ClusterError says what to run."""
    if guard is not None:
        guard.stop()
    steps = [lambda: stop(hosts), *(group.remove for group in groups)]
    if own is not None:
        steps.append(own.down)
    failed = []
    for step in steps:
        try:
            step()
        except Exception as exc:
            failed.append(exc)
    if janitor is not None and not failed:
        janitor.dismiss()
    elif failed and (janitor is None or not janitor.clean_up_now()):
        raise ClusterError(f"could not remove all the run made ({failed[0]}); "
                           "`polyrhythm cluster down --all` removes it")


def _start(cluster: EmulatedCluster, host: int, ranks: int, port: int, record: RunRecord,
           group: CpuGroup, program: RankProgram, secret: str) -> subprocess.Popen:
    """Host `host`'s torchrun, in its namespace and CPU group, logging to logs/host<h>.log;
    its ranks are given the run's `secret`."""
    link = cluster.links[host]
    # torchrun's own files (each rank's error file; a labelled rank's output) go with the
    # run's logs: without --log-dir it makes a folder in /tmp each time and leaves it there.
    torchrun = [sys.executable, "-m", "torch.distributed.run",
                "--nnodes", str(cluster.shape.hosts), "--node-rank", str(host),
                "--nproc-per-node", str(ranks), "--master-addr", cluster.links[0].address,
                "--master-port", str(port), "--max-restarts", "0",
                "--rdzv-conf", f"timeout={RENDEZVOUS_TIMEOUT_S}",
                "--log-dir", str(record.dir / "logs" / f"torchrun-host{host}"),
                *(["--tee", "3"] if program.labelled else []), *program.argv]
    # Gloo finds its address from the interface, not the machine's host name (which
    # resolves to an address no namespace has).
    env = {**CHILD_ENVIRONMENT, **os.environ, **program.environment(host),
           "GLOO_SOCKET_IFNAME": link.device, "PYTHONUNBUFFERED": "1", SECRET_VARIABLE: secret}
    # The shell moves itself into the host's CPU group, then becomes the command: the group
    # holds the host's processes from their start, and no Python runs in the child before
    # exec (a preexec_fn is unsafe once threads run).
    command = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group.path / "cgroup.procs"),
               *cluster.command(host, torchrun)]
    with open(_host_log(record, host), "ab") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


class EmulatedSupervisor(Supervisor):
    """The supervisor of the hosts' torchruns (launch/process/supervisor.py), each running
    its host's ranks: torchrun ends a host's every rank when one dies, so a lost worker is
    a lost host, and the run goes on without it only where every rank there was a worker
    lost (on_worker_failure = continue). The hosts' logs are shown as they grow (`show`);
    a failure is explained by a rank's own error, else a host whose link is down, else a
    host killed (`_failure`)."""

    poll_s = POLL_S

    def __init__(self, hosts: list[Popened], topology: Topology, record: RunRecord,
                 show: Callable[[int, str], None] | None, cluster: EmulatedCluster,
                 carry_on: bool, min_workers: int = 1) -> None:
        super().__init__(hosts, topology, record, carry_on, min_workers)
        self.show, self.cluster, self.shown = show, cluster, [0] * len(hosts)
        self.layout = [list(h.ranks) for h in hosts]  # each host's ranks

    def look(self) -> None:
        if self.show is not None:  # after the poll: a host that has ended has written its all
            _show_progress(self.record, self.shown, self.show)

    def log_of(self, rank: int) -> Path:
        return _host_log(self.record, self._host(rank))

    def code_of(self, rank: int) -> int | None:
        """Rank `rank`'s exit code, None while it runs. A host's torchrun exits 1 when a rank
        of it dies (ending the others): a rank that reported a failure gives 1; one that did
        not, the code torchrun's log gives it (negative: the signal that killed it), else
        SIGKILL's (ended by its torchrun). A host's torchrun killed: its own signal."""
        host = self._host(rank)
        code = self.procs[host].poll()
        if code in (None, 0):
            return code
        if rank in self.reports():
            return 1
        if code < 0:
            return code
        said = _exit_in_log(_host_log(self.record, host), self.layout[host].index(rank))
        return -signal.SIGKILL if said is None else said

    def say_lost(self, ranks: list[int], line: str) -> None:
        host = self._host(ranks[0])
        self._say_lost(host, _why(host, self.code_of(ranks[0]), self.layout, self.record,
                                  self.cluster), "the others go on")

    def done(self) -> bool:
        """A worker the completed run went on without may still run (frozen, cut off), and
        the others' torchruns wait for a lost host's at their end (torchrun's exit barrier,
        five minutes): once every rank but those has done its part, the run is done."""
        if not self.carry_on:
            return False  # no worker is gone without ending the run
        behind = left_behind(self.record)
        left = [h for h, p in enumerate(self.procs) if not set(p.ranks) <= self.lost]
        if not (self.lost or behind) or not have_left(
                self.record.dir, [r for h in left for r in self.procs[h].ranks
                                  if r not in behind]):
            return False
        for h in (h for h in left if set(self.procs[h].ranks) <= behind):  # not ended itself
            self._say_lost(h, "its link is down" if h in self.cluster.links_down()
                           else "it fell silent", "the run went on without it")
        return True

    def explain(self, proc: Popened) -> RunFailed:
        return _failure(self.procs.index(proc), self.layout, self.topology, self.record,
                        self.procs, self.cluster)

    def _host(self, rank: int) -> int:
        return next(h for h, p in enumerate(self.procs) if rank in p.ranks)

    def _say_lost(self, host: int, why: str, then: str) -> None:
        names = ", ".join(map(self.topology.describe, self.procs[host].ranks))
        print(f"polyrhythm: host {host} ({names}) lost: {why}; {then}", file=sys.stderr,
              flush=True)


def _why(host: int, code: int, layout: list[list[int]], record: RunRecord,
         cluster: EmulatedCluster) -> str:
    """How host `host` was lost (`code`: its first rank's exit, EmulatedSupervisor.code_of),
    for a line that starts with it."""
    if host in cluster.links_down():
        return "its link is down"
    reports = read_reports(record.dir)
    said = [reports[r] for r in layout[host] if r in reports]
    return how(code if code < 0 or not said else 1, said[0] if said else None,
               _host_log(record, host))


def _exit_in_log(log: Path, local_rank: int) -> int | None:
    """The exit code torchrun's failure summary in `log` gives its rank `local_rank` (a
    block of `rank : R (local_rank: L)` then `exitcode : -9 (pid: P)`); None if none."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = re.findall(rf"\(local_rank: {local_rank}\)\s*\n\s*exitcode\s*:\s*(-?\d+)", text)
    return int(found[-1]) if found else None


def _host_log(record: RunRecord, host: int) -> Path:
    return record.dir / "logs" / f"host{host}.log"


def _show_progress(record: RunRecord, shown: list[int], show: Callable[[int, str], None]
                   ) -> None:
    """Hand `show` the lines the hosts' logs gained, reading each log from where the last
    look stopped (`shown`: bytes, per host)."""
    for host in range(len(shown)):
        path = _host_log(record, host)
        if not path.exists():
            continue
        with open(path, "rb") as log:
            log.seek(shown[host])
            new = log.read()
        complete = new[:new.rfind(b"\n") + 1]  # a line still being written waits
        shown[host] += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            show(host, line)


def _failure(host: int, layout: list[list[int]], topology: Topology, record: RunRecord,
             hosts: list, cluster: EmulatedCluster) -> RunFailed:
    """What ended the run, from the reports the ranks left (launch/process/failures.py): a rank that
    diverged or raised an error of its own, wherever it ran; else a host cut off (its link
    down), whose peers heard nothing from it; else a host killed (its peers only lost it),
    or the host whose torchrun failed (`host`), with what its ranks reported (a rank killed
    by a signal reports nothing: its torchrun's log says which)."""
    failures = read_reports(record.dir)
    own = [r for r, f in failures.items() if f.kind in (Kind.DIVERGED, Kind.BUG, Kind.USER)]
    if own:
        first = cause(own, {}, failures)
        where = next(h for h, ranks in enumerate(layout) if first in ranks)
        return rank_failed(first, None, failures[first], _host_log(record, where), topology)
    down = cluster.links_down()

    def killed_by(h: int) -> int | None:
        """The signal that ended host `h`'s torchrun, or (it ended itself, exit code 1) a
        rank of it that reported nothing, as its log says; None: neither."""
        code = hosts[h].poll() or 0
        if code <= 0:
            return code or None
        ends = [_exit_in_log(_host_log(record, h), i) for i, r in enumerate(layout[h])
                if r not in failures]
        return next((c for c in ends if c is not None and c < 0), None)

    killed = [h for h in range(len(hosts)) if killed_by(h) is not None]
    host = (down or killed or [host])[0]
    ranks = ", ".join(map(str, layout[host]))
    if down:
        return RunFailed(f"host {host} (ranks {ranks}) was cut off: its link is down, and "
                         "its peers heard nothing from it within the timeout (--timeout)")
    said = [f"failed: {failures[r].error[:300]}" for r in layout[host] if r in failures]
    code = killed_by(host) or hosts[host].poll()
    why = (said or [how(code, None, "") if code < 0 else f"failed: torchrun exit code {code}"])
    return RunFailed(f"host {host} (ranks {ranks}) {why[0]} (log: {_host_log(record, host)})")
