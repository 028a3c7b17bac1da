"""The soak: runs of every strategy family, each with a random rank (on loopback) or host (on
an emulated cluster) killed at a random moment (some twice, some while a checkpoint is being
written), each resumed whenever it failed, until it completes.

Every run is checked against the invariants, and any breach is a violation:

- nothing left: no process of the run, and no namespace, link, qdisc or cgroup of ours
  beyond what was there before;
- no hang: every launch ends within its guard (HANG_S);
- no lost record: the store has the run, `failed` after a failed launch, `completed` at the
  end, never `running` once its launcher has ended;
- no checkpoint that fails to load: every file of every checkpoint left loads and matches
  its digest (what a resume set aside, kept to look at, aside);
- every resumed synchronous run (bsp, allreduce, localsgd, dpsgd, Strategy-Switch to bsp)
  ends with the model of its uninterrupted twin, run once per strategy (<= 1e-5);
- a run that went on without a lost worker (asp's on_worker_failure = continue) records it.

The table gives, per strategy, how many runs ended each way. Kills land at a random moment of
a random epoch after the first checkpoint (a random share of an epoch's time later), or the
instant a checkpoint is seen half-written; a twice-killed run is killed again while resumed.

    python benchmarks/soak.py           # 100 runs, about 20 minutes; cluster runs need root
    python benchmarks/soak.py --quick   # smoke run: 1 run
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import torch

from polyrhythm.errors import ClusterError
from polyrhythm.launch.cluster.hosts import ClusterShape, EmulatedCluster, can_emulate, leftovers
from polyrhythm.metrics.store import RunStore
from polyrhythm.runtime import checkpoint, digests
from polyrhythm.runtime.intact import SET_ASIDE

HANG_S = 240.0  # a launch that has not ended by then hangs
EPOCHS = 6
BASE = {"dataset": "digits", "epochs": EPOCHS, "steps_per_epoch": 10, "threads": 1,
        "lr_decay_every": 1, "lr_decay": 0.5, "timeout": 20}
# Per strategy: its fields, whether its runs repeat exactly (a twin to compare with), and
# the hosts of the emulated cluster it may run on here (0: loopback only). asp's 3 hosts
# hold its server and a worker each: a worker host lost, it goes on.
STRATEGIES = {
    "bsp": ({"strategy": "bsp", "servers": 1, "workers": 2}, True, 2),
    "asp": ({"strategy": "asp", "servers": 1, "workers": 2}, False, 3),
    "ssp": ({"strategy": "ssp", "servers": 1, "workers": 2}, False, 0),
    "allreduce": ({"strategy": "allreduce", "workers": 2}, True, 2),
    "localsgd": ({"strategy": "localsgd", "workers": 2}, True, 0),
    "dpsgd": ({"strategy": "dpsgd", "workers": 3}, True, 0),
    "gossip": ({"strategy": "gossip", "workers": 3}, False, 0),
    "switch": ({"strategy": "switch", "to": "bsp", "servers": 1, "workers": 2}, True, 2),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="runs (default 100)")
    parser.add_argument("--seed", type=int, default=25, help="the chaos's seed (default 25)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 run")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 1
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def cli(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "polyrhythm.cli", "train", "--out", str(out),
                             "--json", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def flags(fields: dict) -> list[str]:
    return [part for key, value in fields.items()
            for part in ("--" + key.replace("_", "-"), str(value))]


class Run:
    """One soak run: its launches, kills and what the checks found."""

    def __init__(self, index: int, name: str, hosts: int, out: Path, rng: random.Random):
        self.index, self.name, self.hosts, self.out, self.rng = index, name, hosts, out, rng
        fields, self.sync, _ = STRATEGIES[name]
        self.fields = {**BASE, **fields, **({"hosts": hosts} if hosts else {}),
                       "worker_delay_s": ",".join(["0.02"] * fields["workers"])}
        self.kills = 2 if rng.random() < 0.2 else 1
        self.during_write = rng.random() < 0.25
        self.events: list[str] = []
        self.violations: list[str] = []
        self.run_id: str | None = None
        self.summary: dict | None = None

    @property
    def run_dir(self) -> Path:
        return self.out / self.run_id

    def go(self) -> None:
        launcher, resumed_from = cli(self.out, *flags(self.fields)), 0
        for kill in range(self.kills + 1):
            if kill < self.kills:  # once the launch has a checkpoint of its own
                self._kill_at_random(launcher, after=resumed_from + 1)
            stdout, stderr = self._ended(launcher)
            if self.run_id is None:
                self.run_id = self._only_run()
            if launcher.returncode == 0:
                self.summary = json.loads(stdout.strip().splitlines()[-1])
                break
            self._check_failed(stderr)
            done = checkpoint.complete_epochs(self.run_dir, self.fields["workers"],
                                              self.fields.get("servers", 0))
            resumed_from = done[-1] if done else 0
            launcher = cli(self.out, "--resume", self.run_id)
            self.events.append("resumed")
        else:
            self.violations.append("still failing after its last resume")
            return

    def _kill_at_random(self, launcher: subprocess.Popen, after: int) -> None:
        """Wait for the checkpoint of `after` epochs, then kill a random rank or host: at a
        random moment of a later epoch, or the instant a checkpoint is seen half-written."""
        done = self._wait_for_checkpoint(launcher, after)
        if done is None:
            return
        mid_checkpoint = self.during_write and self._wait_for_half_written(launcher)
        if not mid_checkpoint:
            time.sleep(self.rng.uniform(0.0, 0.6))  # an epoch here takes about half that
        if launcher.poll() is not None:
            self.events.append("ended before the kill")
            return
        self.events.append(self._kill(launcher) + (" mid-checkpoint" if mid_checkpoint else ""))

    def _wait_for_checkpoint(self, launcher: subprocess.Popen, after: int) -> int | None:
        deadline = time.monotonic() + HANG_S
        workers, servers = self.fields["workers"], self.fields.get("servers", 0)
        known = self.run_id
        while launcher.poll() is None and time.monotonic() < deadline:
            runs = [known] if known else [p.name for p in self.out.glob("2*") if p.is_dir()]
            for run_id in runs:
                done = checkpoint.complete_epochs(self.out / run_id, workers, servers)
                if done and done[-1] >= after:
                    self.run_id = run_id
                    return done[-1]
            time.sleep(0.005)
        return None

    def _wait_for_half_written(self, launcher: subprocess.Popen) -> bool:
        """Until a checkpoint folder is there but not complete (or a file of it is being
        written): True if seen before the run ends."""
        workers, servers = self.fields["workers"], self.fields.get("servers", 0)
        while launcher.poll() is None:
            complete = checkpoint.complete_epochs(self.run_dir, workers, servers)
            newer = checkpoint.epoch_dir(self.run_dir, (complete or [0])[-1] + 1)
            if newer.is_dir():  # being written (older ones being pruned are not)
                return True
            time.sleep(0.001)
        return False

    def _kill(self, launcher: subprocess.Popen) -> str:
        if self.hosts:
            host = self.rng.randrange(self.hosts)
            cluster = running_cluster(self.hosts)
            if cluster is None:
                return "no cluster to kill a host of"
            cluster.host_group(host).kill()
            return f"host {host} killed"
        ranks = rank_processes(launcher.pid)
        if not ranks:
            return "no rank to kill"
        rank = self.rng.choice(sorted(ranks))
        try:
            ranks[rank].send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return "its rank had ended"
        return f"rank {rank} killed"

    def _ended(self, launcher: subprocess.Popen) -> tuple[str, str]:
        try:
            return launcher.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            self.violations.append(f"a launch hung past {HANG_S:.0f} s")
            launcher.kill()
            return launcher.communicate()

    def _only_run(self) -> str:
        runs = sorted(p.name for p in self.out.glob("2*") if p.is_dir())
        return runs[-1]

    def _check_failed(self, stderr: str) -> None:
        status = self._status()
        if status != "failed":
            self.violations.append(f"a failed launch left the run {status!r}")
        if "--resume" not in stderr and "no usable checkpoint" not in stderr:
            self.events.append("failed before its first checkpoint")

    def _status(self) -> str | None:
        row = RunStore(self.out / "polyrhythm.db").run(self.run_id)
        return row["status"] if row else None

    def check(self, twin: dict | None, before: dict) -> None:
        """The invariants, once the run has ended for good."""
        if self._status() != "completed" or self.summary is None:
            self.violations.append(f"ended {self._status()!r}, not completed")
        left = wait_until_clean(self.out, before)
        if left:
            self.violations.append(f"left behind: {left}")
        root = self.run_dir / checkpoint.FOLDER
        for path in sorted(root.rglob("*.pt")):
            if SET_ASIDE in path.relative_to(root).parts:
                continue
            try:
                checkpoint.load(path)
            except Exception as exc:  # whatever torch.load raised: the file is unusable
                self.violations.append(f"{path.name} does not load: {exc}")
            if problem := digests.problem(path):
                self.violations.append(problem)
        if self.summary is None:
            return
        lost = self.summary.get("lost_workers") or []
        if lost:
            self.events.append("went on without a lost worker")
        if twin is not None and "resumed" in self.events:
            diff = max_difference(self.run_dir / "model.pt", Path(twin["run_dir"]) / "model.pt")
            if diff > 1e-5:
                self.violations.append(f"its model is {diff:.2e} from its twin's")

    def outcome(self) -> str:
        resumed = self.events.count("resumed")
        said = {0: "", 1: "resumed once"}.get(resumed, f"resumed {resumed}x")
        if "went on without a lost worker" in self.events:
            return f"{said}, went on w/o a worker" if said else "went on w/o a worker"
        return said or "completed, no resume"


def rank_processes(launcher: int) -> dict[int, psutil.Process]:
    """The launcher's ranks (named polyrhythm-r<rank>), by rank."""
    found = {}
    try:
        children = psutil.Process(launcher).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            match = re.fullmatch(r"polyrhythm-r(\d+)", child.name())
        except psutil.NoSuchProcess:
            continue
        if match:
            found[int(match.group(1))] = child
    return found


def running_cluster(hosts: int) -> EmulatedCluster | None:
    """The emulated cluster a run made for itself (its namespaces say its name)."""
    names = {m.group(1) for ns in leftovers()["namespaces"]
             if (m := re.fullmatch(r"pr-(run[0-9a-f]+)-h\d+", ns))}
    if len(names) != 1:
        return None
    return EmulatedCluster(names.pop(), ClusterShape(hosts, (None,) * hosts, (None,) * hosts))


def ours(out: Path) -> list[str]:
    """Processes still working on runs under `out`."""
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if (p.info["name"] or "").startswith("polyrhythm-r") or str(out) in line:
            found.append(f"{p.info['name']} ({p.pid})")
    return found


def wait_until_clean(out: Path, before: dict, within: float = 30.0) -> dict:
    """What is left of the run after `within` s (processes, namespaces, links, qdiscs,
    cgroups beyond `before`): nothing, once all has gone."""
    deadline = time.monotonic() + within
    while True:
        now = leftovers()
        left = {k: [x for x in v if x not in before[k]] for k, v in now.items()}
        left = {k: v for k, v in left.items() if v}
        if processes := ours(out):
            left["processes"] = processes
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def max_difference(a: Path, b: Path) -> float:
    first, second = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return max((first[k].float() - second[k].float()).abs().max().item() for k in second)


def twin_of(name: str, folder: Path, twins: dict) -> dict | None:
    """The uninterrupted run of a synchronous strategy, on loopback, made once."""
    fields, sync, _ = STRATEGIES[name]
    if not sync:
        return None
    if name not in twins:
        out = folder / "twins"
        workers = fields["workers"]
        done = subprocess.run([sys.executable, "-m", "polyrhythm.cli", "train", "--out",
                               str(out), "--json", *flags({**BASE, **fields,
                                                            "worker_delay_s": ",".join(
                                                                ["0.02"] * workers)})],
                              capture_output=True, text=True, timeout=HANG_S)
        if done.returncode != 0:
            raise SystemExit(f"the twin of {name} failed: {done.stderr[-500:]}")
        twins[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return twins[name]


def plan(runs: int, rng: random.Random, cluster: bool) -> list[tuple[str, int]]:
    """(strategy, hosts) per run: every strategy in turn, a quarter of the runs on an
    emulated cluster where one can be made (those strategies that run there)."""
    names = list(STRATEGIES)
    chosen = []
    for i in range(runs):
        name = names[i % len(names)]
        hosts = STRATEGIES[name][2]
        chosen.append((name, hosts if cluster and hosts and rng.random() < 0.25 else 0))
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    try:
        can_emulate()
        cluster = True
    except ClusterError as exc:
        print(f"cluster runs: SKIP ({exc})")
        cluster = False
    before = leftovers() if cluster else {"namespaces": [], "links": [], "qdiscs": [],
                                           "cgroups": []}
    outcomes: dict[str, Counter] = defaultdict(Counter)
    violations: list[str] = []
    twins: dict[str, dict] = {}
    kills: Counter[str] = Counter()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polyrhythm-soak-") as folder:
        for i, (name, hosts) in enumerate(plan(args.runs, rng, cluster)):
            twin = twin_of(name, Path(folder), twins)
            run = Run(i, name, hosts, Path(folder) / f"run{i:03d}", rng)
            run.go()
            run.check(twin, before)
            where = f"{hosts} hosts" if hosts else "loopback"
            outcomes[f"{name} ({'cluster' if hosts else 'loopback'})"][run.outcome()] += 1
            kills.update(re.sub(r"(rank|host) \d+", r"\1", e) for e in run.events
                         if "killed" in e)
            for v in run.violations:
                violations.append(f"run {i} ({name}, {where}): {v}")
            print(f"run {i:3d} {name:9s} {where:9s} {run.outcome():26s} "
                  f"{'; '.join(run.events)} ({time.monotonic() - began:.0f} s)", flush=True)
            for v in run.violations:
                print(f"        VIOLATION: {v}", flush=True)
    print(f"\n{args.runs} runs in {time.monotonic() - began:.0f} s\n")
    columns = sorted({o for c in outcomes.values() for o in c})
    print(f"{'strategy':22s} " + " ".join(f"{c:>26s}" for c in columns))
    for key in sorted(outcomes):
        print(f"{key:22s} " + " ".join(f"{outcomes[key][c]:26d}" for c in columns))
    print("\nkills: " + ", ".join(f"{k}: {n}" for k, n in sorted(kills.items())))
    print(f"violations: {len(violations)}")
    for v in violations:
        print(f"  {v}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
