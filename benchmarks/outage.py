"""Link outages on an emulated cluster (issue 25's figures): 2 hosts, the server on one (none
for allreduce), both workers on the other, whose link is taken down during training.

1. Short: down for 5 s, less than --timeout 30, for bsp, asp and allreduce. The run must
   complete; the figure is its wall time against the same run's without an outage, run at
   the same time on a second cluster, each launcher pinned to a core of its own (so they
   see the same machine). The outage costs about its own length and TCP's retransmission
   backoff, not the run: the extra seconds are printed beside the ratio.
2. Long: down for 60 s with --timeout 30. The run must fail naming the host cut off; the
   figure is the seconds from the link going down to the launcher's end, against the
   timeout + 10 s (target: ratio <= 1).

Needs root, ip and tc (else SKIP).

    python benchmarks/outage.py          # about 3 minutes
    python benchmarks/outage.py --quick  # smoke run: the long outage only (10 s, --timeout 3)

The exit code is 1 if a run did not end as it must (completed, or failed naming the host),
whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from polyrhythm.errors import ClusterError
from polyrhythm.launch.cluster.hosts import ClusterShape, EmulatedCluster, can_emulate, leftovers
from polyrhythm.runtime.checkpoint import complete_epochs

RUN = ["--dataset", "digits", "--workers", "2", "--hosts", "2", "--steps-per-epoch", "20",
       "--threads", "1", "--worker-delay-s", "0.02,0.02"]
SERVERS = {"bsp": 1, "asp": 1, "allreduce": 0}
SHAPE = ClusterShape(2, (None, None), (None, None))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (see above)")
    args = parser.parse_args(argv)
    args.strategies = [] if args.quick else list(SERVERS)  # the tests run short outages
    args.timeout, args.short, args.long = (3, 1.0, 10.0) if args.quick else (30, 5.0, 60.0)
    args.epochs = 2 if args.quick else 8
    return args


def launch(out: Path, core: int, strategy: str, epochs: int, timeout: int) -> subprocess.Popen:
    return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-m", "polyrhythm.cli",
                             "train", "--out", str(out), "--json", "--strategy", strategy,
                             "--servers", str(SERVERS[strategy]), "--epochs", str(epochs),
                             "--timeout", str(timeout), *RUN],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(out: Path, launcher: subprocess.Popen, servers: int) -> None:
    """Until the run has its first checkpoint: training, past the start."""
    while launcher.poll() is None:
        if any(complete_epochs(d, 2, servers) for d in out.glob("2*") if d.is_dir()):
            return
        time.sleep(0.01)
    raise SystemExit(f"the run ended before its first checkpoint: {launcher.stderr.read()}")


def run_cluster(launcher: subprocess.Popen, known: set[str]) -> EmulatedCluster:
    """The cluster a run made for itself (one not among `known`), once it is up."""
    while launcher.poll() is None:
        names = {m.group(1) for ns in leftovers()["namespaces"]
                 if (m := re.fullmatch(r"pr-(run[0-9a-f]+)-h\d+", ns))} - known
        if names:
            return EmulatedCluster(names.pop(), SHAPE)
        time.sleep(0.01)
    raise SystemExit(f"the run ended before its cluster was up: {launcher.stderr.read()}")


def clusters_now() -> set[str]:
    return {m.group(1) for ns in leftovers()["namespaces"]
            if (m := re.fullmatch(r"pr-(\w+)-h\d+", ns))}


def short_outage(folder: Path, args, strategy: str) -> bool:
    """One strategy's short outage against its twin without one; whether it completed."""
    outs = [folder / f"{strategy}-{which}" for which in ("outage", "none")]
    launcher = launch(outs[0], 0, strategy, args.epochs, args.timeout)
    cluster = run_cluster(launcher, clusters_now())  # then the twin, on a cluster of its own
    launchers = [launcher, launch(outs[1], 1, strategy, args.epochs, args.timeout)]
    wait_for_checkpoint(outs[0], launcher, SERVERS[strategy])
    cluster.set_link(1, False)
    down = time.monotonic()
    while time.monotonic() - down < args.short and launcher.poll() is None:
        time.sleep(0.01)
    cluster.set_link(1, True)
    ended = [p.communicate() for p in launchers]
    if launchers[0].returncode != 0 or launchers[1].returncode != 0:
        print(f"{strategy:9s} FAIL: {ended[0][1].strip()[-300:] or ended[1][1].strip()[-300:]}")
        return False
    walls = [json.loads(stdout.strip().splitlines()[-1])["wall_s"] for stdout, _ in ended]
    print(f"{strategy:9s} completed: {walls[0]:6.2f} s with a {args.short:g} s outage, "
          f"{walls[1]:6.2f} s without: ratio {walls[0] / walls[1]:.2f} "
          f"(+{walls[0] - walls[1]:.2f} s)")
    return True


def long_outage(folder: Path, args) -> bool:
    """The link down past the timeout: whether the run failed naming the host, in time."""
    out = folder / "long"
    launcher = launch(out, 0, "bsp", 10_000, args.timeout)
    cluster = run_cluster(launcher, clusters_now())
    wait_for_checkpoint(out, launcher, 1)
    cluster.set_link(1, False)
    down = time.monotonic()
    try:
        _, stderr = launcher.communicate(timeout=args.long)
    except subprocess.TimeoutExpired:
        launcher.kill()  # its janitor removes the cluster
        _, stderr = launcher.communicate()
    took = time.monotonic() - down
    if cluster.network.exists():  # still there: the run went on past the outage
        cluster.set_link(1, True)
    named = "host 1 (ranks 1, 2) was cut off: its link is down" in stderr
    if launcher.returncode != 1 or not named:
        print(f"long outage: FAIL: exit code {launcher.returncode}: {stderr.strip()[-300:]}")
        return False
    bound = args.timeout + 10
    print(f"long outage ({args.long:g} s, --timeout {args.timeout}): failed naming host 1 "
          f"after {took:.2f} s against {bound} s: ratio {took / bound:.2f} (target <= 1) "
          f"{'PASS' if took <= bound else 'MISS'}")
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        can_emulate()
    except ClusterError as exc:
        print(f"outages: SKIP ({exc})")
        return 0
    with tempfile.TemporaryDirectory(prefix="polyrhythm-outage-") as folder:
        completed = [short_outage(Path(folder), args, s) for s in args.strategies]
        failed_in_time = long_outage(Path(folder), args)
    return 0 if all(completed) and failed_in_time else 1


if __name__ == "__main__":
    sys.exit(main())
