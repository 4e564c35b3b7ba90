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
           target: float | None = None, plots: bool = True, name: str = "report", title: str | None = None,
           command: str | None = None, about: str | None = None, round_means: list[str] = (), stat: str = "mean",
           blowup: float | None = None) -> list[Row]:
    """Everything the command does: ``OUT/NAME.md``, ``OUT/NAME.csv`` and the PNGs (prefixed ``NAME_`` unless NAME
    is ``report``); the paper's numbers come from the runs' ``paper:`` block; ``round_means``: columns (e.g.
    ``precond_drift``) reported as their mean over each run's rounds; ``stat``: ``mean`` (± std) or ``median`` (and
    90th percentile) of the final metric; ``blowup``: a run whose final metric is worse than this counts as diverged
    (as does a run that stopped early). Returns the rows."""
    from .paper import read_paper
    from .write import markdown, write_csv

    runs = find_runs(paths)
    rows = summarize(runs, by or ["method"], select=select, target=target, round_means=list(round_means), stat=stat,
                     blowup=blowup)
    paper = read_paper(runs[0].config.get("paper"))
    os.makedirs(out, exist_ok=True)
    names = []
    if plots:
        from .plots import plot

        names = plot(rows, out, "" if name == "report" else f"{name}_")
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(markdown(rows, target, names, paper, title, command, about))
    write_csv(rows, os.path.join(out, f"{name}.csv"), paper)
    return rows


__all__ = ["ReportError", "Row", "Run", "find_runs", "report", "summarize"]
