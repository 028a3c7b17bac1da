"""The simulator's figure: predicted throughput and scaling efficiency against workers, a
line per strategy, with the measured points of calibrating runs and their errors."""

from __future__ import annotations

from collections import defaultdict

import matplotlib
import matplotlib.ticker

from polyrhythm.report.plot import STYLE, legend, new_figure, note, png, title
from polyrhythm.sim.study import Prediction


def scaling_png(predictions: list[Prediction], heading: str) -> bytes:
    """PNG bytes of the throughput and efficiency panels."""
    with matplotlib.rc_context(STYLE):
        fig, (throughput, efficiency) = new_figure(ncols=2)
        lines: dict[str, list[Prediction]] = defaultdict(list)
        for p in predictions:
            lines[_label(p)].append(p)
        for label, points in lines.items():
            points.sort(key=lambda p: p.config.workers)
            workers = [p.config.workers for p in points]
            line, = throughput.plot(workers, [p.samples_per_s for p in points],
                                    marker=".", label=f"{label} (simulated)")
            efficiency.plot(workers, [100 * p.efficiency for p in points], marker=".",
                            color=line.get_color(), label=label)
            measured = [p for p in points if p.measured]
            if measured:
                throughput.plot([p.config.workers for p in measured],
                                [p.measured for p in measured], linestyle="none", marker="x",
                                markersize=7, color=line.get_color(),
                                label=f"{label} (measured)")
                for p in measured:
                    throughput.annotate(f"{100 * p.error:+.0f}%", (p.config.workers, p.measured),
                                        textcoords="offset points", xytext=(4, 4), fontsize=7,
                                        color=line.get_color())
        for ax in (throughput, efficiency):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_xlabel("workers")
        throughput.set_ylabel("samples/s (cluster)")
        efficiency.set_ylabel("scaling efficiency (%): X(N) / (N X(1))")
        note(throughput, "lines: simulated; crosses: measured runs, with the prediction's "
             "error")
        legend(throughput)
        legend(efficiency)
        title(fig, heading)
        return png(fig)


def _label(p: Prediction) -> str:
    servers = f", {p.config.servers} server{'s' * (p.config.servers != 1)}" if (
        p.config.servers) else ""
    return f"{p.config.strategy.name}{servers}"
