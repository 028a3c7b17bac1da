"""Benchmarks are not timed tests: CI only checks that their smoke runs report what they
configured, that every ratio is the quotient of the figures it is printed with, and that
every verdict follows its figure against its printed target. How fast this machine is that
day is never asserted: a quick run may print 0.00 s, or any verdict."""

import importlib.util
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import needs_emulated_cluster
from polyrhythm.errors import ClusterError
from polyrhythm.launch.cluster.hosts import leftovers
from polyrhythm.layout import ALGORITHMS

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
NUMBER = r"-?\d+(?:\.\d+)?"


# Smoke runs that may share the machine start together, at the first one's test: the module
# then takes about the longest of them, not their sum. Those that make emulated clusters, or
# check a time they measure (outage.py), run alone, in their own tests.
TOGETHER = ("overhead.py", "collectives.py", "instrumentation.py", "face.py", "switch.py",
            "simulator.py", "script.py", "checkpoints.py")
_running: dict[str, subprocess.Popen] = {}
_started_together = []


def _start(name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(BENCHMARKS / name), "--quick"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(autouse=True, scope="module")
def _no_smoke_left():
    """Smoke runs started together and never waited for (their tests deselected) end with
    the module."""
    yield
    for proc in _running.values():
        proc.kill()
        proc.communicate()


def smoke(name: str) -> str:
    """A benchmark's --quick run; its output."""
    if name in TOGETHER and not _started_together:
        _started_together.append(True)
        _running.update((other, _start(other)) for other in TOGETHER)
    proc = _running.pop(name, None) or _start(name)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, stderr[-2000:]
    return stdout


def bounds(printed: str | float) -> tuple[float, float]:
    """The values a printed figure may have been before it was rounded to its last digit (a
    float given as such is exact)."""
    if isinstance(printed, float):
        return printed, printed
    half = 0.5 * 10.0 ** -len(printed.partition(".")[2])
    value = float(printed)
    return value - half, value + half


def is_quotient(ratio: str, numerator: str, denominator: str | float) -> bool:
    """Whether the printed `ratio` can be numerator / denominator for values that print as
    those figures. A denominator that may have been 0 allows any ratio."""
    (n0, n1), (d0, d1), (r0, r1) = bounds(numerator), bounds(denominator), bounds(ratio)
    if d0 <= 0 <= d1:
        return True
    quotients = [n / d for n in (n0, n1) for d in (d0, d1)]  # extremes at the corners
    slack = 1e-9 * max(1.0, *map(abs, quotients))  # the float arithmetic of this check
    return min(quotients) - slack <= r1 and r0 <= max(quotients) + slack


def follows(verdict: str, figure: str, passes: Callable[[float], bool],
            fail: str = "MISS") -> bool:
    """Whether `verdict` is PASS exactly when the figure passes its target; a figure that
    rounds to the target itself may have been on either side, so either verdict is right."""
    low, high = (passes(v) for v in bounds(figure))
    if low != high:
        return verdict in ("PASS", fail)
    return verdict == ("PASS" if low else fail)


def test_the_checks_read_print_rounding():
    assert is_quotient("1.06", "4.248", "4.496") is False  # native/ring, not ring/native
    assert is_quotient("1.06", "4.496", "4.248")
    assert is_quotient("0.974", "9553", "9804") and not is_quotient("0.980", "9553", "9804")
    assert is_quotient("16", "1.89", "0.117") and not is_quotient("12", "1.89", "0.117")
    assert is_quotient("5.0", "0.01", "0.00")  # a denominator printed as 0: anything
    assert is_quotient("1.02", "101.6", 100.0) and not is_quotient("1.03", "101.6", 100.0)
    assert follows("PASS", "0.974", lambda r: r >= 0.90, "BELOW")
    assert not follows("PASS", "0.899", lambda r: r >= 0.90, "BELOW")
    assert follows("BELOW", "0.900", lambda r: r >= 0.90, "BELOW")  # 0.8996 prints 0.900
    assert follows("PASS", "1.50", lambda s: s < 1.5)  # 1.4996 prints 1.50
    assert not follows("PASS", "1.51", lambda s: s < 1.5)
    assert not follows("MISS", "0.10", lambda s: s < 1.5)


def test_overhead_benchmark_smoke_prints_both_ratios():
    out = smoke("overhead.py")
    assert re.search(r"^cnn on mnist5k, global batch 64, 2 epochs \(1 warm-up\) of 8 steps, "
                     r"1 repeats, ", out, re.MULTILINE), out
    assert re.search(r"^the sides (at once, a core each|in turn, each on every core)", out,
                     re.MULTILINE), out
    for label, baseline in (("bsp, 1 worker + 1 server", "plain loop, 1 process"),
                            ("allreduce, 2 workers", "DDP (Gloo), 2 processes")):
        (repeat,) = re.findall(rf"^  repeat (\d+)/1  {re.escape(label)} +baseline +(\d+)/s  "
                               rf"polyrhythm +(\d+)/s  ratio (\d+\.\d{{3}})  other load ",
                               out, re.MULTILINE)
        row = re.search(rf"^{re.escape(label)} +{re.escape(baseline)} +(\d+) +(\d+) +(\d+) +"
                        rf"(\d+\.\d{{3}}) +(\d\.\d\d)  (PASS|BELOW)$", out, re.MULTILINE)
        assert row, f"no result row for {label}:\n{out}"
        threads, base, ours, ratio, target, verdict = row.groups()
        # Side by side (a core each) or in turn on a single core: one torch thread a process.
        assert int(threads) == 1, row.group(0)
        # One repeat: the table's medians are that repeat's figures.
        assert repeat == ("1", base, ours, ratio), (repeat, row.group(0))
        assert is_quotient(ratio, ours, base), row.group(0)
        assert follows(verdict, ratio, lambda r, t=float(target): r >= t, "BELOW"), row.group(0)


def test_collectives_benchmark_smoke_prints_ring_ratios():
    out = smoke("collectives.py")
    assert re.search(r"^all-reduce of float32 tensors: 4 processes \(Gloo, loopback\), .*; "
                     r"median of 1 repetitions after 1 warm-up, 2 all-reduces per timing$",
                     out, re.MULTILINE), out
    algorithms = ["native", *ALGORITHMS]
    assert re.search(r"^ +size +" + " +".join(algorithms) + r" +\(ms per all-reduce\)$", out,
                     re.MULTILINE), out
    ms = {}
    for size in ("4 KiB", "64 KiB"):
        row = re.search(rf"^ +{size}((?: +\d+\.\d{{3}}){{{len(algorithms)}}})$", out,
                        re.MULTILINE)
        assert row, f"no row for {size}:\n{out}"
        ms[size] = dict(zip(algorithms, row.group(1).split(), strict=True))
    ratios = re.findall(r"^ring/native (\d+ KiB): (\d+\.\d\d) \(target <= (\d\.\d\d)\) "
                        r"(PASS|MISS)  \[repetitions: (\d+\.\d\d)-(\d+\.\d\d)\]$", out,
                        re.MULTILINE)
    assert [size for size, *_ in ratios] == ["4 KiB", "64 KiB"], out
    for size, ratio, target, verdict, least, most in ratios:
        # One repetition: the ratio is that repetition's, its times the table's.
        assert least == most == ratio, (size, ratio, least, most)
        assert is_quotient(ratio, ms[size]["ring"], ms[size]["native"]), (size, ratio, ms[size])
        assert follows(verdict, ratio, lambda r, t=float(target): r <= t), (size, ratio, verdict)


def test_instrumentation_benchmark_smoke_prints_the_ratio():
    out = smoke("instrumentation.py")
    assert re.search(r"^bsp, 2 workers, 6 epochs per run, (side by side, one core each|in "
                     r"turn on one core)$", out, re.MULTILINE), out
    repeats = re.findall(r"^repeat (\d+): on (\d+) samples/s, off (\d+) samples/s, ratio "
                         r"(\d+\.\d{3})$", out, re.MULTILINE)
    assert [number for number, *_ in repeats] == ["1"], out  # --quick: one repeat
    ((_, on, off, paired),) = repeats
    assert is_quotient(paired, on, off), repeats
    row = re.search(r"^instrumentation on/off \(bsp, 2 workers\): (\d+\.\d{3}) \(target >= "
                    r"(\d\.\d\d)\) (PASS|MISS)  \[repeats: (\d+\.\d{3})-(\d+\.\d{3})\]$", out,
                    re.MULTILINE)
    assert row, out
    ratio, target, verdict, least, most = row.groups()
    assert ratio == least == most == paired, row.group(0)  # the median of one repeat
    assert follows(verdict, ratio, lambda r: r >= float(target)), row.group(0)


def test_checkpoints_benchmark_smoke_prints_each_figure_of_both_sides_and_their_ratio():
    out = smoke("checkpoints.py")  # --quick: this checkout against itself
    assert re.search(rf"^resnet20 \({NUMBER}M parameters\), a checkpoint after epoch 1 of a "
                     rf"1-worker run: model.pt {NUMBER} MB, worker-0.pt {NUMBER} MB, snapshot "
                     rf"{NUMBER} MB; median of 1 repeats, the sides in turn$", out,
                     re.MULTILINE), out
    for name in ("checkpoint written", "resume's check, cached", "resume's check, from disk"):
        row = re.search(rf"^{re.escape(name)} +now +({NUMBER}) s  before +({NUMBER}) s  "
                        rf"ratio ({NUMBER})  \[repeats: ({NUMBER})-({NUMBER})\]$", out,
                        re.MULTILINE)
        assert row, f"no row for {name}:\n{out}"
        now, before, ratio, least, most = row.groups()
        assert ratio == least == most, row.group(0)  # the median of one repeat
        assert is_quotient(ratio, now, before), row.group(0)


def test_face_benchmark_smoke_prints_the_time():
    out = smoke("face.py")
    row = re.search(r"^polyrhythm runs, 50 runs: (\d+\.\d\d) s \(target < (\d\.\d) s\) "
                    r"(PASS|MISS); bare interpreter (\d+\.\d\d) s, ratio (\d+\.\d); range "
                    r"(\d+\.\d\d)-(\d+\.\d\d) s over (\d+) repeats$", out, re.MULTILINE)
    assert row, out
    median, target, verdict, bare, ratio, least, most, repeats = row.groups()
    assert repeats == "3"  # --quick
    assert float(least) <= float(median) <= float(most), row.group(0)
    assert is_quotient(ratio, median, bare), row.group(0)
    assert follows(verdict, median, lambda s: s < float(target)), row.group(0)


def test_cluster_benchmark_smoke_prints_its_ratios():
    out = smoke("cluster.py")
    latency = re.search(r"^latency 50ms, bsp step with/without \(side by side\): \+(-?\d+\.\d) "
                        r"ms \(median\), (-?\d+\.\d\d) x 2 x 50 ms; every step's communication "
                        r">= (-?\d+\.\d) ms: (-?\d+\.\d\d) \(target >= (\d\.\d\d)\) "
                        r"(PASS|MISS)$", out, re.MULTILINE)
    assert latency, out
    extra, extra_ratio, least, ratio, target, verdict = latency.groups()
    assert is_quotient(extra_ratio, extra, 100.0), latency.group(0)  # 2 x 50 ms, in ms
    assert is_quotient(ratio, least, 100.0), latency.group(0)
    assert follows(verdict, ratio, lambda r: r >= float(target)), latency.group(0)
    if "bandwidth and cpu shares: SKIP" in out:
        return
    # (the figure's label, its numerator, denominator, ratio, target range and verdict);
    # --quick: the bandwidth figures on 2 hosts
    shaped = [
        *re.findall(rf"^all-reduce of \|w\| on 2 hosts at 100mbit: ({NUMBER}) ms, model "
                    rf"({NUMBER}) ms: ({NUMBER}) \(target ({NUMBER})-({NUMBER})\) (PASS|MISS);",
                    out, re.MULTILINE),
        *re.findall(rf"^bsp step, 1 server \+ 1 worker at 100mbit: ({NUMBER}) ms beyond "
                    rf"compute, naive-PS bound ({NUMBER}) ms: ({NUMBER}) \(target "
                    rf"({NUMBER})-({NUMBER})\) (PASS|MISS);", out, re.MULTILINE),
        # the 0.25-core worker's step over the 1-core worker's: slow / fast
        *((slow, fast, *rest) for fast, slow, *rest in re.findall(
            rf"^cpu shares 1 and 0\.25, asp, real compute: ({NUMBER}) and ({NUMBER}) ms a step: "
            rf"({NUMBER}) \(target ({NUMBER})-({NUMBER})\) (PASS|MISS);", out, re.MULTILINE)),
    ]
    assert len(shaped) == 3, out
    for numerator, denominator, ratio, low, high, verdict in shaped:
        assert is_quotient(ratio, numerator, denominator), (numerator, denominator, ratio)
        assert follows(verdict, ratio, lambda r, a=float(low), b=float(high): a <= r <= b), (
            ratio, low, high, verdict)


def test_switch_benchmark_smoke_prints_the_switch_time():
    out = smoke("switch.py")
    row = re.search(r"^switch_s \(default task, median of (\d+)\): (\d+\.\d{3}) s \(target < "
                    r"(\d\.\d) s\) (PASS|MISS); job start-up (\d+\.\d\d) s, (\d+)x the switch$",
                    out, re.MULTILINE)
    assert row, out
    runs, switch_s, target, verdict, startup, times = row.groups()
    assert runs == "1"  # --quick
    assert follows(verdict, switch_s, lambda s: s < float(target)), row.group(0)
    assert is_quotient(times, startup, switch_s), row.group(0)


def test_simulator_benchmark_smoke_prints_each_cases_time_and_ratio():
    out = smoke("simulator.py")
    rows = re.findall(r"^(\w+), (\d+) workers x (\d+) iterations: (\d+\.\d\d) s \(target < "
                      r"(\d+) s\) (PASS|MISS); bare event loop (\d+\.\d\d) s; ratio (\d+\.\d)$",
                      out, re.MULTILINE)
    # --quick: the three cases' strategies and targets, on 64 workers.
    assert [row[:3] + row[4:5] for row in rows] == [
        ("asp", "64", "50", "3"), ("asp", "64", "20", "10"), ("bsp", "64", "20", "10")], out
    for *_, simulated, target, verdict, bare, ratio in rows:
        assert is_quotient(ratio, simulated, bare), (simulated, bare, ratio)
        assert follows(verdict, simulated, lambda s, t=target: s < float(t)), (simulated, target)


def test_script_benchmark_smoke_prints_both_ratios():
    out = smoke("script.py")
    assert re.search(r"^examples/char_lm\.py --steps 12 --measure-after 4 --log-every 0 .*: "
                     r"1 repeats, (side by side, one core each|in turn on one core), 1 torch "
                     r"thread a process$", out, re.MULTILINE), out
    for label, baseline in (("allreduce under torchrun, 2 workers",
                             "DDP under torchrun, 2 processes"),
                            ("bsp, 1 worker + 1 server", "plain python, 1 process")):
        repeats = re.findall(rf"^  repeat (\d+)/1  {re.escape(label)} ({NUMBER})/s  "
                             rf"{re.escape(baseline)} ({NUMBER})/s  ratio (\d+\.\d{{3}})  "
                             rf"other load (?:\d+\.\d\d|\?) cores$", out, re.MULTILINE)
        assert [number for number, *_ in repeats] == ["1"], out  # --quick: one repeat
        ((_, ours, base, paired),) = repeats
        assert is_quotient(paired, ours, base), repeats
        row = re.search(rf"^{re.escape(label)} / {re.escape(baseline)}: (\d+\.\d{{3}}) "
                        rf"\(target >= (\d\.\d\d)\) (PASS|MISS)  \[repeats: (\d+\.\d{{3}})-"
                        rf"(\d+\.\d{{3}}); median samples/s ({NUMBER}) and ({NUMBER})\]$", out,
                        re.MULTILINE)
        assert row, f"no result row for {label}:\n{out}"
        ratio, target, verdict, least, most, median_ours, median_base = row.groups()
        # One repeat: the medians are that repeat's figures.
        assert ratio == least == most == paired, row.group(0)
        assert (median_ours, median_base) == (ours, base), row.group(0)
        assert follows(verdict, ratio, lambda r, t=float(target): r >= t), row.group(0)


def differs_by(points: str, ours: str, theirs: str) -> bool:
    """Whether the printed `points` can be 100 x (ours - theirs) for accuracies that print as
    those figures."""
    (p0, p1), (a0, a1), (b0, b1) = bounds(points), bounds(ours), bounds(theirs)
    slack = 1e-9
    return 100 * (a0 - b1) - slack <= p1 and p0 <= 100 * (a1 - b0) + slack


@needs_emulated_cluster
def test_compression_benchmark_smoke_prints_both_figures_and_leaves_nothing():
    """polyrhythm's PowerSGD against DDP's hook, each on an emulated 2-host cluster: the
    ratio of samples/s and the difference of final accuracy follow from the figures they are
    printed with, and neither cluster is left behind."""
    before = leftovers()
    out = smoke("compression.py")
    assert leftovers() == before
    assert re.search(r"^examples/char_lm\.py --steps 12 --measure-after 4 --log-every 0 .*: "
                     r"2 hosts at 100mbit, powersgd rank 4, 1 repeats, (side by side, one core "
                     r"each|in turn on one core), 1 torch thread a process$", out,
                     re.MULTILINE), out
    ours, theirs = "polyrhythm allreduce + powersgd", "DDP + powerSGD_hook"
    repeats = re.findall(rf"^  repeat (\d+)/1  {re.escape(ours)} ({NUMBER})/s accuracy "
                         rf"(\d\.\d{{4}})  {re.escape(theirs)} ({NUMBER})/s accuracy "
                         rf"(\d\.\d{{4}})  ratio (\d+\.\d{{3}})  other load "
                         rf"(?:\d+\.\d\d|\?) cores$", out, re.MULTILINE)
    assert [number for number, *_ in repeats] == ["1"], out  # --quick: one repeat
    ((_, rate, accuracy, base_rate, base_accuracy, paired),) = repeats
    assert is_quotient(paired, rate, base_rate), repeats
    speed = re.search(rf"^samples/s {re.escape(ours)} / {re.escape(theirs)}: (\d+\.\d{{3}}) "
                      rf"\(target >= (\d\.\d\d)\) (PASS|MISS)  \[repeats: (\d+\.\d{{3}})-"
                      rf"(\d+\.\d{{3}}); median samples/s ({NUMBER}) and ({NUMBER})\]$", out,
                      re.MULTILINE)
    assert speed, out
    ratio, target, verdict, least, most, median, median_base = speed.groups()
    # One repeat: the medians are that repeat's figures.
    assert ratio == least == most == paired and (median, median_base) == (rate, base_rate)
    assert follows(verdict, ratio, lambda r: r >= float(target)), speed.group(0)
    accuracy_row = re.search(
        rf"^final validation accuracy {re.escape(ours)} - {re.escape(theirs)}: ([+-]\d+\.\d\d) "
        rf"points \(target within (\d\.\d\d)\) (PASS|MISS)  \[repeats: ([+-]\d+\.\d\d) to "
        rf"([+-]\d+\.\d\d); median accuracy (\d\.\d{{4}}) and (\d\.\d{{4}})\]$", out,
        re.MULTILINE)
    assert accuracy_row, out
    points, target, verdict, least, most, median, median_base = accuracy_row.groups()
    assert points == least == most and (median, median_base) == (accuracy, base_accuracy)
    assert differs_by(points, accuracy, base_accuracy), accuracy_row.group(0)
    assert follows(verdict, points, lambda p: abs(p) <= float(target)), accuracy_row.group(0)


def script_benchmark(monkeypatch):
    """benchmarks/script.py as a module (benchmarks are scripts, not a package), known to
    sys.modules while the test runs, as its dataclass needs, and its folder on the path, as
    when it runs."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("script_benchmark", BENCHMARKS / "script.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def finished(*lines: str, code: int) -> subprocess.Popen:
    """A process that prints `lines` and exits with `code`, as a job would."""
    echo = "import sys; print(*sys.argv[2:], sep='\\n'); sys.exit(int(sys.argv[1]))"
    return subprocess.Popen([sys.executable, "-c", echo, str(code), *lines],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_script_benchmark_reads_a_jobs_figure_and_names_its_failure(capsys, monkeypatch):
    bench = script_benchmark(monkeypatch)
    figure = "samples/s 812.4 over 180 steps of 16 samples (3.545 s)"
    assert bench.measured_rate("job", finished("val_loss 2.3", figure, code=0)) == 812.4
    assert capsys.readouterr().out == ""
    # A rank that failed before worker 0's figure: one line with the ranks' error line.
    with pytest.raises(SystemExit) as failed:
        bench.measured_rate("job", finished("Traceback (most recent call last):",
                                            "RuntimeError: Connection reset by peer",
                                            "=" * 20, code=1))
    message = str(failed.value)
    assert message.startswith("job failed (exit code 1): RuntimeError: Connection reset by "
                              "peer (its output: "), message
    assert "\n" not in message
    log = Path(message.rpartition("its output: ")[2].rstrip(")"))
    assert log.read_text().splitlines()[-1] == "=" * 20
    log.unlink()
    # One that failed as it ended, after the figure: the figure stands, a line says so.
    rate = bench.measured_rate("job", finished(figure, "terminate called without an active "
                                               "exception", code=1))
    assert rate == 812.4
    note = capsys.readouterr().out
    assert re.fullmatch(r"  note: job failed after training, as it ended \(exit code 1\): "
                        r"terminate called without an active exception \(its output: (\S+)\); "
                        r"its figure stands\n", note), note
    Path(re.search(r"its output: (\S+)\)", note).group(1)).unlink()


def test_script_benchmark_against_another_checkout_runs_its_jobs(monkeypatch, tmp_path):
    """--against: each job of this checkout beside the same job of the other, which runs its
    own char_lm.py with its own src/ first on the path."""
    bench = script_benchmark(monkeypatch)
    now, then = bench.comparisons("out", tmp_path)
    other = str(tmp_path / "examples" / "char_lm.py")
    for comp in (now, then):
        assert comp.command.count("SCRIPT") == 1 and "SCRIPT" not in comp.baseline_command
        assert [other if part == "SCRIPT" else part for part in comp.command] == (
            comp.baseline_command)
        assert comp.baseline_env["PYTHONPATH"] == str(tmp_path / "src")
        assert comp.target == 0.98
    assert now.env["POLYRHYTHM_STRATEGY"] == now.baseline_env["POLYRHYTHM_STRATEGY"]
    with pytest.raises(SystemExit, match="not a checkout of polyrhythm"):
        bench.main(["--quick", "--against", str(tmp_path)])


def compression_benchmark(monkeypatch):
    """benchmarks/compression.py as a module, as script_benchmark loads script.py (it imports
    script.py and machine_load.py from its folder)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("compression_benchmark",
                                                  BENCHMARKS / "compression.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_compression_benchmark_without_a_cluster_says_skip(capsys, monkeypatch):
    bench = compression_benchmark(monkeypatch)

    def cannot() -> None:
        raise ClusterError("an emulated cluster needs root (network namespaces, tc, cgroups)")
    monkeypatch.setattr(bench, "can_emulate", cannot)
    assert bench.main(["--quick"]) == 0
    assert capsys.readouterr().out == (
        "polyrhythm allreduce + powersgd / DDP + powerSGD_hook on an emulated cluster: SKIP "
        "(an emulated cluster needs root (network namespaces, tc, cgroups))\n")


def test_compression_benchmark_reads_a_jobs_figures_and_names_its_failure(tmp_path, capsys,
                                                                          monkeypatch):
    bench = compression_benchmark(monkeypatch)

    def job(name: str, code: int, *hosts: list[str]):
        """A job whose hosts printed these lines into their logs and exited with `code`."""
        logs = []
        for host, lines in enumerate(hosts):
            logs.append(tmp_path / f"{name}-{host}.log")
            logs[-1].write_text("".join(f"{line}\n" for line in lines))
        return bench.Job(name, [finished(code=code)], logs)

    figure = "samples/s 265.8 over 180 steps of 32 samples (21.670 s)"
    validated = "val_loss 2.1707 val_accuracy 0.4165"
    summary = '{"run_id": "x", "cluster": {"name": null}}'
    assert bench.figures(job(bench.POLYRHYTHM, 0, [validated, figure, summary])) == (265.8,
                                                                                     0.4165)
    assert bench.figures(job(bench.DDP, 0, [validated, figure], [])) == (265.8, 0.4165)
    # A line torchrun's --tee passed on with its next line's mark (polyrhythm run --hosts).
    assert bench.figures(job(bench.POLYRHYTHM, 0, [validated + "[default0]:", figure,
                                                   summary])) == (265.8, 0.4165)
    assert capsys.readouterr().out == ""
    # A job that ended well without its figures says which it did not print.
    with pytest.raises(bench.JobFailed) as failed:
        bench.figures(job(bench.DDP, 0, [figure], []))
    assert str(failed.value).startswith("DDP + powerSGD_hook failed (exit code 0): worker 0 "
                                        "printed no val_accuracy line (its output: ")
    Path(re.search(r"its output: (\S+)\)", str(failed.value)).group(1)).unlink()
    # The polyrhythm side on someone's standing cluster rather than one of its own.
    standing = '{"run_id": "x", "cluster": {"name": "default"}}'
    with pytest.raises(bench.JobFailed, match="ran on the standing cluster 'default', not one "
                                              "of its own"):
        bench.figures(job(bench.POLYRHYTHM, 0, [validated, figure, standing]))
    # A rank that failed on host 1 before worker 0's figures: one line with its error line.
    with pytest.raises(bench.JobFailed) as failed:
        bench.figures(job(bench.DDP, 1, ["W socket warning"],
                          ["Traceback (most recent call last):",
                           "RuntimeError: Connection reset by peer"]))
    message = str(failed.value)
    assert re.fullmatch(r"DDP \+ powerSGD_hook failed \(exit code 1\): RuntimeError: "
                        r"Connection reset by peer \(its output: (\S+)\)", message), message
    kept = Path(re.search(r"its output: (\S+)\)", message).group(1))
    assert "==> DDP + powerSGD_hook-1.log <==" in kept.read_text()
    kept.unlink()


def test_outage_benchmark_smoke_fails_as_it_must():
    """The long outage's run fails naming the host (the script exits 1 otherwise; the short
    outages are tests/test_cluster_faults.py's); its ratio is the quotient of its figures."""
    out = smoke("outage.py")
    if "outages: SKIP" in out:
        return
    long = re.search(rf"^long outage \(10 s, --timeout 3\): failed naming host 1 after "
                     rf"({NUMBER}) s against (\d+) s: ratio ({NUMBER}) \(target <= 1\) "
                     rf"(PASS|MISS)$", out, re.MULTILINE)
    assert long, out
    took, bound, ratio, verdict = long.groups()
    assert bound == "13" and is_quotient(ratio, took, bound), long.group(0)
    assert follows(verdict, ratio, lambda r: r <= 1), long.group(0)


def test_soak_benchmark_smoke_checks_its_runs_and_finds_nothing_wrong():
    """A run killed and resumed (the script exits 1 on any violation): in the table, no
    invariant broken."""
    out = smoke("soak.py")
    runs = re.findall(r"^run +\d+ (\w+) +(loopback|\d hosts) ", out, re.MULTILINE)
    assert [name for name, _ in runs] == ["bsp"], out
    assert re.search(r"^1 runs in \d+ s$", out, re.MULTILINE), out
    assert "\nviolations: 0\n" in out


def test_elastic_benchmark_smoke_prints_the_wait_after_a_loss():
    out = smoke("elastic.py")
    runs = re.findall(rf"^  run 1/1  death to next committed step ({NUMBER}) s  interval "
                      rf"before ({NUMBER}) s  ratio ({NUMBER})$", out, re.MULTILINE)
    rows = re.findall(rf"^(bsp|allreduce): death to the next committed step \(median of 1\): "
                      rf"({NUMBER}) s \(target < (\d) s\) (PASS|MISS); ({NUMBER})x the "
                      "interval before it$", out, re.MULTILINE)
    assert len(runs) == 2 and [r[0] for r in rows] == ["bsp", "allreduce"], out
    for (wait_s, interval, ratio), (_, wait, target, verdict, row_ratio) in zip(runs, rows,
                                                                                strict=True):
        assert is_quotient(ratio, wait_s, interval), (wait_s, interval, ratio)
        assert wait == wait_s and row_ratio == ratio  # one run: its figures
        assert follows(verdict, wait, lambda s, t=float(target): s < t), (wait, verdict)
    # The whole runs: the time each way lost to the loss, from the walls printed.
    run = re.search(rf"^  run 1/1  uninterrupted ({NUMBER}) s  elastic ({NUMBER}) s  failed "
                    rf"\+ resumed ({NUMBER}) \+ ({NUMBER}) s$", out, re.MULTILINE)
    lost = re.search(rf"^time lost to the loss \(median of 1\): elastic ({NUMBER}) s, "
                     rf"restarted ({NUMBER}) s$", out, re.MULTILINE)
    assert run and lost, out
    plain, elastic, failed, resumed = map(float, run.groups())
    assert float(lost.group(1)) == pytest.approx(elastic - plain, abs=0.011)
    assert float(lost.group(2)) == pytest.approx(failed + resumed - plain, abs=0.011)
    # What going on costs, nobody lost: each strategy's ratio of the rates printed.
    priced = re.findall(rf"^  run 1/1  abort ({NUMBER}) samples/s  continue ({NUMBER}) "
                        rf"samples/s  ratio ({NUMBER})$", out, re.MULTILINE)
    costs = re.findall(rf"^(allreduce|ring): going on costs \(median of 1\): ({NUMBER})x "
                       "abort's samples/s$", out, re.MULTILINE)
    assert len(priced) == 2 and [c[0] for c in costs] == ["allreduce", "ring"], out
    for (native, elastic, ratio), (_, cost) in zip(priced, costs, strict=True):
        assert is_quotient(ratio, elastic, native) and cost == ratio


def test_fault_schedule_benchmark_smoke_prints_what_a_run_keeps_and_its_prediction():
    out = smoke("fault_schedule.py")
    signed = r"[+-]\d+\.\d"
    pair = re.search(rf"^  pair 1/1  faulty ({NUMBER}) samples/s over ({NUMBER}) s \(deaths "
                     rf"at ({NUMBER}), ({NUMBER}) s\)  fault-free ({NUMBER})  kept ({NUMBER})  "
                     rf"predicted ({NUMBER}) samples/s, kept ({NUMBER})  error ({signed})%$",
                     out, re.MULTILINE)
    row = re.search(rf"^allreduce: the simulator's error under the schedule \(median of 1\): "
                    rf"({signed})% \(target within 20%\) (PASS|MISS)$", out, re.MULTILINE)
    assert pair and row, out
    faulty, span, first, second, free, kept, guess, guess_kept, error = pair.groups()
    assert 0 < float(first) < float(second) < float(span)  # two deaths within the run
    assert is_quotient(kept, faulty, free)
    assert 0 < float(guess_kept) <= 1  # a prediction keeps a share of the fault-free pace
    # The error is the prediction over the measurement, less 1 (to the printed digits).
    assert abs(float(guess) / float(faulty) - 1 - float(error) / 100) < 0.001
    assert row.group(1) == error  # one pair: its error is the median
    assert follows(row.group(2), error.lstrip("+-"), lambda e: e <= 20)
