"""What every run measures: iteration spans, server events, resources, warm-up, the store."""

import sqlite3

import pytest

import polyrhythm
from helpers import small_config
from polyrhythm.layout import shard_ranges
from polyrhythm.metrics.records import STORE_NAME
from polyrhythm.metrics.store import RULE_FIELDS, SCHEMA_VERSION, SERIES, RunStore

PARTS = ("compute_s", "push_s", "wait_s", "pull_s", "apply_s")


def store_of(summary: dict) -> RunStore:
    return RunStore(f"{summary['run_dir']}/../{STORE_NAME}")


@pytest.mark.parametrize("strategy", ["bsp", "allreduce"])
def test_iteration_spans_add_up_and_everything_lands_in_the_store(tmp_path, strategy):
    summary = polyrhythm.train(small_config(tmp_path, strategy=strategy, workers=2, epochs=2,
                                            steps_per_epoch=15))
    store = store_of(summary)
    iterations = store.series("iterations", summary["run_id"])
    assert len(iterations) == 2 * 30
    for worker in (0, 1):
        rows = [r for r in iterations if r["worker"] == worker]
        assert [r["step"] for r in sorted(rows, key=lambda r: r["step"])] == list(range(30))
        parts = sum(r[p] for r in rows for p in PARTS)
        total = sum(r["total_s"] for r in rows)
        assert parts == pytest.approx(total, rel=0.05)  # the spans cover the iteration
        assert all(b["t"] > a["t"] for a, b in zip(rows, rows[1:], strict=False))
        assert rows[-1]["t"] <= summary["wall_s"]
    for w in summary["per_worker"]:
        assert 0 < w["idleness"] < 1
        assert w["idleness"] == pytest.approx(w["wait_s"] / w["train_s"])
    resources = store.series("resources", summary["run_id"])
    roles = {r["rank"]: r["role"] for r in resources}
    assert roles == {r: ("server" if r < summary["servers"] else "worker")
                     for r in range(summary["servers"] + 2)}
    assert all(r["rss_bytes"] > 10 * 2**20 and r["cpu_percent"] >= 0 for r in resources)
    traffic = summary["traffic_per_rank"]
    if strategy == "bsp":
        servers, workers = traffic[:1], traffic[1:]
        # Every byte a worker sent, a server received (and the other way round).
        assert sum(w["bytes_sent"] for w in workers) == sum(s["bytes_received"] for s in servers)
        assert sum(w["bytes_received"] for w in workers) == sum(s["bytes_sent"] for s in servers)
        pushes = store.series("pushes", summary["run_id"])
        assert len(pushes) == 2 * 30 and {p["staleness"] for p in pushes} == {0}
        assert all(p["queue"] >= 0 for p in pushes)
        updates = store.series("updates", summary["run_id"])
        assert len(updates) == summary["weight_updates"] == 30
        assert all(u["seconds"] > 0 for u in updates)
        assert resources[-1]["bytes_sent"] > 0
    else:
        assert store.series("pushes", summary["run_id"]) == []


def test_asp_server_events_show_staleness_and_n_times_the_updates(tmp_path):
    summary = polyrhythm.train(small_config(tmp_path, strategy="asp", workers=3, epochs=1,
                                            steps_per_epoch=12))
    store = store_of(summary)
    assert len(store.series("updates", summary["run_id"])) == 3 * 12
    pushes = store.series("pushes", summary["run_id"])
    assert sorted({p["worker"] for p in pushes}) == [0, 1, 2]
    histogram = {}
    for p in pushes:
        histogram[str(p["staleness"])] = histogram.get(str(p["staleness"]), 0) + 1
    assert histogram == summary["staleness_histogram"]


def test_warm_up_steps_are_left_out_of_throughput(tmp_path):
    # The first iterations pay for lazy set-up: throughput counts the steps after them only.
    config = small_config(tmp_path, strategy="allreduce", workers=1, epochs=1,
                          steps_per_epoch=25)
    summary = polyrhythm.train(config)
    rows = store_of(summary).series("iterations", summary["run_id"])
    after = [r for r in rows if r["step"] >= 5]
    expected = len(after) * 64 / sum(r["total_s"] for r in after)
    assert summary["warmup_steps"] == 5
    assert summary["samples_per_s"] == pytest.approx(expected, rel=0.1)


def test_instrumentation_off_keeps_totals_only(tmp_path):
    summary = polyrhythm.train(small_config(tmp_path, strategy="bsp", workers=2, epochs=1,
                                            instrumentation=False))
    store = store_of(summary)
    for table in SERIES:
        assert store.series(table, summary["run_id"]) == []
    assert summary["per_worker"][0]["compute_s"] > 0 and summary["samples_per_s"] > 0


def test_a_version_1_store_is_migrated_in_place(tmp_path):
    path = tmp_path / STORE_NAME
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE runs (run_id TEXT PRIMARY KEY, created TEXT NOT NULL, status TEXT NOT NULL,
            strategy TEXT NOT NULL, workers INTEGER NOT NULL, servers INTEGER NOT NULL,
            epochs INTEGER NOT NULL, dataset TEXT NOT NULL, model TEXT NOT NULL,
            config TEXT NOT NULL, summary TEXT, error TEXT, final_val_accuracy REAL,
            samples_per_s REAL, wall_s REAL);
        CREATE TABLE epochs (run_id TEXT NOT NULL, epoch INTEGER NOT NULL, train_loss REAL,
            val_loss REAL, val_accuracy REAL, samples_per_s REAL, wall_s REAL,
            PRIMARY KEY (run_id, epoch));
        INSERT INTO runs VALUES ('old-run', '2026-01-01T00:00:00+00:00', 'completed', 'bsp', 2,
            1, 3, 'mnist5k', 'cnn', 'strategy = "bsp"', '{}', NULL, 0.95, 8000.0, 3.0);
        INSERT INTO epochs VALUES ('old-run', 0, 0.5, 0.4, 0.9, 8000.0, 1.0);
        PRAGMA user_version = 1;
    """)
    conn.close()
    store = RunStore(path)
    assert [r["run_id"] for r in store.runs()] == ["old-run"]
    assert store.series("iterations", "old-run") == []
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        iteration_columns = [r[1] for r in conn.execute("PRAGMA table_info(iterations)")]
    assert set(SERIES) <= tables  # membership: version 7
    assert iteration_columns[-2:] == ["compress_s", "read_s"]  # versions 5 and 6
    assert store.series("membership", "old-run") == []
    # Version 3's Strategy-Switch columns, empty for an old run's epochs.
    (epoch,) = store.epochs("old-run")
    assert epoch["val_loss"] == 0.4
    assert [epoch[c] for c in RULE_FIELDS] == [None] * 4


def test_even_a_short_run_has_resource_samples_enough_for_rates(tmp_path):
    # About 0.6 s of training (10 ms of emulated compute a step): under one 1 Hz period.
    summary = polyrhythm.train(small_config(tmp_path, strategy="bsp", workers=1, epochs=1,
                                            steps_per_epoch=60, worker_delay_s=[0.01]))
    resources = store_of(summary).series("resources", summary["run_id"])
    for rank in (0, 1):
        samples = [r for r in resources if r["rank"] == rank]
        assert len(samples) >= 2  # one soon after the start, one at the end
        assert samples[0]["t"] < samples[-1]["t"]


def ring_bytes(numel: int, n: int, member: int) -> int:
    """What ring member i sends per all-reduce: reduce-scatter sends every chunk but chunk
    i+1, all-gather every chunk but chunk i+2 (chunks as the schedule cuts them); under
    2(N-1)/N of the model each way, whatever N."""
    chunks = [b - a for a, b in shard_ranges(numel, n)]
    return 4 * (2 * numel - chunks[(member + 1) % n] - chunks[(member + 2) % n])


@pytest.mark.parametrize("strategy", ["allreduce", "ring", "localsgd"])
def test_every_collective_byte_is_counted(tmp_path, strategy):
    # 2 epochs of 10 steps, 3 workers. Gloo's own collectives are counted as their payload
    # (native_collective_bytes), polyrhythm's ring as the messages it sends.
    summary = polyrhythm.train(small_config(tmp_path, strategy=strategy, workers=3,
                                            batch_size=60, **({"tau": 3} if strategy ==
                                                              "localsgd" else {})))
    numel, steps = summary["parameters"], 20
    model = 4 * numel
    for member, rank in enumerate(summary["traffic_per_rank"]):
        if strategy == "allreduce":  # one all-reduce of the gradient per step
            assert rank["native_collective_bytes"] == steps * model
            assert rank["bytes_sent"] == 0
        elif strategy == "ring":
            assert rank["bytes_sent"] == steps * ring_bytes(numel, 3, member)
            # what its left neighbour sends
            assert rank["bytes_received"] == steps * ring_bytes(numel, 3, (member - 1) % 3)
            assert rank["messages_sent"] == steps * 2 * (3 - 1)
            assert rank["native_collective_bytes"] == 0
        else:  # an average every 3 steps, one after the last 2 steps, and each epoch's
            # validated model is the workers' consensus: 2 models and their float64 weights
            assert rank["native_collective_bytes"] == (7 * model) + 2 * (model + 8)
            assert rank["bytes_sent"] == 0
