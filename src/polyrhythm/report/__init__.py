"""Reports on stored runs: tables and figures comparing strategies, as HTML or Markdown.

    from polyrhythm.report import write_report
    write_report("runs/polyrhythm.db", run_ids, "report/", "ASP against BSP")

TensorBoard (`fmt="tensorboard"`): event files, one directory per run, under
`<out_dir>/tensorboard/` (report/tensorboard.py; needs the tensorboard package).

HTML: `report.html`, one self-contained file (figures embedded as data: URIs, inline CSS, no
script, nothing fetched), and each figure as `<name>.png` beside it. Markdown: `report.md`
with the tables and the figures by file name, and the PNGs. Runs that share a label (the
strategy and the config fields that differ between runs, the seed aside) are repeats:
figures show their mean and spread. Failed runs appear in the table of runs only. A figure
only some reports call for (bytes per step against accuracy: where a run compressed) is
left out of the others. A report written again into its folder removes the figures of the
earlier one that it does not draw, and no other file.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from polyrhythm.errors import ConfigError, StoreError
from polyrhythm.files import checked_name, read_regular
from polyrhythm.report.data import group_runs, load_runs
from polyrhythm.report.figures import FIGURES, render
from polyrhythm.report.html import render_html
from polyrhythm.report.markdown import render_markdown
from polyrhythm.report.tables import tables
from polyrhythm.report.tensorboard import write_tensorboard

FORMATS = {"html": ("report.html", render_html), "md": ("report.md", render_markdown),
           "tensorboard": ("tensorboard", None)}
FIGURE_NAMES = tuple(spec.name for spec in FIGURES)
MAX_REPORT_BYTES = 2**28  # an earlier report, read for the figures it drew: ours are MBs

__all__ = ["FIGURE_NAMES", "FORMATS", "write_report"]


def write_report(store_path: str | Path, run_ids: list[str], out_dir: str | Path, title: str,
                 fmt: str = "html", target_accuracy: float | None = None) -> Path:
    """Write the report on these runs of the store into out_dir; return the report's path
    (for TensorBoard, the directory of the runs' event files). With `target_accuracy` (a
    fraction), a table of each group's time to it.

    Raises ConfigError for an unknown format or no run ids, StoreError for a missing store,
    unknown run ids, no completed run among them, or an out_dir that cannot be written.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown report format {fmt!r}; valid: {', '.join(FORMATS)}")
    runs = load_runs(store_path, run_ids)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):  # fail before drawing, not after
            raise PermissionError(errno.EACCES, "permission denied")
    except (OSError, ValueError) as exc:  # ValueError: a null byte in the path
        raise _unwritable(out, exc) from None
    if fmt == "tensorboard":
        for run in runs:  # each run's events go into a folder named by its id
            checked_name(run.run_id, "run id", StoreError)
        return write_tensorboard(runs, out / "tensorboard")
    groups = group_runs(runs)
    figures = render(groups)
    statuses = Counter(r.row["status"] for r in runs)
    intro = (f"{len(runs)} run{'s' if len(runs) != 1 else ''} "
             f"({', '.join(f'{n} {s}' for s, n in statuses.items())}) in {len(groups)} "
             f"group{'s' if len(groups) != 1 else ''}, from {Path(store_path)}; "
             f"generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.")
    name, writer = FORMATS[fmt]
    text = writer(title, intro, tables(runs, groups, target_accuracy), figures)
    drawn = {f.spec.name: f.png for f in figures}
    earlier = _earlier_figures(out)
    try:
        for spec in FIGURES:
            path = out / f"{spec.name}.png"
            if drawn.get(spec.name) is not None:
                path.write_bytes(drawn[spec.name])
            elif path.name in earlier:
                path.unlink(missing_ok=True)  # an earlier report's figure would mislead
        (out / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise _unwritable(out, exc) from None
    return out / name


def _earlier_figures(out: Path) -> set[str]:
    """The figure files an earlier report in `out` drew (its report.html or report.md names
    them): the only files a report removes. A figure's name in a folder where no report
    drew it is someone else's file."""
    named: set[str] = set()
    for report, _ in FORMATS.values():
        try:
            text = read_regular(out / report, "report", StoreError, MAX_REPORT_BYTES)
        except StoreError:  # none there (or no report of ours): nothing drawn
            continue
        named |= {f"{n}.png" for n in FIGURE_NAMES if f"{n}.png".encode() in text}
    return named


def _unwritable(out: Path, exc: OSError | ValueError) -> StoreError:
    return StoreError(f"cannot write the report to {str(out)!r}: "
                      f"{getattr(exc, 'strerror', None) or exc}")
