"""``python -m fl_lightning.report DIR... [--by KEY ...] [--select METRIC] [--target X] [--out OUT]`` (also
``fl-report``): run and sweep directories to ``report.md``, ``report.csv`` and PNG plots.

Reads each run's ``config.yaml``, ``metrics.csv`` and ``summary.json`` (:mod:`.runs`), groups and aggregates them
(:mod:`.table`), puts each row beside its own runs' ``paper:`` block (:mod:`.paper`), checks the paper's claims
(:mod:`.claims`), fills the about text's placeholders (:mod:`.about`), and writes the table (:mod:`.write`) and the
plots (:mod:`.plots`). The same directories in any order give the same page.
"""
from __future__ import annotations

import os

from .runs import ReportError, Run, find_runs
from .table import Row, paper_id, summarize


def report(paths: list[str], out: str, by: list[str] | None = None, select: str | None = None,
           target: float | None = None, plots: bool = True, name: str = "report", title: str | None = None,
           command: str | None = None, about: str | None = None, round_means: list[str] = (), stat: str = "mean",
           blowup: float | None = None, metrics: list[str] = (), dedupe: str | None = None) -> list[Row]:
    """Everything the command does: ``OUT/NAME.md``, ``OUT/NAME.csv`` and the PNGs (prefixed ``NAME_`` unless NAME
    is ``report``); the paper's numbers come from each run's own ``paper:`` block; ``round_means``: columns (e.g.
    ``precond_drift``) reported as their mean over each run's rounds; ``metrics``: columns (e.g. ``train_loss``)
    reported by their final value (a paper's ``key`` that is not the primary metric is added); ``stat``: ``mean``
    (± std) or ``median`` (and 90th percentile) of the final metric; ``blowup``: a run whose final metric is worse
    than this counts as diverged (as does a run whose loss became non-finite; one stopped without an error counts
    as stopped and stays out of the means); ``about``: its ``{{KEY}}`` placeholders are
    filled from the runs; ``dedupe="newest"``: of runs that repeat a setting and seed, only the newest. Returns the
    rows."""
    from .about import fill
    from .paper import read_paper
    from .write import markdown, write_csv

    runs = find_runs(paths)
    if dedupe == "newest":
        from .table import dedupe_newest

        runs = dedupe_newest(runs)
    elif dedupe is not None:
        raise ReportError(f"report: --dedupe {dedupe}: expected newest")
    blocks = {}
    for r in runs:
        blocks.setdefault(paper_id(r), r.config.get("paper"))
    papers = {k: read_paper(v) for k, v in blocks.items()}
    logged = set().union(*(r.columns for r in runs))
    primary = next((r for r in runs if r.summary), runs[0]).primary[0]
    keys = [p.key for p in papers.values() if p and p.key in logged and p.key != primary]  # a paper's other metric
    rows = summarize(runs, by or ["method"], select=select, target=target, round_means=list(round_means), stat=stat,
                     blowup=blowup, metrics=list(dict.fromkeys([*metrics, *keys])))
    about = fill(about, runs) if about else about
    order = list(dict.fromkeys(r.paper_id for r in rows if r.paper_id is not None))
    for r in rows:
        r.paper = papers[r.paper_id]
        r.source = order.index(r.paper_id) + 1 if r.paper_id is not None else None
    sources = [papers[k] for k in order]
    os.makedirs(out, exist_ok=True)
    names = []
    if plots:
        from .plots import plot

        names = plot(rows, out, "" if name == "report" else f"{name}_")
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(markdown(rows, target, names, sources, title, command, about))
    write_csv(rows, os.path.join(out, f"{name}.csv"))
    return rows


__all__ = ["ReportError", "Row", "Run", "find_runs", "report", "summarize"]
