"""polyrhythm's PowerSGD against PyTorch's own PowerSGD hook, on an emulated 100 mbit link.

The same script (examples/char_lm.py) on two emulated clusters of the same shape, 2 hosts with
a 100 mbit link each and a worker on each, side by side:

- polyrhythm: `polyrhythm run --hosts 2 --workers 2 --bandwidth 100mbit --strategy allreduce
  --compress powersgd --rank R`, which makes its own cluster;
- DDP: a cluster this script makes (launch/cluster/hosts.py's EmulatedCluster, as polyrhythm's
  launcher makes one) with each host's `torchrun --nnodes 2 --node-rank h --nproc-per-node 1`
  started in its namespace, as launch/launchers/emulated.py starts a host's, running the script's
  `--ddp --powersgd R` (DistributedDataParallel with torch's powerSGD_hook at rank R, error
  feedback and warm start).

Targets: polyrhythm's samples/s at least 0.95 of DDP's (the median of the paired ratios over
the repeats), and its final validation accuracy (the share of the validation text's next
characters the model predicts) within 0.5 points of DDP's.

The script's arguments: width 128 (431,463 values, 1.7 MB: at 100 mbit a dense all-reduce of
the gradient between 2 hosts takes about as long as a step's compute here; PowerSGD at rank 4
sends about 5 % of it) and `--clip 0`: char_lm clips each worker's own gradient under
polyrhythm, before the exchange, and the averaged one under DDP, after it, a difference by
design that would blur the comparison of the two compressions. Both sides run the same 200
steps on the same batches from the same initial model, and are timed by the script itself
(`--measure-after`: worker 0's samples/s over the steps after the first 20, start-up and
validation left out; the hook's first 2 steps, which it sends uncompressed, are among those
left out).

Method (as benchmarks/script.py): the two jobs run at the same time, each pinned to a core of
its own with all its processes (launchers, torchruns, ranks) and one torch thread a rank, so
both see the same drift in the speed of a shared machine; the cores swap between repeats.
With a single usable core the two jobs run in turn. Each repeat's line says how many cores
other work kept busy meanwhile (benchmarks/machine_load.py). A repeat where a job failed is
reported on a note line and left out.

Nothing of the clusters is left behind: polyrhythm's launcher removes its own; this script
removes the DDP side's in a `finally`, after a failure or an interrupt (Ctrl-C, SIGTERM) too.
The polyrhythm side is kept from a standing cluster of the same shape (`polyrhythm cluster
up`), which it would otherwise use instead of its own: it sees an empty state folder
(POLYRHYTHM_STATE_DIR), and its summary must name no standing cluster. The DDP side's
cluster is not a standing one (it is not described in the state folder), so it is never
taken for one.

Needs root, ip and tc (an emulated cluster); without them it prints SKIP and the reason.

    python benchmarks/compression.py            # about 4 minutes on 2 idle cores
    python benchmarks/compression.py --quick    # smoke run: a small model, a few steps
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from machine_load import OtherLoad, shared_warning  # benchmarks/, this script's folder
from polyrhythm.errors import ClusterError
from polyrhythm.launch.cluster.hosts import ClusterShape, EmulatedCluster, can_emulate
from script import ERROR, MEASURED, SCRIPT, end_session, parse_paired  # benchmarks/script.py

HOSTS, BANDWIDTH = 2, "100mbit"
SHAPE = ClusterShape(HOSTS, (BANDWIDTH,) * HOSTS, (None,) * HOSTS)
PORT = 29500  # the DDP cluster's own: no other job is in its namespaces
RENDEZVOUS_TIMEOUT_S = 120
RUN_TIMEOUT_S = 600
RATE_TARGET = 0.95  # polyrhythm's samples/s over DDP's, at least
ACCURACY_TARGET = 0.5  # points of final validation accuracy, at most apart
# What char_lm.py's worker 0 prints after each epoch's validation. Not anchored at the end:
# a line torchrun's --tee passes on (polyrhythm run --hosts) now and then ends in its next
# line's mark ("[default0]:"), when it read the line before the rank had written its end.
VALIDATED = re.compile(r"^val_loss \d+(?:\.\d+)? val_accuracy (\d+(?:\.\d+)?)")
MODEL = ["--width", "128", "--clip", "0"]
# A smaller model on the first 50,000 characters: a quick run is mostly start-up anyway.
QUICK_MODEL = ["--width", "32", "--layers", "1", "--chars", "50000", "--clip", "0"]
POLYRHYTHM, DDP = "polyrhythm allreduce + powersgd", "DDP + powerSGD_hook"


class JobFailed(Exception):
    """A job that ended without its figures: one line saying why."""


@dataclass
class Figures:
    """One side's figures over the repeats."""

    rates: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)


@dataclass
class Job:
    """One side's processes in one repeat: `procs[0]` prints worker 0's lines into `logs[0]`
    (every process its own log); `cluster`, the one this script made for it, if any."""

    name: str
    procs: list[subprocess.Popen]
    logs: list[Path]
    cluster: EmulatedCluster | None = None

    def wait(self, timeout: float) -> int:
        """Wait for every process; the first non-zero exit code, else 0."""
        codes = [proc.wait(timeout=timeout) for proc in self.procs]
        return next((code for code in codes if code), 0)

    def stop(self) -> None:
        """Stop whatever still runs (SIGTERM, then SIGKILL to its session), then remove the
        cluster made for it, whatever happened before."""
        try:
            for proc in self.procs:
                end_session(proc)
        finally:
            if self.cluster is not None:
                self.cluster.down()
                if self.cluster.network.exists():
                    raise ClusterError(f"the DDP side's cluster {self.cluster.name!r} is still "
                                       "there: `polyrhythm cluster down --all` removes it")


def pinned(core: int):
    """A preexec_fn that pins the child (and everything it starts) to `core`."""
    return lambda: os.sched_setaffinity(0, {core})


def environment(**extra: str) -> dict[str, str]:
    """Every process of both sides: one torch thread, unbuffered output."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def start_polyrhythm(script_args: list[str], rank: int, core: int, out: Path,
                     repeat: int) -> Job:
    """`polyrhythm run` on a cluster of its own, in a session of its own, pinned to `core`."""
    state = out / "no-standing-clusters"  # so that a standing cluster is never taken
    state.mkdir(exist_ok=True)
    log = out / f"polyrhythm-{repeat}.log"
    argv = [sys.executable, "-m", "polyrhythm.cli", "run", "--out", str(out / "runs"),
            "--threads", "1", "--json", "--hosts", str(HOSTS), "--workers", str(HOSTS),
            "--bandwidth", BANDWIDTH, "--strategy", "allreduce", "--compress", "powersgd",
            "--rank", str(rank), str(SCRIPT), "--", *script_args]
    with open(log, "wb") as file:
        proc = subprocess.Popen(argv, env=environment(POLYRHYTHM_STATE_DIR=str(state)),
                                cwd=out, stdout=file, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=pinned(core))
    return Job(POLYRHYTHM, [proc], [log])


def start_ddp(script_args: list[str], rank: int, core: int, out: Path, repeat: int) -> Job:
    """A cluster of the same shape, then each host's torchrun in its namespace and in a CPU
    group of the cluster's (which its removal empties), in a session of its own, pinned to
    `core`: `python -m torch.distributed.run --nnodes 2 --node-rank h ... char_lm.py --ddp
    --powersgd R`, Gloo on the host's link."""
    cluster = EmulatedCluster.temporary(SHAPE)
    job = Job(DDP, [], [], cluster)
    try:
        cluster.up()
        groups = cluster.run_groups("ddp")
        for host, link in enumerate(cluster.links):
            torchrun = [sys.executable, "-m", "torch.distributed.run",
                        "--nnodes", str(HOSTS), "--node-rank", str(host),
                        "--nproc-per-node", "1", "--master-addr", cluster.links[0].address,
                        "--master-port", str(PORT), "--max-restarts", "0",
                        "--rdzv-conf", f"timeout={RENDEZVOUS_TIMEOUT_S}",
                        "--log-dir", str(out / f"ddp-{repeat}-torchrun-host{host}"),
                        str(SCRIPT), "--ddp", "--powersgd", str(rank), *script_args]
            # The shell moves itself into the host's group, then becomes the command.
            command = ["sh", "-c", 'echo $$ > "$0" && exec "$@"',
                       str(groups[host].path / "cgroup.procs"),
                       *cluster.command(host, torchrun)]
            log = out / f"ddp-{repeat}-host{host}.log"
            with open(log, "wb") as file:
                job.procs.append(subprocess.Popen(
                    command, env=environment(GLOO_SOCKET_IFNAME=link.device), cwd=out,
                    stdout=file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, preexec_fn=pinned(core)))
            job.logs.append(log)
    except BaseException:
        job.stop()
        raise
    return job


def figures(job: Job) -> tuple[float, float]:
    """The job's samples/s and final validation accuracy, as worker 0 printed them; JobFailed
    with one line if it failed before printing them. A job that failed after (while it
    ended) keeps its figures, and a note line says so."""
    try:
        code = job.wait(RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise JobFailed(f"{job.name}: no result within {RUN_TIMEOUT_S} s (its output: "
                        f"{kept_logs(job)})") from None
    lines = job.logs[0].read_text(errors="replace").splitlines()
    measured = [i for i, line in enumerate(lines) if MEASURED.match(line)]
    validated = [VALIDATED.match(line) for line in lines if VALIDATED.match(line)]
    if job.name == POLYRHYTHM and code == 0:  # --json: its summary is its last JSON line
        summary = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
        if summary["cluster"]["name"] is not None:
            raise JobFailed(f"{job.name} ran on the standing cluster "
                            f"{summary['cluster']['name']!r}, not one of its own")
    if code == 0 and len(measured) == 1 and validated:
        return float(MEASURED.match(lines[measured[0]]).group(1)), float(validated[-1].group(1))
    saved = kept_logs(job)
    if len(measured) != 1 or not validated:
        said = [line for log in job.logs for line in log.read_text(errors="replace")
                .splitlines() if ERROR.match(line)] or lines or ["no output"]
        if code == 0:
            missing = [what for what, found in (("samples/s line", len(measured) == 1),
                                                ("val_accuracy line", validated)) if not found]
            said = [f"worker 0 printed no {' and no '.join(missing)}"]
        raise JobFailed(f"{job.name} failed (exit code {code}): {said[-1]} (its output: "
                        f"{saved})")
    after = lines[measured[0] + 1:] or ["nothing printed"]
    print(f"  note: {job.name} failed after training, as it ended (exit code {code}): "
          f"{after[0]} (its output: {saved}); its figures stand", flush=True)
    return float(MEASURED.match(lines[measured[0]]).group(1)), float(validated[-1].group(1))


def kept_logs(job: Job) -> str:
    """The job's logs, copied out of the benchmark's folder (removed at the end)."""
    fd, path = tempfile.mkstemp(prefix="polyrhythm-compression-bench-", suffix=".log")
    with os.fdopen(fd, "w") as file:
        for log in job.logs:
            file.write(f"==> {log.name} <==\n{log.read_text(errors='replace')}\n")
    return path


def measure(script_args: list[str], rank: int, cores: list[int], repeat: int, out: Path,
            sides: dict[str, Figures]) -> tuple[bool, float | None]:
    """One paired repeat: polyrhythm on one core, DDP on the other (the cores swap between
    repeats), or in turn on a single core (the order swapping instead). Each side's figures
    go into `sides`. Whether the repeat completed, and the other load in cores (None where
    /proc/stat cannot say); a failed job is a note line and leaves the repeat out."""
    starts = [(POLYRHYTHM, start_polyrhythm), (DDP, start_ddp)]
    if repeat % 2:
        starts.reverse()
    rounds = ([list(zip(starts, cores, strict=True))] if len(cores) > 1 else
              [[(start, cores[0])] for start in starts])
    got: dict[str, tuple[float, float]] = {}
    try:
        with OtherLoad() as load:
            for jobs in rounds:
                got |= run_together(jobs, script_args, rank, out, repeat)
    except JobFailed as failed:
        print(f"  note: repeat {repeat + 1}: {failed}; the repeat is left out", flush=True)
        return False, None
    for name, (rate, accuracy) in got.items():
        sides[name].rates.append(rate)
        sides[name].accuracies.append(accuracy)
    return True, load.cores


def run_together(jobs: list[tuple], script_args: list[str], rank: int, out: Path,
                 repeat: int) -> dict[str, tuple[float, float]]:
    """Start every ((name, start), core) of `jobs` at once; each side's figures by name."""
    started: list[Job] = []
    try:
        for (_, start), core in jobs:
            started.append(start(script_args, rank, core, out, repeat))
        return {job.name: figures(job) for job in started}
    finally:
        for job in started:
            job.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=4,
                        help="PowerSGD's rank on both sides (default 4)")
    args = parse_paired(parser, argv, "steps per run, warm-up included (default 200)")
    if args.rank < 1:
        parser.error("--rank must be at least 1")
    return args


def results(sides: dict[str, Figures], target_rate: float, target_points: float) -> list[str]:
    """The median of the paired ratios of samples/s and of the paired differences of final
    accuracy, each against its target, with the repeats' range and each side's medians."""
    ours, theirs = sides[POLYRHYTHM], sides[DDP]
    ratios = [p / d for p, d in zip(ours.rates, theirs.rates, strict=True)]
    points = [100 * (p - d) for p, d in zip(ours.accuracies, theirs.accuracies, strict=True)]
    ratio, apart = statistics.median(ratios), statistics.median(points)
    return [
        f"samples/s {POLYRHYTHM} / {DDP}: {ratio:.3f} (target >= {target_rate:.2f}) "
        f"{'PASS' if ratio >= target_rate else 'MISS'}  [repeats: {min(ratios):.3f}-"
        f"{max(ratios):.3f}; median samples/s {statistics.median(ours.rates):.1f} and "
        f"{statistics.median(theirs.rates):.1f}]",
        f"final validation accuracy {POLYRHYTHM} - {DDP}: {apart:+.2f} points (target within "
        f"{target_points:.2f}) {'PASS' if abs(apart) <= target_points else 'MISS'}  "
        f"[repeats: {min(points):+.2f} to {max(points):+.2f}; median accuracy "
        f"{statistics.median(ours.accuracies):.4f} and "
        f"{statistics.median(theirs.accuracies):.4f}]",
    ]


def interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        can_emulate()
    except ClusterError as exc:
        print(f"{POLYRHYTHM} / {DDP} on an emulated cluster: SKIP ({exc})")
        return 0
    script_args = ["--steps", str(args.steps), "--measure-after", str(args.warmup),
                   "--log-every", "0", *(QUICK_MODEL if args.quick else MODEL)]
    cores = sorted(os.sched_getaffinity(0))[:2]
    how = "side by side, one core each" if len(cores) > 1 else "in turn on one core"
    print(f"examples/char_lm.py {' '.join(script_args)}: {HOSTS} hosts at {BANDWIDTH}, "
          f"powersgd rank {args.rank}, {args.repeats} repeats, {how}, 1 torch thread a "
          "process", flush=True)
    sides = {POLYRHYTHM: Figures(), DDP: Figures()}
    loads = []
    signal.signal(signal.SIGTERM, interrupted)  # stop as on Ctrl-C: every cluster removed
    with tempfile.TemporaryDirectory(prefix="polyrhythm-compression-bench-") as out:
        for repeat in range(args.repeats):
            completed, load = measure(script_args, args.rank, cores, repeat, Path(out), sides)
            if not completed:
                continue
            if load is not None:
                loads.append(load)
            ours, theirs = sides[POLYRHYTHM], sides[DDP]
            print(f"  repeat {repeat + 1}/{args.repeats}  {POLYRHYTHM} {ours.rates[-1]:.1f}/s "
                  f"accuracy {ours.accuracies[-1]:.4f}  {DDP} {theirs.rates[-1]:.1f}/s "
                  f"accuracy {theirs.accuracies[-1]:.4f}  ratio "
                  f"{ours.rates[-1] / theirs.rates[-1]:.3f}  other load "
                  f"{f'{load:.2f}' if load is not None else '?'} cores", flush=True)
    if not sides[DDP].rates:
        print("no repeat completed: nothing to compare", file=sys.stderr)
        return 1
    for line in results(sides, RATE_TARGET, ACCURACY_TARGET):
        print(line)
    if args.quick:
        print("--quick is a smoke run: too short for the figures to mean much")
    warning = shared_warning(loads)
    if warning:
        print(f"{warning}: side by side, other work may sit beside one job more than the "
              "other, which moves a ratio either way")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every job was stopped, its cluster removed
        sys.exit("compression benchmark: interrupted; its jobs stopped and clusters removed")
