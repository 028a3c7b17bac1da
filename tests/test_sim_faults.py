"""The simulator under a fault schedule: a worker lost every T seconds, replaced after R or
never, the others going on; the throughput kept, from simulations of each worker count."""

from __future__ import annotations

import json

import pytest

from polyrhythm.cli import main
from polyrhythm.errors import ConfigError
from polyrhythm.sim import Costs, simulate
from polyrhythm.sim.faults import FaultSchedule, under_faults
from polyrhythm.sim.setup import simulation_config

COSTS = Costs(200_000, update_s=0.0005)


def config(strategy: str, workers: int, **fields):
    servers = {"servers": 1} if strategy in ("bsp", "asp") else {}
    return simulation_config({"strategy": strategy, "workers": workers, "compute": "emulated",
                              "compute_time": "50ms", "compute_jitter": "5ms",
                              "batch_size": 32 * workers, "bandwidth": "1gbit",
                              "workers_per_host": 1, "on_worker_failure": "continue",
                              **servers, **fields})


def test_never_replaced_the_count_falls_by_one_each_period():
    timeline = FaultSchedule(15, 60).timeline(4, 1)
    assert timeline.spans == [(0.0, 15, 4), (15, 30, 3), (30, 45, 2), (45, 60, 1)]
    assert timeline.losses == [(15, 4), (30, 3), (45, 2)]  # a loss at the span's end: none
    assert timeline.replaced == 0 and timeline.fails_at_s is None


def test_replaced_the_count_comes_back_after_each_loss():
    timeline = FaultSchedule(15, 60, replaced_after_s=5).timeline(4, 1)
    assert timeline.spans == [(0.0, 15, 4), (15, 20, 3), (20, 30, 4), (30, 35, 3),
                              (35, 45, 4), (45, 50, 3), (50, 60, 4)]
    assert timeline.replaced == 3 and len(timeline.losses) == 3


def test_a_replacement_due_with_a_loss_comes_first():
    timeline = FaultSchedule(10, 40, replaced_after_s=10).timeline(3, 1)
    assert timeline.spans == [(0.0, 10, 3), (10, 20, 2), (20, 30, 2), (30, 40, 2)]


def test_a_replacement_after_no_time_follows_its_own_loss():
    timeline = FaultSchedule(10, 30, replaced_after_s=0).timeline(3, 1)
    assert timeline.spans == [(0.0, 10, 3), (10, 20, 3), (20, 30, 3)]
    assert timeline.losses == [(10, 3), (20, 3)] and timeline.replaced == 2


def test_times_that_meet_in_decimals_meet_in_floats():
    """0.3 s periods: the 3rd loss (3 x 0.3) and the 2nd one's replacement (2 x 0.3 + 0.3)
    are the same instant, though not the same float; scaled by 1,000 alike."""
    small = FaultSchedule(0.3, 3, replaced_after_s=0.3).timeline(3, 2)
    large = FaultSchedule(300, 3000, replaced_after_s=300).timeline(3, 2)
    assert small.fails_at_s is large.fails_at_s is None
    assert [n for *_, n in small.spans] == [n for *_, n in large.spans]


def test_a_loss_below_min_workers_fails_the_run_there():
    timeline = FaultSchedule(10, 100).timeline(3, 2)
    assert timeline.spans == [(0.0, 10, 3), (10, 20, 2)] and timeline.fails_at_s == 20


@pytest.mark.parametrize("fields", [{"every_s": 0, "over_s": 10},
                                    {"every_s": 5, "over_s": -1},
                                    {"every_s": 5, "over_s": 10, "replaced_after_s": -2},
                                    {"every_s": 1e-6, "over_s": 3600}])
def test_a_schedule_that_cannot_be_is_one_line(fields):
    with pytest.raises(ConfigError):
        FaultSchedule(**fields)


def test_asynchronous_workers_lose_only_the_lost_workers_share():
    """asp: n workers train at the n-worker simulation's pace; a loss costs the others
    nothing more. The prediction is the time-weighted mean of the counts' samples/s."""
    schedule = FaultSchedule(2.0, 6.0)
    got = under_faults(config("asp", 4), COSTS, schedule, 40)
    rates = {n: simulate(config("asp", n), COSTS, 40).samples_per_s for n in (4, 3, 2)}
    assert got.samples_per_s == pytest.approx((2 * rates[4] + 2 * rates[3] + 2 * rates[2]) / 6,
                                              rel=1e-12)
    assert got.fault_free_samples_per_s == rates[4]
    assert 0.5 < got.kept < 1.0


def test_synchronous_workers_redo_the_step_a_loss_interrupted():
    """allreduce: each loss costs the workers left one step of the count before it."""
    schedule = FaultSchedule(2.0, 6.0)
    got = under_faults(config("allreduce", 4), COSTS, schedule, 40)
    runs = {n: simulate(config("allreduce", n), COSTS, 40) for n in (4, 3, 2)}
    spans = 2 * sum(runs[n].samples_per_s for n in (4, 3, 2))
    redone = sum(runs[n - 1].samples_per_s * runs[n].iteration_s for n in (4, 3))
    assert got.samples_per_s == pytest.approx((spans - redone) / 6, rel=1e-12)


def test_no_loss_within_the_span_keeps_everything():
    got = under_faults(config("bsp", 3), COSTS, FaultSchedule(10.0, 5.0), 30)
    assert got.kept == 1.0 and not got.timeline.losses


def test_simulate_prints_and_stores_what_each_strategy_keeps(tmp_path, capsys):
    code = main(["simulate", "--strategy", "asp", "--servers", "1", "--workers", "4",
                 "--compute-time", "50ms", "--lose-every", "10s", "--replace-after", "5s",
                 "--over", "60s", "--iterations", "30", "--out", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    assert "under faults (a worker lost every 10 s, each replaced after 5 s, over 60 s)" in out
    faults = json.loads(out.strip().splitlines()[-1])["faults"]
    assert faults["lost"] == 5 and faults["replaced"] == 5 and faults["fails_at_s"] is None
    # Half of each period a worker short: 3/4 of the pace for half the time (asp keeps pace).
    assert faults["kept"] == pytest.approx(1 - 0.25 * 25 / 60, rel=0.05)


@pytest.mark.parametrize(("args", "said"), [
    (["--replace-after", "5s"], "--replace-after is part of a fault schedule"),
    (["--lose-every", "0s"], "--lose-every must be a positive duration"),
    (["--lose-every", "soon"], "--lose-every must be a duration"),
    (["--lose-every", "5s", "--on-worker-failure", "abort"], "drop --on-worker-failure abort"),
])
def test_simulate_refuses_a_schedule_that_cannot_be_in_one_line(args, said, tmp_path, capsys):
    code = main(["simulate", "--strategy", "asp", "--servers", "1", "--compute-time", "50ms",
                 "--out", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 2 and said in err and err.count("\n") == 1, err


def test_a_run_the_schedule_fails_trains_nothing_after():
    """asp, 3 workers, --min-workers 2: the second loss (at 4 s) would leave one, so the
    run ends there; over the 6 s span it trained 2 s at 3 workers' pace, 2 s at 2's."""
    got = under_faults(config("asp", 3, min_workers=2), COSTS, FaultSchedule(2.0, 6.0), 40)
    rates = {n: simulate(config("asp", n), COSTS, 40).samples_per_s for n in (3, 2)}
    assert got.timeline.fails_at_s == 4.0
    assert got.samples_per_s == pytest.approx((2 * rates[3] + 2 * rates[2]) / 6, rel=1e-12)


def test_advise_ranks_what_each_keeps_and_leaves_out_what_cannot_go_on(tmp_path, capsys):
    """3 hosts, a worker lost every 10 s over 15 s, at least 2 left: the 3-worker options
    keep going; the one with a server on a host of its own (2 workers) fails at its loss and
    is cautioned against; a compressed collective sum cannot go on, and is not ranked."""
    code = main(["advise", "--hosts", "3", "--compute-time", "50ms", "--lose-every", "10s",
                 "--over", "15s", "--min-workers", "2", "--compressors", "none", "fp16",
                 "--out", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    assert ("not ranked: allreduce + fp16: it cannot go on without a lost worker" in out), out
    rows = {row["option"]: row for row in json.loads(out.strip().splitlines()[-1])}
    own = rows["bsp, 1 server on a host of its own"]
    assert own["caution"] and own["flag"].startswith("fails at 10 s")
    assert not rows["allreduce"]["caution"] and 0 < rows["allreduce"]["kept"] < 1
    assert "allreduce + fp16" not in rows
    recommended = next(line for line in out.splitlines() if line.startswith("Recommended"))
    assert "host of its own" not in recommended
