"""``python -m fl_lightning.report DIR... [--by KEY ...] [--select METRIC] [--target X] [--out OUT]`` (also
``fl-report``): run and sweep directories to ``report.md``, ``report.csv`` and PNG plots.

Reads each run's ``config.yaml``, ``metrics.csv`` and ``summary.json`` (:mod:`.runs`), groups and aggregates them
(:mod:`.table`), and writes the table (:mod:`.write`) and the plots (:mod:`.plots`).
"""
from __future__ import annotations

import os

from .runs import ReportError, Run, find_runs
from .table import Row, summarize


def report(paths: list[str], out: str, by: list[str] | None = None, select: str | None = None,
           target: float | None = None, plots: bool = True) -> list[Row]:
    """Everything the command does; returns the rows."""
    from .write import markdown, write_csv

    runs = find_runs(paths)
    rows = summarize(runs, by or ["method"], select=select, target=target)
    os.makedirs(out, exist_ok=True)
    names = []
    if plots:
        from .plots import plot

        names = plot(rows, out)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(rows, target, names))
    write_csv(rows, os.path.join(out, "report.csv"))
    return rows


__all__ = ["ReportError", "Row", "Run", "find_runs", "report", "summarize"]
