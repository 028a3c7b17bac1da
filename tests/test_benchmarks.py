"""Benchmarks are not timed tests: CI only checks that they run and report their ratios."""

import re
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def smoke(name: str) -> str:
    """A benchmark's --quick run; its output."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / name), "--quick"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_overhead_benchmark_smoke_prints_both_ratios():
    out = smoke("overhead.py")
    for label in ("bsp, 1 worker + 1 server", "allreduce, 2 workers"):
        row = re.search(rf"^{re.escape(label)} .* (\d+\.\d+)\s+0\.9\d\s+(PASS|BELOW)$",
                        out, re.MULTILINE)
        assert row, f"no result row for {label}:\n{out}"
        assert float(row.group(1)) > 0


def test_collectives_benchmark_smoke_prints_ring_ratios():
    out = smoke("collectives.py")
    ratios = re.findall(r"^ring/native (\d+ KiB): (\d+\.\d+) \(target <= 1\.50\) (PASS|MISS) ",
                        out, re.MULTILINE)
    assert [size for size, _, _ in ratios] == ["4 KiB", "64 KiB"], out
    assert all(float(ratio) > 0 for _, ratio, _ in ratios)


def test_instrumentation_benchmark_smoke_prints_the_ratio():
    out = smoke("instrumentation.py")
    row = re.search(r"^instrumentation on/off \(bsp, 2 workers\): (\d+\.\d+) "
                    r"\(target >= 0\.97\) (PASS|MISS) ", out, re.MULTILINE)
    assert row, out
    assert float(row.group(1)) > 0


def test_face_benchmark_smoke_prints_the_time():
    out = smoke("face.py")
    row = re.search(r"^polyrhythm runs, 50 runs: (\d+\.\d+) s \(target < 1\.5 s\) "
                    r"(PASS|MISS); bare interpreter (\d+\.\d+) s", out, re.MULTILINE)
    assert row, out
    # How fast this machine is that day is not asserted (a quick run may print 0.00 s):
    # only that the verdict follows the figure.
    assert (row.group(2) == "PASS") == (float(row.group(1)) < 1.5), row.group(0)


def test_cluster_benchmark_smoke_prints_its_ratios():
    out = smoke("cluster.py")
    latency = re.search(r"^latency 50ms, .* x 2 x 50 ms; every step's communication >= "
                        r"[\d.]+ ms: (\d+\.\d+) \(target >= 1\.00\) (PASS|MISS)$",
                        out, re.MULTILINE)
    assert latency and float(latency.group(1)) > 0, out
    shaped = re.findall(r": (\d+\.\d+) \(target (0\.75-1\.25|3\.00-5\.00)\) (PASS|MISS);",
                        out)
    assert len(shaped) == 3 or "bandwidth and cpu shares: SKIP" in out, out


def test_switch_benchmark_smoke_prints_the_switch_time():
    out = smoke("switch.py")
    row = re.search(r"^switch_s \(default task, median of 1\): (\d+\.\d+) s \(target < 1\.0 s\) "
                    r"(PASS|MISS); job start-up (\d+\.\d+) s", out, re.MULTILINE)
    assert row, out
    assert float(row.group(1)) > 0 and float(row.group(3)) > 0


def test_simulator_benchmark_smoke_prints_the_time_and_ratio():
    out = smoke("simulator.py")
    row = re.search(r"^asp, 64 workers x 50 iterations: (\d+\.\d+) s \(target < 10 s\) "
                    r"(PASS|MISS); bare event loop (\d+\.\d+) s; ratio (\d+\.\d+)$", out,
                    re.MULTILINE)
    assert row, out
    # Not how fast this machine is (the bare loop of a quick run may print 0.00 s): only that
    # the verdict follows the figure.
    assert (row.group(2) == "PASS") == (float(row.group(1)) < 10), row.group(0)
