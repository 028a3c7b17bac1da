"""How fast the simulator is: a million pushes, asp on 1024 workers and asp and bsp on 10,000.

Targets: 1024 workers x 1000 iterations of asp under 3 s; 10,000 workers x 100 iterations of
asp, and of bsp (every round releases all 10,000 at once), under 10 s each. The baseline of
each case, run at the same time in a process pinned to the other core, is the floor any
discrete-event simulator in Python pays for the same work: a bare event loop that pushes and
pops as many heap events (two per push: the step computed, the push reaching the server) and
draws as many random compute times, doing nothing else. The ratio says what the simulator's
network, policies and bookkeeping cost on top.

    python benchmarks/simulator.py            # the three cases
    python benchmarks/simulator.py --quick    # smoke run: the same strategies on 64 workers
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import multiprocessing as mp
import os
import random
import time

# (strategy, workers, iterations, target seconds)
CASES = [("asp", 1024, 1000, 3.0), ("asp", 10_000, 100, 10.0), ("bsp", 10_000, 100, 10.0)]
QUICK = [("asp", 64, 50, 3.0), ("asp", 64, 20, 10.0), ("bsp", 64, 20, 10.0)]


def simulated(strategy: str, workers: int, iterations: int) -> float:
    """Seconds to simulate: 1 server, a worker per host, 1 gbit, 8 s +- 1 s compute."""
    from polyrhythm.cli.sizing import model_size
    from polyrhythm.config import load_config
    from polyrhythm.sim import Costs, simulate

    config = load_config(strategy=strategy, workers=workers, worker_batch_size=32,
                         workers_per_host=1, bandwidth="1gbit", compute="emulated",
                         compute_time="8s", compute_jitter="1s", model="resnet20")
    costs = Costs(model_size(config).parameters)
    began = time.perf_counter()
    result = simulate(config, costs, iterations)
    seconds = time.perf_counter() - began
    assert sum(log.steps for log in result.logs) == workers * iterations
    return seconds


def bare_loop(strategy: str, workers: int, iterations: int) -> float:
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


def pinned(job, core: int, cases, results) -> None:
    """Run `job` on each case `cases` brings (until None), on `core` alone."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {core})
    for case in iter(cases.get, None):
        results.put((job.__name__, job(*case)))


def side_by_side(cases: list[tuple]):
    """For each case, the simulator's and the bare loop's seconds, run at once, each in a
    process of its own on a core of its own."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    queues = [ctx.Queue(), ctx.Queue()]
    procs = [ctx.Process(target=pinned, args=(job, cores[i % len(cores)], queues[i], results))
             for i, job in enumerate((simulated, bare_loop))]
    for p in procs:
        p.start()
    try:
        for case in cases:
            for queue in queues:
                queue.put(case)
            got = dict(results.get() for _ in procs)
            yield got["simulated"], got["bare_loop"]
    finally:
        for queue in queues:
            queue.put(None)
        for p in procs:
            p.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 64 workers")
    args = parser.parse_args()
    cases = QUICK if args.quick else CASES
    timed = side_by_side([(strategy, workers, iterations) for strategy, workers, iterations, _
                          in cases])
    for (strategy, workers, iterations, target), (sim_s, bare_s) in zip(cases, timed,
                                                                        strict=True):
        verdict = "PASS" if sim_s < target else "MISS"
        print(f"{strategy}, {workers} workers x {iterations} iterations: {sim_s:.2f} s "
              f"(target < {target:.0f} s) {verdict}; bare event loop {bare_s:.2f} s; "
              f"ratio {sim_s / bare_s:.1f}", flush=True)

if __name__ == "__main__":
    main()
