"""A user's script under polyrhythm against the same script without it: examples/char_lm.py.

Two comparisons, each run side by side:

1. `allreduce` with 2 workers against the script's own `--ddp` mode (torch's
   DistributedDataParallel), both started by `torchrun --nproc-per-node 2` (polyrhythm's
   side told its strategy by POLYRHYTHM_STRATEGY): polyrhythm's wrapped optimizer, flat
   gradient and all-reduce against DDP's buckets (target >= 0.95).
2. `polyrhythm run --strategy bsp --servers 1 --workers 1` against `python char_lm.py`
   with no launcher at all: every step's push to the server and pull of the new
   parameters (the server steps AdamW) against one process stepping its own (target >= 0.90).

Both sides run the same script with the same settings for the same steps, on the same
batches, and are timed by the script itself (`--measure-after`): worker 0's samples/s over
the steps after the warm-up, from one step's end to the next (start-up, rendezvous and
validation left out), the same code in every mode.

Method (as benchmarks/instrumentation.py): the two jobs of a comparison run at the same time,
each pinned to a core of its own with all its processes (launcher, ranks, server) sharing
it and one torch thread each, so both see the same drift in the speed of a shared machine;
the cores swap between repeats. The result is the median over repeats of the paired ratios
polyrhythm / baseline. With a single usable core the two jobs run in turn. Each repeat's
line says how many cores other work kept busy meanwhile (benchmarks/machine_load.py); where
that passed 0.2 a warning follows the results.

Both sides of a comparison are started alike for a reason beyond start-up: where Linux's
autogroup is on (kernel.sched_autogroup_enabled: 1 on this machine), a busy core is shared
between sessions first and among a session's processes after, and torchrun starts each rank
in a session of its own while `polyrhythm run`'s ranks share their launcher's. Under other
load (a shared machine) a torchrun job of two ranks gets up to twice the CPU of a
`polyrhythm run` job on the same core: here DDP under torchrun ran 1.6x as fast as the same
DDP job with its two ranks in one session, a busy process beside each. In comparison 2 each
side is one session.

    python benchmarks/script.py            # about 2 minutes on 2 idle cores
    python benchmarks/script.py --quick    # smoke run: a small model, a few steps
    git worktree add /tmp/before REV
    python benchmarks/script.py --against /tmp/before   # this checkout's jobs against REV's

`--against CHECKOUT` measures what a change costs: `allreduce` under torchrun and `bsp` with
1 worker + 1 server, each this checkout's against the same job of CHECKOUT (its own
char_lm.py, its src/ first on PYTHONPATH), side by side as above (target >= 0.98).
"""

from __future__ import annotations

import argparse
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

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "char_lm.py"
RUN_TIMEOUT_S = 600
# --against: a change that must not show (issue 43's faithfulness) keeps 98 % of the speed.
AGAINST_TARGET = 0.98
GRACE_S = 30  # for a job told to stop to stop its ranks
# The line char_lm.py's worker 0 prints with --measure-after.
MEASURED = re.compile(r"^samples/s (\d+(?:\.\d+)?) over \d+ steps")
ERROR = re.compile(r"^\w+(Error|Exception)\b")  # a Python error's last line
# A smaller model on the first 50,000 characters: a quick run is mostly start-up anyway.
QUICK_MODEL = ["--width", "32", "--layers", "1", "--chars", "50000"]


@dataclass
class Comparison:
    """A polyrhythm job against its baseline: the commands before the script's arguments
    (the script's path goes where "SCRIPT" is)."""

    name: str
    command: list[str]
    baseline_name: str
    baseline_command: list[str]
    target: float
    env: dict[str, str] = field(default_factory=dict)  # the polyrhythm side's
    baseline_env: dict[str, str] = field(default_factory=dict)
    rates: list[float] = field(default_factory=list)  # polyrhythm's, one per repeat
    baseline_rates: list[float] = field(default_factory=list)
    other_load: list[float] = field(default_factory=list)  # cores, one entry per repeat

    @property
    def ratios(self) -> list[float]:
        return [p / b for p, b in zip(self.rates, self.baseline_rates, strict=True)]

    def result(self) -> str:
        """The median of the paired ratios against the target, with the repeats' range and
        each side's median samples/s."""
        ratio = statistics.median(self.ratios)
        return (f"{self.name} / {self.baseline_name}: {ratio:.3f} (target >= "
                f"{self.target:.2f}) {'PASS' if ratio >= self.target else 'MISS'}  "
                f"[repeats: {min(self.ratios):.3f}-{max(self.ratios):.3f}; median samples/s "
                f"{statistics.median(self.rates):.1f} and "
                f"{statistics.median(self.baseline_rates):.1f}]")


def comparisons(out: str, against: Path | None = None) -> list[Comparison]:
    python = [sys.executable]
    torchrun = [*python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                "2", "SCRIPT"]
    run = [*python, "-m", "polyrhythm.cli", "run", "--out", out, "--threads", "1"]
    bsp = [*run, "--strategy", "bsp", "--servers", "1", "--workers", "1", "SCRIPT", "--"]
    if against is not None:  # the same jobs, this checkout's against `against`'s
        then = {"PYTHONPATH": str(against / "src")}
        other = str(against / "examples" / "char_lm.py")

        def theirs(command: list[str]) -> list[str]:
            return [other if part == "SCRIPT" else part for part in command]
        return [
            Comparison("allreduce now", torchrun, f"allreduce at {against.name}",
                       theirs(torchrun), AGAINST_TARGET,
                       env={"POLYRHYTHM_STRATEGY": "allreduce"},
                       baseline_env={**then, "POLYRHYTHM_STRATEGY": "allreduce"}),
            Comparison("bsp 1+1 now", bsp, f"bsp 1+1 at {against.name}", theirs(bsp),
                       AGAINST_TARGET, baseline_env=then),
        ]
    return [
        Comparison("allreduce under torchrun, 2 workers", torchrun,
                   "DDP under torchrun, 2 processes", [*torchrun, "--ddp"], 0.95,
                   env={"POLYRHYTHM_STRATEGY": "allreduce"}),
        Comparison("bsp, 1 worker + 1 server", bsp, "plain python, 1 process",
                   [*python, "SCRIPT"], 0.90),
    ]


def start(command: list[str], script_args: list[str], env: dict[str, str], core: int,
          out: str) -> subprocess.Popen:
    """A job pinned to `core` (every process it starts inherits the pin), in a session of
    its own so that it can be ended whole; one torch thread a process. It runs in `out`,
    where a run polyrhythm records under torchrun goes (its `runs` folder)."""
    argv = [str(SCRIPT) if part == "SCRIPT" else part for part in command] + script_args
    # polyrhythm run's ranks get these from their launcher; every other process the same.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **env}
    return subprocess.Popen(argv, env=env, cwd=out, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, {core}))


def measured_rate(name: str, proc: subprocess.Popen) -> float:
    """The samples/s the job's worker 0 printed; one line if it failed before printing it.
    A job that failed after (while it ended) keeps its figure, and a line says so."""
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{name}: no result within {RUN_TIMEOUT_S} s") from None
    lines = output.strip().splitlines()
    figures = [i for i, line in enumerate(lines) if MEASURED.match(line)]
    if proc.returncode == 0 and len(figures) == 1:
        return float(MEASURED.match(lines[figures[0]]).group(1))
    fd, log = tempfile.mkstemp(prefix="polyrhythm-script-bench-", suffix=".log")
    with os.fdopen(fd, "w") as file:
        file.write(output)
    if len(figures) != 1:  # torchrun ends with a table: the ranks' error lines say more
        said = ([line for line in lines if ERROR.match(line)] or lines or ["no output"])[-1]
        raise SystemExit(f"{name} failed (exit code {proc.returncode}): {said} (its output: "
                         f"{log})")
    # Worker 0 prints its figure once training is done, so what failed was the job's end (a
    # rank aborting in C++ teardown at exit did, under torchrun): the figure is a whole run's.
    after = lines[figures[0] + 1:] or ["nothing printed"]
    print(f"  note: {name} failed after training, as it ended (exit code {proc.returncode}): "
          f"{after[0]} (its output: {log}); its figure stands", flush=True)
    return float(MEASURED.match(lines[figures[0]]).group(1))


def end_session(proc: subprocess.Popen) -> None:
    """Stop a job still running (the other side failed, or Ctrl-C): SIGTERM first, on which
    torchrun and polyrhythm run stop their ranks (torchrun's, in sessions of their own, are
    out of the job's reach), SIGKILL to the job's session after a grace period."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def measure(comp: Comparison, script_args: list[str], cores: list[int], repeat: int,
            out: str) -> None:
    """One paired measurement: polyrhythm on one core, the baseline on the other (the cores
    swap between repeats); in turn on a single core, the order swapping instead."""
    sides = [(comp.name, comp.command, comp.env, comp.rates),
             (comp.baseline_name, comp.baseline_command, comp.baseline_env,
              comp.baseline_rates)]
    if repeat % 2:
        sides.reverse()
    # Both jobs at once, one core each; or one after the other on a single core.
    rounds = ([list(zip(sides, cores, strict=True))] if len(cores) > 1 else
              [[(side, cores[0])] for side in sides])
    with OtherLoad() as load:
        for jobs in rounds:
            run_together(jobs, script_args, out)
    if load.cores is not None:
        comp.other_load.append(load.cores)


def run_together(jobs: list[tuple], script_args: list[str], out: str) -> None:
    """Start every (side, core) of `jobs` at once; each side's figure into its rates."""
    procs = [start(command, script_args, env, core, out) for (_, command, env, _), core in jobs]
    try:
        for ((name, _, _, rates), _), proc in zip(jobs, procs, strict=True):
            rates.append(measured_rate(name, proc))
    finally:
        for proc in procs:
            end_session(proc)


def load_of(comp: Comparison) -> str:
    """The other load of its last repeat, in cores ("?" where /proc/stat cannot say)."""
    return f"{comp.other_load[-1]:.2f}" if comp.other_load else "?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="CHECKOUT", type=Path,
                        help="another checkout of polyrhythm (git worktree add DIR REV): "
                        "each job of this one against the same job of that one, its own "
                        "char_lm.py and src/")
    return parse_paired(parser, argv, "steps per run, warm-up included (default 200: one "
                                      "epoch of two workers is 204)")


def parse_paired(parser: argparse.ArgumentParser, argv: list[str] | None,
                 steps_help: str) -> argparse.Namespace:
    """The flags of a benchmark of paired repeats (--steps, --warmup, --repeats, --quick)
    added to `parser`, parsed and checked (benchmarks/compression.py shares them)."""
    parser.add_argument("--steps", type=int, default=200, help=steps_help)
    parser.add_argument("--warmup", type=int, default=20,
                        help="leading steps left out of the throughput (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="paired repeats (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a smaller model, 12 steps (4 warm-up), 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.repeats = 12, 4, 1
    if not 0 <= args.warmup < args.steps - 1:
        parser.error("--warmup must leave at least two measured steps")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    script_args = ["--steps", str(args.steps), "--measure-after", str(args.warmup),
                   "--log-every", "0", *(QUICK_MODEL if args.quick else [])]
    cores = sorted(os.sched_getaffinity(0))[:2]
    how = "side by side, one core each" if len(cores) > 1 else "in turn on one core"
    print(f"examples/char_lm.py {' '.join(script_args)}: {args.repeats} repeats, {how}, "
          "1 torch thread a process", flush=True)
    with tempfile.TemporaryDirectory(prefix="polyrhythm-script-bench-") as out:
        if args.against is not None and not (args.against / "src" / "polyrhythm").is_dir():
            raise SystemExit(f"--against {args.against}: not a checkout of polyrhythm")
        comps = comparisons(out, args.against)
        for repeat in range(args.repeats):
            for comp in comps:
                measure(comp, script_args, cores, repeat, out)
                print(f"  repeat {repeat + 1}/{args.repeats}  {comp.name} "
                      f"{comp.rates[-1]:.1f}/s  {comp.baseline_name} "
                      f"{comp.baseline_rates[-1]:.1f}/s  ratio {comp.ratios[-1]:.3f}  "
                      f"other load {load_of(comp)} cores",
                      flush=True)
    for comp in comps:
        print(comp.result())
    if args.quick:
        print("--quick is a smoke run: too short for the ratios to mean much")
    warning = shared_warning([x for comp in comps for x in comp.other_load])
    if warning:
        print(f"{warning}: side by side, other work may sit beside one job more than the "
              "other, which moves a ratio either way")
    return 0


if __name__ == "__main__":
    sys.exit(main())
