"""How fast the simulator is: 1024 workers x 1000 iterations of asp (a million pushes).

Target: under 10 s here. The baseline, run at the same time in a process pinned to the other
core, is the floor any discrete-event simulator in Python pays for the same work: a bare
event loop that pushes and pops as many heap events (two per push: the step computed, the
push reaching the server) and draws as many random compute times, doing nothing else. The
ratio says what the simulator's network, policies and bookkeeping cost on top.

    python benchmarks/simulator.py            # 1024 workers x 1000 iterations
    python benchmarks/simulator.py --quick    # smoke run: 64 workers x 50 iterations
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import multiprocessing as mp
import os
import random
import time

TARGET_S = 10.0


def simulated(workers: int, iterations: int) -> float:
    """Seconds to simulate asp: 1 server, a worker per host, 1 gbit, 8 s +- 1 s compute."""
    from polyrhythm.cli.sizing import model_size
    from polyrhythm.config import load_config
    from polyrhythm.sim import Costs, simulate

    config = load_config(strategy="asp", workers=workers, worker_batch_size=32,
                         workers_per_host=1, bandwidth="1gbit", compute="emulated",
                         compute_time="8s", compute_jitter="1s", model="resnet20")
    costs = Costs(model_size(config).parameters)
    began = time.perf_counter()
    result = simulate(config, costs, iterations)
    seconds = time.perf_counter() - began
    assert sum(log.steps for log in result.logs) == workers * iterations
    return seconds


def bare_loop(workers: int, iterations: int) -> float:
    """Seconds for the same heap events and random draws with nothing else done."""
    rng = random.Random(0)
    began = time.perf_counter()
    events = [(rng.gauss(8, 1), w, 0) for w in range(workers)]
    heapq.heapify(events)
    left = [iterations] * workers
    while events:
        t, w, kind = heapq.heappop(events)
        if kind == 0:  # computed: the push goes
            heapq.heappush(events, (t + 0.001, w, 1))
        else:  # the push arrives: the reply lets the worker compute on
            left[w] -= 1
            if left[w]:
                heapq.heappush(events, (t + 0.001 + rng.gauss(8, 1), w, 0))
    return time.perf_counter() - began


def pinned(job, core: int, args: tuple, results) -> None:
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {core})
    results.put((job.__name__, job(*args)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 64 x 50")
    args = parser.parse_args()
    workers, iterations = (64, 50) if args.quick else (1024, 1000)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=pinned, args=(job, cores[i % len(cores)],
                                              (workers, iterations), results))
             for i, job in enumerate((simulated, bare_loop))]
    for p in procs:
        p.start()
    got = dict(results.get() for _ in procs)
    for p in procs:
        p.join()
    sim_s, bare_s = got["simulated"], got["bare_loop"]
    verdict = "PASS" if sim_s < TARGET_S else "MISS"
    print(f"asp, {workers} workers x {iterations} iterations: {sim_s:.2f} s "
          f"(target < {TARGET_S:.0f} s) {verdict}; bare event loop {bare_s:.2f} s; "
          f"ratio {sim_s / bare_s:.1f}")


if __name__ == "__main__":
    main()
