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
