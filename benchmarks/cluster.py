"""The emulated cluster against the cost models it must reproduce (issue 10's figures).

1. Bandwidth, all-reduce: 4 hosts at 100 mbit, `allreduce` (Gloo's ring) with emulated
   compute; a step's all-reduce time (its `wait` span) against 2(N-1)/N * |w| / B.
2. Bandwidth, parameter server: 4 hosts at 100 mbit, `bsp` with one dedicated server and
   3 workers with emulated compute; a step's time less its compute against the naive-PS
   bound 2n * T_w (SEEDS.md section 3; R_w and U_w, reducing and updating |w| on the
   server, are the server's measured apply time per update, well under 1 %).
3. CPU shares: `asp` with real compute (one thread a worker), one worker on a host of 1 core
   and one on a host of 0.25 core; the second's mean compute time against the first's: 4.
4. Latency: `bsp` with emulated compute and latency = 50 ms against the same run with none,
   both at once, side by side (each pinned to a core of its own, so they see the same
   machine). The median step takes 2 x 50 ms more, give or take the few milliseconds the
   baseline's own steps vary by; what must hold is that every step of the first pays both
   latencies (a push and a reply): its least communication time (step less compute) is at
   least 2 x 50 ms.

Each figure is the median (3: the mean) over the measured steps (warm-up steps left out) of
every worker. Targets: 1 and 2 within 25 % of the model (ratio 0.75-1.25), 3 a ratio of
3-5, 4 a ratio >= 1 of the least communication time to 2 x 50 ms. 1-3 need root, ip and tc
(else SKIP).

    python benchmarks/cluster.py          # about 2 minutes
    python benchmarks/cluster.py --quick  # smoke run: a few steps, 1 and 2 on 2 hosts
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODEL_PARAMETERS = 105_866  # cnn on mnist5k: |w| in float32 values
BANDWIDTH = 100e6
LATENCY = 0.05


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 8 steps, the bandwidth figures on 2 hosts")
    args = parser.parse_args(argv)
    # A smoke's figures mean nothing: 2 hosts run the same code as 4 at 8 fewer processes
    # (a torchrun and a rank a host), which is most of its time.
    args.hosts = 4
    if args.quick:
        args.steps, args.hosts = 8, 2
    if args.steps < 4:
        parser.error("--steps must be at least 4")
    return args


def run(job: dict, out: str, core: int | None = None) -> dict:
    """One run in a process of its own (pinned to `core`); its per-step medians."""
    code = ("import json, sys, polyrhythm\n"
            "if __name__ == '__main__':\n"
            "    s = polyrhythm.train(json.loads(sys.argv[1]))\n"
            "    print(json.dumps({'run_id': s['run_id'], 'updates': s['weight_updates'],"
            " 'cluster': s.get('cluster')}))\n")
    command = [sys.executable, "-c", code, json.dumps({**job, "out": out})]
    if core is not None:
        command = ["taskset", "-c", str(core), *command]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def medians(process, out: str, warmup: int) -> dict:
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"a run failed: {stderr.strip().splitlines()[-1:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    from polyrhythm.metrics.store import RunStore

    store = RunStore(os.path.join(out, "polyrhythm.db"))
    rows = [r for r in store.series("iterations", result["run_id"]) if r["step"] >= warmup]
    figures = {k: statistics.median(r[k] for r in rows)
               for k in ("compute_s", "wait_s", "total_s")}
    updates = store.series("updates", result["run_id"])
    figures["apply_s"] = statistics.median(u["seconds"] for u in updates) if updates else 0.0
    figures["emulator_bound"] = (result["cluster"] or {}).get("emulator_bound")
    figures["min_comm_s"] = min(r["total_s"] - r["compute_s"] for r in rows)
    workers = sorted({r["worker"] for r in rows})
    figures["mean_compute_s"] = [statistics.mean(r["compute_s"] for r in rows
                                                 if r["worker"] == w) for w in workers]
    return figures


def verdict(ratio: float, low: float, high: float) -> str:
    return "PASS" if low <= ratio <= high else "MISS"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warmup = 2 if args.quick else 5
    common = {"epochs": 1, "steps_per_epoch": args.steps, "warmup_steps": warmup,
              "compute": "emulated", "compute_time": "20ms"}
    t_w = MODEL_PARAMETERS * 4 * 8 / BANDWIDTH
    with tempfile.TemporaryDirectory() as out:
        from polyrhythm.errors import ClusterError
        from polyrhythm.launch.cluster.hosts import can_emulate

        try:
            can_emulate()
            why = None
        except ClusterError as exc:
            why = str(exc)
        # --quick starts every run at once (a smoke: its figures mean nothing); a measurement
        # runs the cluster runs one at a time, each alone on the machine.
        started = {}

        def start(name: str, job: dict, core: int | None = None) -> None:
            started[name] = run(job, out, core)
            if not args.quick:
                started[name] = medians(started[name], out, warmup)

        def result(name: str) -> dict:
            got = started[name]
            return medians(got, out, warmup) if args.quick else got

        hosts = args.hosts
        if why is None:
            shaped = {**common, "hosts": hosts, "bandwidth": "100mbit"}
            start("ring", {**shaped, "strategy": "allreduce", "workers": hosts})
            start("ps", {**shaped, "strategy": "bsp", "workers": hosts - 1})
            # Real compute, one thread a worker: worker 0 on a 1-core host, worker 1 on a
            # 0.25-core one (the server's host has 2). The quota must slow worker 1 by 4.
            start("shares", {**common, "compute": "real", "compute_time": None,
                             "strategy": "asp", "workers": 2, "hosts": 3, "threads": 1,
                             "cpu": [2.0, 1.0, 0.25]})
        job = {**common, "strategy": "bsp", "workers": 2}
        cores = sorted(os.sched_getaffinity(0))
        pair = [run({**job, "latency": "50ms"}, out, cores[0] if len(cores) > 1 else None),
                run(job, out, cores[1] if len(cores) > 1 else None)]
        slow, fast = (medians(p, out, warmup) for p in pair)
        if why is None:
            ring = result("ring")
            model = 2 * (hosts - 1) / hosts * t_w
            ratio = ring["wait_s"] / model
            print(f"all-reduce of |w| on {hosts} hosts at 100mbit: {ring['wait_s'] * 1e3:.1f} "
                  f"ms, model {model * 1e3:.1f} ms: {ratio:.2f} (target 0.75-1.25) "
                  f"{verdict(ratio, 0.75, 1.25)}; emulator bound: {ring['emulator_bound']}")
            ps = result("ps")
            bound = 2 * (hosts - 1) * t_w + ps["apply_s"]
            measured = ps["total_s"] - ps["compute_s"]
            ratio = measured / bound
            workers = f"{hosts - 1} worker{'s' if hosts > 2 else ''}"
            print(f"bsp step, 1 server + {workers} at 100mbit: {measured * 1e3:.1f} ms beyond "
                  f"compute, naive-PS bound {bound * 1e3:.1f} ms: {ratio:.2f} (target "
                  f"0.75-1.25) {verdict(ratio, 0.75, 1.25)}; emulator bound: "
                  f"{ps['emulator_bound']}")
            shares = result("shares")
            fast_s, slow_s = shares["mean_compute_s"]
            ratio = slow_s / fast_s
            print(f"cpu shares 1 and 0.25, asp, real compute: {fast_s * 1e3:.1f} and "
                  f"{slow_s * 1e3:.1f} ms a step: {ratio:.2f} (target 3.00-5.00) "
                  f"{verdict(ratio, 3.0, 5.0)}; emulator bound: {shares['emulator_bound']}")
        else:
            print(f"bandwidth and cpu shares: SKIP ({why})")
        extra = slow["total_s"] - fast["total_s"]
        least = slow["min_comm_s"]
        print(f"latency 50ms, bsp step with/without (side by side): +{extra * 1e3:.1f} ms "
              f"(median), {extra / (2 * LATENCY):.2f} x 2 x 50 ms; every step's communication "
              f">= {least * 1e3:.1f} ms: {least / (2 * LATENCY):.2f} (target >= 1.00) "
              f"{verdict(least / (2 * LATENCY), 1.0, float('inf'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
