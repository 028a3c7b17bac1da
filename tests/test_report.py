"""The report writer, on a store of fabricated runs (no training): files, figures, tables,
errors, and (where Debian's chromium is installed: make test installs it when it can) the
report opened in a headless browser."""

from __future__ import annotations

import base64
import re
import sys
from datetime import datetime

import numpy as np
import pytest

from browser import Chromium, chromium_path, why_no_chromium
from polyrhythm.cli import main
from polyrhythm.config import make_config
from polyrhythm.errors import PolyrhythmError, StoreError
from polyrhythm.metrics.recorder import SPAN_NAMES
from polyrhythm.metrics.store import RunStore
from polyrhythm.report import FIGURE_NAMES, write_report
from polyrhythm.report.data import group_runs, load_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TABLE_IDS = ("runs-table", "groups-table", "breakdown-table", "compression-table",
             "sharding-table")
# The figures of every report (the fabricated one below has data for them all, and is the
# only one with a compressed run, whose figure the others leave out).
ALWAYS = tuple(name for name in FIGURE_NAMES if name != "bytes_vs_accuracy")
STEPS_PER_EPOCH = 40
EPOCHS = 3
# Seconds per step in each phase by strategy: (compute, push, wait, pull, apply, compress,
# read).
PHASE_S = {"bsp": (0.040, 0.004, 0.012, 0.004, 0.0, 0.0, 0.001),
           "asp": (0.040, 0.004, 0.001, 0.004, 0.0, 0.0, 0.001),
           "allreduce": (0.040, 0.0, 0.006, 0.0, 0.002, 0.0, 0.001)}
COMPRESS_S = 0.003  # and the compress span of a run that compressed
RSS_MIB = {"bsp": 180, "asp": 200, "allreduce": 160}
DENSE_BYTES = 400_000  # a whole-model message, uncompressed
SHARE = {"topk": 0.02, "fp16": 0.5}  # of it, compressed (top-k: an index and a value each)


def fabricate_run(store: RunStore, tmp_path, strategy: str, seed: int, workers: int = 4,
                  index: int = 0, series: bool = True, **fields) -> str:
    """Store one completed run with plausible summary, epochs and event series; `compress`
    among the fields (a key of SHARE) makes it a compressed one."""
    config = make_config({"strategy": strategy, "workers": workers, "epochs": EPOCHS,
                          "seed": seed, "out": str(tmp_path / "runs"), **fields})
    run_id = f"20260101-0000{index:02d}-{strategy}-{seed:06x}"
    store.add_run(run_id, f"2026-01-01T00:00:{index:02d}+00:00", config.columns(), config.to_toml())
    rng = np.random.default_rng(seed + 100 * index)
    compressor = fields.get("compress", "none")
    share = SHARE.get(compressor, 1.0)
    phases = np.array([*PHASE_S[strategy][:-2], COMPRESS_S if share < 1 else 0.0,
                       PHASE_S[strategy][-1]])
    phases *= (1 + 0.1 * rng.standard_normal(len(phases))).clip(0.5)
    step_s = phases.sum() + 0.001
    iterations, t = [], np.zeros(workers)
    for step in range(STEPS_PER_EPOCH * EPOCHS):
        for w in range(workers):
            spans = phases * rng.uniform(0.7, 1.3, len(phases))
            total = spans.sum() + 0.001
            iterations.append((w, step, step // STEPS_PER_EPOCH, float(t[w]), *spans, total))
            t[w] += total
    wall = float(t.max()) + 0.5
    servers = config.servers
    pushes = [(0, float(it[3] + it[-1]), it[0], int(rng.poisson(0 if strategy == "bsp" else 2)),
               int(rng.integers(0, workers))) for it in iterations] if servers else []
    updates = [(0, p[1], float(rng.uniform(0.001, 0.003))) for p in pushes]
    if strategy == "bsp":
        updates = updates[::workers]
    resources = []
    for rank in range(servers + workers):
        role = "server" if rank < servers else "worker"
        sent, rss_mib = 0, RSS_MIB[strategy] + 10 * (rank < servers)
        for second in range(int(wall) + 1):
            sent += int(rng.uniform(2e6, 4e6))
            resources.append((rank, role, float(second), float(rng.uniform(60, 100)),
                              (rss_mib + second) * 2**20, sent, sent // 2))
    accuracy = [0.80 + 0.06 * e + 0.01 * rng.standard_normal() for e in range(EPOCHS)]
    epochs = [{"epoch": e, "train_loss": 1.0 / (e + 1), "val_loss": 1.2 / (e + 1),
               "val_accuracy": accuracy[e], "samples_per_s": 16 * workers / step_s,
               "wall_s": wall * (e + 1) / EPOCHS} for e in range(EPOCHS)]
    histogram = np.bincount([p[3] for p in pushes]) if pushes else []
    summary = {
        "run_id": run_id, "status": "completed", "strategy": strategy, "workers": workers,
        "servers": servers, "epochs": EPOCHS, "final_val_accuracy": accuracy[-1],
        "final_val_loss": 0.4,
        "samples_per_s": 16 * workers / step_s * (1 + 0.03 * rng.random()),
        "wall_s": wall, "weight_updates": len(updates) or STEPS_PER_EPOCH * EPOCHS,
        "weight_updates_per_server": [len(updates)] if servers else [],
        "staleness_histogram": {str(s): int(n) for s, n in enumerate(histogram) if n},
        "per_worker": [{"worker": w, "steps": STEPS_PER_EPOCH * EPOCHS, "train_s": float(t[w]),
                        "samples_per_s": 16 / step_s, "idleness": phases[2] / step_s,
                        **{f"{p}_s": sum(it[4 + i] for it in iterations if it[0] == w)
                           for i, p in enumerate(SPAN_NAMES)}}
                       for w in range(workers)],
        "traffic_per_rank": traffic(rng, servers, workers, share),
        "compression": None if share == 1 else {
            "compressor": compressor, "dense_share": share, "error_feedback": compressor == "topk",
            "compress_replies": False, "compress_s": sum(it[9] for it in iterations),
            "server_compress_s": 0.0},
        "data": {"sharding": "random", "train_examples": 400 * workers, "val_examples": 100,
                 "split_s": 0.01, "shards": [
                     {"worker": w, "examples": 400, "copies": 0,
                      "class_counts": rng.multinomial(400, [0.1] * 10).tolist(),
                      "imbalance": 1.3, "distance": 0.02} for w in range(workers)]},
    }
    store.complete_run(run_id, summary, epochs, {
        "iterations": iterations, "pushes": pushes, "updates": updates,
        "resources": resources} if series else None)
    return run_id


def traffic(rng, servers: int, workers: int, share: float) -> list[dict]:
    """Each rank's bytes: a push per step and a reply to each (servers), or an all-reduce's
    payload handed to Gloo (without), of SHARE of the dense bytes; a little more or less per
    rank, and a few object gathers' bytes besides."""
    steps = STEPS_PER_EPOCH * EPOCHS
    message = DENSE_BYTES * share * rng.uniform(0.95, 1.05, servers + workers)
    ranks = []
    for r in range(servers + workers):
        sent = message[r] * steps * (workers if r < servers else 1) if servers else 0
        ranks.append({"rank": r, "bytes_sent": int(sent) + 3000, "bytes_received": 1000,
                      "messages_sent": steps, "messages_received": steps,
                      "native_collective_bytes": 0 if servers else int(message[r] * steps)})
    return ranks


def fail_run(store: RunStore, tmp_path, index: int) -> str:
    config = make_config({"strategy": "asp", "workers": 4, "epochs": EPOCHS,
                          "out": str(tmp_path / "runs")})
    run_id = f"20260101-0000{index:02d}-asp-failed"
    store.add_run(run_id, f"2026-01-01T00:00:{index:02d}+00:00", config.columns(), config.to_toml())
    store.fail_run(run_id, "rank 2 (worker 1) was killed by SIGKILL | out of memory")
    return run_id


@pytest.fixture(scope="module")
def fabricated(tmp_path_factory):
    """bsp, asp (one server each) and allreduce (none), twice each, allreduce with top-k
    twice, and one failed run."""
    tmp_path = tmp_path_factory.mktemp("store")
    store = RunStore(tmp_path / "polyrhythm.db")
    ids = [fabricate_run(store, tmp_path, strategy, seed, index=i * 2 + seed)
           for i, strategy in enumerate(("bsp", "asp", "allreduce")) for seed in (0, 1)]
    ids += [fabricate_run(store, tmp_path, "allreduce", seed, index=6 + seed, compress="topk",
                          ratio=0.01) for seed in (0, 1)]
    ids.append(fail_run(store, tmp_path, index=len(ids)))
    return store.path, ids


@pytest.fixture(scope="module")
def html_report(fabricated, tmp_path_factory):
    store_path, ids = fabricated
    out = tmp_path_factory.mktemp("report")
    return write_report(store_path, ids, out, "Strategies <compared>")


@pytest.fixture(scope="module")
def markdown_report(fabricated, tmp_path_factory):
    """The fabricated runs' Markdown report, without a target accuracy: (the folder it was
    asked to go to, the path write_report returned)."""
    store_path, ids = fabricated
    folder = tmp_path_factory.mktemp("md")
    return folder, write_report(store_path, ids, folder, "Strategies", fmt="md")


@pytest.fixture(scope="module")
def plain_report(tmp_path_factory) -> str:
    """The Markdown report of one plain bsp run of 2 workers: no switch, no emulated
    cluster."""
    tmp_path = tmp_path_factory.mktemp("plain")
    store = RunStore(tmp_path / "runs" / "polyrhythm.db")
    plain = fabricate_run(store, tmp_path, "bsp", 0, workers=2, index=0)
    return write_report(store.path, [plain], tmp_path / "md", "Plain", fmt="md").read_text()


def _images(html: str) -> list[str]:
    return re.findall(r'<img[^>]*\ssrc="([^"]*)"', html)


def test_html_report_is_one_self_contained_file_with_every_figure_and_table(html_report,
                                                                            fabricated):
    assert html_report.name == "report.html" and html_report.is_file()
    html = html_report.read_text(encoding="utf-8")
    for name in (*FIGURE_NAMES, *TABLE_IDS):
        assert f'id="{name}"' in html, name
    assert "No data" not in html  # the fabricated runs have data for every figure
    assert 'src="http' not in html and 'href="http' not in html
    assert "<script" not in html and "<link rel=\"stylesheet\"" not in html
    assert re.findall(r'\ssrc="([^"]*)"', html) == _images(html)
    assert len(_images(html)) == len(FIGURE_NAMES)
    for uri in _images(html):
        assert uri.startswith("data:image/png;base64,")
        assert base64.b64decode(uri.split(",", 1)[1]).startswith(PNG_MAGIC)
    for href in re.findall(r'href="([^"]*)"', html):
        assert href.startswith(("#", "data:")), href
    assert "Strategies &lt;compared&gt;" in html
    _, ids = fabricated
    for run_id in ids:
        assert run_id in html
    assert "killed by SIGKILL" in html  # the failed run's error, in the table of runs


def test_every_figure_is_also_a_png_file(html_report):
    html = html_report.read_text(encoding="utf-8")
    listed = re.findall(r"Also saved as <code>([^<]+)</code>", html)
    assert sorted(listed) == sorted(f"{name}.png" for name in FIGURE_NAMES)
    for name in listed:
        data = (html_report.parent / name).read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC), name


def test_groups_are_strategies_and_repeats_share_them(fabricated):
    store_path, ids = fabricated
    runs = load_runs(store_path, ids)
    groups = group_runs(runs)
    assert [(g.label, len(g.runs)) for g in groups] == [
        ("bsp", 2), ("asp", 2), ("allreduce", 2), ("allreduce compress=topk ratio=0.01", 2)]
    assert runs[-1].label == "asp" and not runs[-1].completed  # labelled, in no group


def test_markdown_report_has_the_tables_and_references_the_pngs(fabricated, markdown_report):
    _, ids = fabricated
    folder, path = markdown_report
    assert path == folder / "report.md"
    text = path.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| 2026")]
    for run_id in ids:
        assert any(line.startswith(f"| {run_id} |") for line in rows), run_id
    failed = next(line for line in rows if "failed" in line)
    assert "SIGKILL \\| out of memory" in failed  # a pipe in a cell does not split it
    for heading in ("## Runs", "## Groups", "## Time breakdown"):
        assert heading in text
    assert "± " in text  # repeats: mean ± std
    for name in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (path.parent / name).read_bytes().startswith(PNG_MAGIC)
    assert len(re.findall(r"!\[", text)) == len(FIGURE_NAMES)


def test_a_target_accuracy_adds_each_groups_time_to_it(fabricated, markdown_report, tmp_path,
                                                       capsys):
    store_path, ids = fabricated
    store = RunStore(store_path)
    path = write_report(store_path, ids, tmp_path / "md", "Strategies", fmt="md",
                        target_accuracy=0.9)
    text = path.read_text(encoding="utf-8")
    assert "## Time to 90 % validation accuracy" in text
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")
            for line in text.split("## Time to 90 %", 1)[1].split("\n## ", 1)[0].splitlines()
            if line.startswith("| ") and not line.startswith("| group")}
    by_strategy = {}
    for run_id in ids:
        run = store.run(run_id)
        if run["status"] != "completed" or "topk" in run["config"]:
            continue
        # The end of the first epoch at or above 90 %, read from the store here.
        times = [e["wall_s"] for e in store.epochs(run_id) if e["val_accuracy"] >= 0.9]
        by_strategy.setdefault(run["strategy"], []).append(times[0] if times else None)
    for strategy, times in by_strategy.items():
        row = rows[strategy]
        reached = [t for t in times if t is not None]
        assert row[1] == f"{len(reached)} of {len(times)}"
        if reached:
            assert float(row[3].split(" – ")[0]) == pytest.approx(min(reached), abs=0.05)
            assert float(row[3].split(" – ")[1]) == pytest.approx(max(reached), abs=0.05)
    assert "## Time to" not in markdown_report[1].read_text(encoding="utf-8")
    for bad in ("0", "1.5"):
        assert main(["report", "--latest", "--target-accuracy", bad, "--out",
                     str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err == f"polyrhythm: error: --target-accuracy must be a fraction in (0, 1], got " \
                      f"{float(bad):g}\n"


def _one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert isinstance(excinfo.value, PolyrhythmError)
    assert message and "\n" not in message
    return message


def test_unknown_run_id_is_a_one_line_error(fabricated, tmp_path):
    store_path, ids = fabricated
    with pytest.raises(StoreError) as excinfo:
        write_report(store_path, [ids[0], "no-such-run"], tmp_path / "out", "x")
    assert "no-such-run" in _one_line_error(excinfo)
    assert not (tmp_path / "out").exists()


def test_no_completed_run_is_a_one_line_error(fabricated, tmp_path):
    store_path, ids = fabricated
    with pytest.raises(StoreError) as excinfo:
        write_report(store_path, [ids[-1]], tmp_path / "out", "x")
    assert "completed" in _one_line_error(excinfo)


def test_missing_store_unwritable_out_dir_and_unknown_format(fabricated, tmp_path):
    store_path, ids = fabricated
    with pytest.raises(PolyrhythmError) as excinfo:
        write_report(tmp_path / "nowhere.db", ids, tmp_path / "out", "x")
    assert "nowhere.db" in _one_line_error(excinfo)
    assert not (tmp_path / "nowhere.db").exists()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError) as excinfo:
        write_report(store_path, ids, blocker / "out", "x")
    assert "cannot write the report" in _one_line_error(excinfo)
    with pytest.raises(PolyrhythmError) as excinfo:
        write_report(store_path, ids, tmp_path / "out", "x", fmt="pdf")
    assert "pdf" in _one_line_error(excinfo)


def test_runs_without_series_or_servers_say_no_data(tmp_path):
    """Older runs (no event series) and collectives only: figures without data say so."""
    store = RunStore(tmp_path / "polyrhythm.db")
    ids = [fabricate_run(store, tmp_path, "allreduce", seed, index=seed, series=False)
           for seed in (0, 1)]
    path = write_report(store.path, ids, tmp_path / "report", "Old runs")
    html = path.read_text(encoding="utf-8")
    for name in ALWAYS:
        assert f'id="{name}"' in html
    for name in ("staleness_histogram", "staleness_over_time", "push_pull_latency",
                 "cpu_over_time", "memory_over_time", "network_over_time"):
        section = html.split(f'id="{name}"', 1)[1].split("</figure>", 1)[0]
        assert "No data" in section, name
        assert not (path.parent / f"{name}.png").exists()
    # From the summary alone: accuracy, scaling, time breakdown, idleness, weight updates.
    for name in ("accuracy_vs_time", "throughput_vs_workers", "time_breakdown", "idleness",
                 "weight_updates"):
        assert (path.parent / f"{name}.png").read_bytes().startswith(PNG_MAGIC), name


def test_a_run_with_only_headline_figures_still_gets_a_report(tmp_path):
    """A minimal summary, no epochs, no series: the scaling figures, 'no data' elsewhere."""
    store = RunStore(tmp_path / "polyrhythm.db")
    config = make_config({"strategy": "bsp", "workers": 2, "out": str(tmp_path)})
    store.add_run("old", "2025-01-01T00:00:00+00:00", config.columns(), config.to_toml())
    store.complete_run("old", {"final_val_accuracy": 0.9, "samples_per_s": 100.0,
                               "wall_s": 5.0}, [])
    path = write_report(store.path, ["old"], tmp_path / "report", "Old")
    html = path.read_text(encoding="utf-8")
    drawn = {p.stem for p in path.parent.glob("*.png")}
    assert drawn == {"throughput_vs_workers", "speedup_vs_workers", "efficiency_vs_workers"}
    assert html.count('class="nodata"') == len(ALWAYS) - len(drawn)


def test_worker_counts_that_differ_label_the_groups_and_scale(tmp_path):
    store = RunStore(tmp_path / "polyrhythm.db")
    ids = [fabricate_run(store, tmp_path, "asp", seed, workers=n, index=i)
           for i, (n, seed) in enumerate([(1, 0), (2, 0), (2, 1), (4, 0)])]
    groups = group_runs(load_runs(store.path, ids))
    assert [(g.label, g.family, len(g.runs)) for g in groups] == [
        ("asp N=1", "asp", 1), ("asp N=2", "asp", 2), ("asp N=4", "asp", 1)]
    path = write_report(store.path, ids, tmp_path / "report", "Scaling", fmt="md")
    assert (path.parent / "speedup_vs_workers.png").read_bytes().startswith(PNG_MAGIC)


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium for the module's browser tests; skipped, saying why, without it."""
    if chromium_path() is None:
        pytest.skip(why_no_chromium())
    with Chromium() as browser:
        yield browser


def _png_size(data: bytes) -> list[int]:
    """Width and height from a PNG's header (IHDR, right after the magic)."""
    return [int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")]


def test_chromium_renders_the_report_without_console_errors(chromium, html_report, fabricated):
    """The report opened in a real browser: every figure decoded at the PNG's own size and laid
    out at a non-zero size, every table the writer makes present with its rows, nothing
    logged at error level."""
    page = chromium.render(html_report.as_uri())
    assert page.errors == []
    assert sorted(f["figure"] for f in page.figures) == sorted(FIGURE_NAMES)
    for figure in page.figures:
        png = (html_report.parent / f"{figure['figure']}.png").read_bytes()
        assert figure["tag"] == "img" and figure["natural"] == _png_size(png), figure
        assert min(figure["box"]) > 0, figure
    assert [t["id"] for t in page.tables] == list(TABLE_IDS)
    for table in page.tables:
        assert table["rows"] > 0 and min(table["box"]) > 0, table
    _, ids = fabricated
    assert page.tables[0]["rows"] == len(ids)  # the table of runs, the failed one included


def test_the_browser_check_sees_broken_figures_and_console_errors(chromium, tmp_path):
    """The checks above can fail: an image that does not decode, one that is missing, a
    console error and an uncaught exception are all seen."""
    page_path = tmp_path / "broken.html"
    page_path.write_text(
        '<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
        '<figure id="bad"><img src="data:image/png;base64,AAAA"></figure>'
        '<figure id="gone"><img src="missing.png"></figure><table id="t"></table>'
        '<script>console.error("drawn wrong"); no_such_function();</script></body></html>')
    page = chromium.render(page_path.as_uri())
    assert [(f["figure"], f["natural"]) for f in page.figures] == [("bad", [0, 0]),
                                                                    ("gone", [0, 0])]
    assert page.tables == [{"id": "t", "rows": 0, "box": page.tables[0]["box"]}]
    text = "\n".join(page.errors)
    assert "console: drawn wrong" in text and "no_such_function" in text, text
    assert "missing.png" in text, text


def test_resource_figures_draw_the_samples_themselves(fabricated):
    """No interpolation: CPU points sit at the sample times with the mean over the role's
    processes and the repeats; network points at the middle of each sampling interval."""
    from polyrhythm.report.resources import cpu_over_time, network_over_time

    store_path, ids = fabricated
    groups = group_runs(load_runs(store_path, ids))
    bsp = next(g for g in groups if g.label == "bsp")
    per_run = []
    for run in bsp.runs:
        r = run.series["resources"]
        workers = r["role"] == "worker"
        seconds = np.unique(r["t"][workers])
        per_run.append({s: r["cpu_percent"][workers & (r["t"] == s)].mean() for s in seconds})
    samples = min(map(len, per_run))
    expected = [np.mean([run[s] for run in per_run]) for s in sorted(per_run[0])[:samples]]

    worker_axes = cpu_over_time(groups).axes[1]
    (line,) = [ln for ln in worker_axes.get_lines() if ln.get_label().startswith("bsp ")]
    assert line.get_xdata().tolist() == [float(s) for s in range(samples)]
    assert np.allclose(line.get_ydata(), expected)

    network_axes = network_over_time(groups).axes[1]
    (line,) = [ln for ln in network_axes.get_lines() if ln.get_label().startswith("bsp ")]
    assert line.get_xdata().tolist() == [s + 0.5 for s in range(samples - 1)]


def test_tensorboard_format_writes_each_runs_series(fabricated, tmp_path):
    # tensorboard is in the [dev] extras the test set-up installs: missing, this fails.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store_path, ids = fabricated
    out = write_report(store_path, ids, tmp_path, "ignored", fmt="tensorboard")
    completed = ids[:-1]  # the failed run has nothing to show
    assert out == tmp_path / "tensorboard"
    assert sorted(p.name for p in out.iterdir()) == sorted(completed)

    (run,) = load_runs(store_path, [ids[2]])  # asp: a server with stale pushes
    events = EventAccumulator(str(out / run.run_id), size_guidance={"scalars": 0})
    events.Reload()

    def values(tag):
        return [e.value for e in events.Scalars(tag)]

    assert values("epoch/val_accuracy") == pytest.approx([e["val_accuracy"] for e in run.epochs])
    first = run.column("iterations", "worker") == 0
    assert values("worker0/compute_ms") == pytest.approx(
        1000 * run.column("iterations", "compute_s")[first], rel=1e-6)
    assert [e.step for e in events.Scalars("worker0/total_ms")] == list(
        run.column("iterations", "step")[first])
    assert values("server0/staleness") == list(run.column("pushes", "staleness"))
    assert len(values("server0/update_ms")) == len(run.column("updates", "seconds"))
    # Resources under the same names as the spans: role and index (worker 1 is rank 2 here).
    ranks, cpu = run.column("resources", "rank"), run.column("resources", "cpu_percent")
    assert values("worker1/cpu_percent") == pytest.approx(cpu[ranks == 2])
    assert values("server0/rss_mib") == pytest.approx(
        run.column("resources", "rss_bytes")[ranks == 0] / 2**20)
    processes = {tag.split("/")[0] for tag in events.Tags()["scalars"]} - {"epoch", "final"}
    assert processes == {"server0", "worker0", "worker1", "worker2", "worker3"}
    # Wall times: the run's creation plus the time since the job started.
    created = datetime.fromisoformat(run.row["created"]).timestamp()
    assert [e.wall_time - created for e in events.Scalars("epoch/val_accuracy")] == \
        pytest.approx([e["wall_s"] for e in run.epochs], abs=1e-3)


def test_tensorboard_format_without_the_package_is_a_one_line_error(fabricated, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    store_path, ids = fabricated
    with pytest.raises(PolyrhythmError, match=r"needs the tensorboard package") as excinfo:
        write_report(store_path, ids, tmp_path, "t", fmt="tensorboard")
    assert "\n" not in str(excinfo.value)


def test_runs_on_an_emulated_cluster_get_a_fidelity_table_naming_starved_hosts(tmp_path,
                                                                               plain_report):
    store = RunStore(tmp_path / "runs" / "polyrhythm.db")
    plain = fabricate_run(store, tmp_path, "bsp", 0, workers=2, index=0)
    emulated = fabricate_run(store, tmp_path, "asp", 1, workers=2, index=1)
    summary = {**load_runs(store.path, [emulated])[0].summary, "cluster": {
        "layout": [[0], [1, 2]], "bandwidth": ["100mbit", None], "machine_busy": 0.97,
        "emulator_bound": True, "hosts": [
            {"host": 0, "cpu_share": 1.0, "used_cores": 0.98, "waiting_threads": 0.9,
             "starved_fraction": 0.0, "emulator_bound": False},
            {"host": 1, "cpu_share": 2.0, "used_cores": 1.1, "waiting_threads": 1.5,
             "starved_fraction": 0.4, "emulator_bound": True}]}}
    store.amend_summary(emulated, summary)
    text = write_report(store.path, [plain, emulated], tmp_path / "md", "Cluster",
                        fmt="md").read_text()
    rows = [line for line in text.split("## Emulated cluster and its fidelity")[1].splitlines()
            if line.startswith(f"| {emulated} |")]
    assert len(rows) == 2 and not any(plain in line for line in rows)
    assert "| 0 | 0 | 100mbit | 1.00 | 0.98 | 0.90 | 0.00 | 97.00 | ok |" in rows[0]
    assert "| 1 | 1, 2 | unlimited | 2.00 | 1.10 | 1.50 | 40.00 | 97.00 | EMULATOR-BOUND |" \
        in rows[1]
    assert "Emulated cluster" not in plain_report


def test_fields_that_follow_the_worker_count_stay_out_of_labels_and_curves(tmp_path):
    # A scaling sweep on a cluster: batch_size, hosts and (collocated) servers all follow
    # workers; placement does not. Labels name the placement only, so each way is one curve.
    store = RunStore(tmp_path / "runs" / "polyrhythm.db")
    ids = [fabricate_run(store, tmp_path, "bsp", 0, workers=n, index=i, series=False,
                         worker_batch_size=16, workers_per_host=1, placement=placement)
           for i, (n, placement) in enumerate(
               (n, p) for p in ("dedicated", "collocated") for n in (2, 4))]
    groups = group_runs(load_runs(store.path, ids))
    assert sorted(g.label for g in groups) == [
        "bsp N=2 placement=collocated", "bsp N=2 placement=dedicated",
        "bsp N=4 placement=collocated", "bsp N=4 placement=dedicated"]
    assert len({g.family for g in groups}) == 2
    # A field that tells runs of the same worker count apart is not a follower.
    straggler = fabricate_run(store, tmp_path, "bsp", 0, workers=4, index=9, series=False,
                              worker_batch_size=16, workers_per_host=1,
                              worker_delay_s=[0, 0, 0, 0.1])
    labels = {g.label for g in group_runs(load_runs(store.path, [*ids, straggler]))}
    assert "bsp N=4 placement=dedicated worker_delay_s=[0,0,0,0.1]" in labels


def test_groups_sort_their_numbers_as_numbers(tmp_path):
    store = RunStore(tmp_path / "runs" / "polyrhythm.db")
    ids = [fabricate_run(store, tmp_path, "bsp", 0, workers=2, index=i, series=False,
                         latency=latency)
           for i, latency in enumerate(("100ms", "10ms", "50ms"))]
    assert [g.label for g in group_runs(load_runs(store.path, ids))] == [
        "bsp latency=10ms", "bsp latency=50ms", "bsp latency=100ms"]


def test_switch_runs_get_a_table_of_when_and_how_long_they_switched(tmp_path, plain_report):
    store = RunStore(tmp_path / "runs" / "polyrhythm.db")
    plain = fabricate_run(store, tmp_path, "bsp", 0, workers=2, index=0)
    switched = [fabricate_run(store, tmp_path, "asp", seed, workers=2, index=1 + seed)
                for seed in (0, 1)]
    for run_id, epoch, seconds in zip(switched, (1, None), (0.02, None), strict=True):
        summary = {**load_runs(store.path, [run_id])[0].summary, "switch_rule": "empirical",
                   "switch_epoch": epoch, "switch_s": seconds, "switched_at_s": 1.5,
                   "phase_s": {"allreduce": 1.5 if epoch else 3.0,
                               "asp": 1.5 if epoch else 0.0}}
        store.amend_summary(run_id, summary)
    text = write_report(store.path, [plain, *switched], tmp_path / "md", "Switch",
                        fmt="md").read_text()
    switch_table = text.split("## Strategy-Switch")[1].split("\n## ")[0]
    (row,) = [line for line in switch_table.splitlines() if line.startswith("| asp")]
    assert row.endswith("| empirical | 1, – | 0.020 | allreduce 2.2 ± 1.1 | asp 0.8 ± 1.1 |")
    assert "## Strategy-Switch" not in plain_report


def test_throughput_over_time_counts_each_workers_own_batch():
    """A script's workers train their loaders' batches (its summary's), not its config's
    batch_size (a script run's config has the default, or none): 3 steps of worker 0 (32
    samples) and 2 of worker 1 (16), all in the first second."""
    from polyrhythm.report.data import Run
    from polyrhythm.report.training import _samples_per_s, worker_batches

    series = {"iterations": {"worker": np.array([0, 0, 0, 1, 1]),
                             "t": np.array([0.1, 0.3, 0.5, 0.2, 0.6]),
                             "total_s": np.full(5, 0.1)}}
    row = {"run_id": "r", "status": "completed", "workers": 2}
    script = Run(row, {}, {"worker_batch_size": [32, 16]}, series=series)
    train = Run(row, {"batch_size": 65}, {}, series=series)
    assert worker_batches(script).tolist() == [32, 16]
    lost = Run(row, {}, {"worker_batch_size": [32, None]}, series=series)  # worker 1 lost
    assert worker_batches(lost).tolist() == [32, 0]
    assert worker_batches(train).tolist() == [33, 32]  # as the workers split a global batch
    edges = np.array([0.0, 1.0])
    assert _samples_per_s(script, edges).tolist() == [3 * 32 + 2 * 16]
    assert _samples_per_s(train, edges).tolist() == [3 * 33 + 2 * 32]
