"""``report.md`` (rounded, mean ± std) and ``report.csv`` (unrounded, mean and std in their own columns; a median or
a percentile in one column)."""
from __future__ import annotations

import csv
import math
import os

from .paper import Paper, cell_value, ordering_lines
from .table import Row

_COLS = [("final", "final {m}"), ("best", "best {m}"), ("median", "median final {m}"), ("p90", "90th pct final {m}"),
         ("rounds_to_target", "rounds to {t}"),
         ("uplink_mb", "uplink MB"), ("downlink_mb", "downlink MB"), ("wall_s", "wall s")]


def _fmt(mean: float, std: float, digits: int) -> str:
    if math.isnan(mean):
        return "—"
    return f"{mean:.{digits}f}" if math.isnan(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"  # nan: one number


def _one(row: Row, k: str) -> tuple[float, float]:
    """A row's (mean, std) of ``k``, the std left out (nan) when the row has one run."""
    mean, std = row.stats[k]
    return (mean, math.nan) if row.n == 1 else (mean, std)


def _columns(rows: list[Row]) -> list[str]:
    return [k for k, _ in _COLS if k in rows[0].stats] + [k for k in rows[0].stats if k.startswith("mean ")]


def _label(k: str, m: str, t: float | None) -> str:
    return dict(_COLS).get(k, k + " over rounds").format(m=m, t=t)


def markdown(rows: list[Row], target: float | None, plots: list[str], paper: Paper | None = None,
             title: str | None = None, command: str | None = None, about: str | None = None) -> str:
    """The report page: title, the command that wrote it, what it is about, the paper's source, the table (with the
    paper's numbers in their own column where it has any), the notes, the paper's ordering against ours, the plots."""
    m = rows[0].metric
    by = list(rows[0].group)
    swept = sorted({k for r in rows for k in r.setting})
    select = rows[0].selected_on
    papers = [cell_value(r, paper) if paper else None for r in rows]
    diverged = any(r.diverged for r in rows)
    head = by + swept + ["n"] + ([f"{select} (selection)"] if select else []) + \
        [_label(k, m, target) for k in _columns(rows)] + \
        (["diverged"] if diverged else []) + \
        ([f"paper: {paper.metric or 'value'}"] if any(p is not None for p in papers) else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, p in zip(rows, papers):
        cells = [str(r.group[k]) for k in by] + [str(r.setting.get(k, "")) for k in swept] + [str(r.n)]
        if select:
            cells.append(_fmt(*_one(r, f"selected_{select}"), 4) + f" (best of {r.candidates})")
        for k in _columns(rows):
            cells.append(_fmt(*_one(r, k), 4 if k in ("final", "best", "median", "p90") or k.startswith("mean ") else 1))
        if diverged:
            cells.append(f"{r.diverged}/{r.n}")
        if any(x is not None for x in papers):
            cells.append("—" if p is None else f"{p:g}")
        lines.append("| " + " | ".join(cells) + " |")
    if "median" in rows[0].stats:
        notes = [f"Median and 90th percentile (linear between order statistics) of the final `{m}` over the n runs of "
                 "each row (seeds), a diverged run counting as the worst value; other columns mean ± sample standard "
                 "deviation."]
    else:
        notes = [f"Mean ± sample standard deviation over the n runs of each row (seeds); primary metric `{m}`."]
    if diverged:
        notes.append("`diverged`: runs that stopped before their last round (a non-finite loss)"
                     + (f" or ended worse than {rows[0].blowup:g}" if rows[0].blowup is not None else "")
                     + ("; the mean and std are over the runs that finished" if "final" in rows[0].stats else "") + ".")
    if select:
        notes.append(f"Each row keeps the setting with the best mean final `{select}` of the settings its group swept "
                     f"(the swept keys' columns show the one kept) and reports `{m}` for it.")
    top = [f"# {title or 'Report'}\n"]
    if command:
        top.append(f"Written by (from the repository root):\n\n    {command}\n")
    if about:
        top.append(about.strip() + "\n")
    if paper and paper.source:
        top.append(f"Paper: {paper.source}" + (f" ({paper.metric})" if paper.metric else "") + ".\n")
    body = "\n".join(top) + "\n" + "\n".join(lines) + "\n\n" + " ".join(notes) + "\n"
    order = ordering_lines(rows, paper) if paper else []
    if order:
        body += "\n" + "\n".join(f"- {line}" for line in order) + "\n"
    if plots:
        body += "\n" + "\n".join(f"![{p[:-4]}]({p})" for p in plots) + "\n"
    return body


def write_csv(rows: list[Row], path: str, paper: Paper | None = None) -> None:
    by = list(rows[0].group)
    swept = sorted({k for r in rows for k in r.setting})
    stats = list(rows[0].stats)
    one = {s for s in stats if s in ("median", "p90")}  # a single number (its "std" is nan)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(by + swept + ["n", "metric"] + [s if s in one else f"{s}_{x}" for s in stats for x in ("mean", "std")
                                                   if s not in one or x == "mean"] + ["diverged", "paper", "runs"])
        for r in rows:
            p = cell_value(r, paper) if paper else None
            w.writerow([r.group[k] for k in by] + [r.setting.get(k, "") for k in swept] + [r.n, r.metric]
                       + [v for s in stats for v in (r.stats[s][:1] if s in one else r.stats[s])]
                       + [r.diverged, "" if p is None else p]
                       + [";".join(os.path.relpath(x.path) for x in r.runs)])
