"""``report.md`` (rounded, mean ± std) and ``report.csv`` (unrounded, mean and std in their own columns; a median or
a percentile in one column)."""
from __future__ import annotations

import csv
import math
import os

from .claims import claim_lines
from .paper import Paper, cell_of, differs, fraction, notes, ours
from .table import CONTEXT, Row

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
    return [k for k, _ in _COLS if k in rows[0].stats] + [k for k in rows[0].stats if k.startswith("final ")] + \
        [k for k in rows[0].stats if k.startswith("mean ")]


def _label(k: str, m: str, t: float | None) -> str:
    return dict(_COLS).get(k, k if k.startswith("final ") else k + " over rounds").format(m=m, t=t)


def _context(rows: list[Row]) -> list[str]:
    """The data / model names that differ between rows and that ``--by`` does not show already."""
    by = set(rows[0].group)
    return [k for k in CONTEXT if k not in by and f"{k}.name" not in by
            and len({repr(r.context.get(k)) for r in rows}) > 1]


def _compared(rows: list[Row]) -> tuple[str, str]:
    """The headers of the two paper columns: ours in the paper's key and unit, and the paper's number."""
    kinds = {(r.paper.key, r.paper.unit) for r in rows if cell_of(r) is not None}
    if len(kinds) != 1:
        return "ours, as its paper (key, unit: see the sources)", "paper"
    key, unit = kinds.pop()
    unit = f" ({unit})" if unit else ""
    return (f"ours: {'final ' if key != 'rounds_to_target' else ''}{key}{unit}" if key else "ours"), f"paper{unit}"


def markdown(rows: list[Row], target: float | None, plots: list[str], papers: list[Paper] = (),
             title: str | None = None, command: str | None = None, about: str | None = None) -> str:
    """The report page: title (and how many rows were run in another setting than their paper's), the command that
    wrote it, what it is about, the paper's source(s), the table (with each row's own paper's number and ours in its
    unit where it has one, and what differs from the paper's setting), the notes, the claims' verdicts, the plots."""
    m = rows[0].metric
    by = list(rows[0].group)
    context = _context(rows)
    swept = sorted({k for r in rows for k in r.setting})
    select = rows[0].selected_on
    cells = [cell_of(r) for r in rows]
    compared = any(c is not None for c in cells)
    many = len(papers) > 1
    diverged = any(r.diverged for r in rows)
    stopped = any(r.stopped for r in rows)
    off = [differs(r) for r in rows]
    head = by + context + swept + ["n"] + ([f"{select} (selection)"] if select else []) + \
        [_label(k, m, target) for k in _columns(rows)] + \
        (["diverged"] if diverged else []) + (["stopped"] if stopped else []) + \
        (list(_compared(rows)) if compared else []) + \
        (["paper's setting"] if any(off) else []) + (["source"] if many else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, c, d in zip(rows, cells, off):
        out = [str(r.group[k]) for k in by] + [str(r.context.get(k)) for k in context] + \
            [str(r.setting.get(k, "")) for k in swept] + [f"{r.n} (seeds repeat)" if r.repeated_seeds else str(r.n)]
        if select:
            out.append(_fmt(*_one(r, f"selected_{select}"), 4) + f" (best of {r.candidates})")
        for k in _columns(rows):
            out.append(_fmt(*_one(r, k), 1 if k in ("rounds_to_target", "uplink_mb", "downlink_mb", "wall_s") else 4))
        if diverged:
            out.append(f"{r.diverged}/{r.n}")
        if stopped:
            out.append(f"{r.stopped}/{r.n}")
        if compared:
            mine = ours(r) if c is not None else None
            digits = 2 if r.paper is not None and r.paper.unit == "%" and fraction(r.paper.key or "") else 4
            out += ["—" if mine is None else _fmt(*mine, digits), "—" if c is None else f"{c['value']:g}"]
        if any(off):
            out.append(f"differs: {d}" if d else "—" if r.paper is None or not r.paper.setting else "same")
        if many:
            out.append(f"[{r.source}]" if r.source else "—")
        lines.append("| " + " | ".join(out) + " |")
    if "median" in rows[0].stats:
        text = [f"Median and 90th percentile (linear between order statistics) of the final `{m}` over the n runs of "
                "each row (seeds), a diverged run counting as the worst value; other columns mean ± sample standard "
                "deviation" + (" (over the runs that finished)" if diverged or stopped else "") + "."]
    else:
        text = [f"Mean ± sample standard deviation over the n runs of each row (seeds); primary metric `{m}`."]
    if any(r.repeated_seeds for r in rows):
        text.append("`(seeds repeat)`: two or more of the row's runs share a seed, so they are no independent draws: "
                    "the mean is shown without a standard deviation (`--dedupe newest` keeps the newest run of each "
                    "setting and seed).")
    if diverged:
        text.append("`diverged`: runs that stopped on a non-finite loss (their summary.json names the error)"
                    + (f" or ended worse than {rows[0].blowup:g}" if rows[0].blowup is not None else "")
                    + ("; the mean and std are over the runs that finished" if "final" in rows[0].stats else "") + ".")
    if stopped:
        text.append("`stopped`: runs that ended before their last round without an error (stopped by a signal and "
                    "not resumed, or by `stop_after_rounds`): not counted as diverged, and left out of the "
                    + ("median" if "median" in rows[0].stats else "mean and std") + ".")
    if select:
        text.append(f"Each row keeps the setting with the best mean final `{select}` of the settings its group swept "
                    f"(the swept keys' columns show the one kept) and reports `{m}` for it.")
    if compared:
        text.append("`ours` is the row's final value of the metric its paper's number measures (its `key`), in the "
                    "paper's unit (a fraction x 100 beside a paper in %).")
    if any(off):
        text.append("`paper's setting`: `differs` names each key whose value the row's runs have other than the "
                    "setting the paper's numbers hold for (the block's `setting`), ours, then the paper's.")
    top = [f"# {title or 'Report'}\n"]
    if any(off):
        top.append(f"**{sum(map(bool, off))} of {len(rows)} rows were run in another setting than the paper's** "
                   "(`paper's setting`: differs): their numbers are not compared with the paper's, and the claims "
                   "skip them.\n")
    if command:
        top.append(f"Written by (from the repository root):\n\n    {command}\n")
    if about:
        top.append(about.strip() + "\n")
    if len(papers) == 1 and papers[0].source:
        top.append(f"Paper: {papers[0].source}" + (f" ({papers[0].metric})" if papers[0].metric else "") + ".\n")
    body = "\n".join(top) + "\n" + "\n".join(lines) + "\n\n" + " ".join(text) + "\n"
    if many:
        body += "\nThe papers (the `source` column):\n\n" + "\n".join(
            f"{i + 1}. {p.source or 'no source given'}" + (f" ({p.metric})" if p.metric else "")
            + (f"; compared with `{p.key}`" + (f" in {p.unit}" if p.unit else "") if p.key else "") + "."
            for i, p in enumerate(papers)) + "\n"
    below = notes(rows, list(papers))
    if below:
        body += "\n" + "\n".join(f"- {line}" for line in below) + "\n"
    claims = claim_lines(rows, list(papers))
    if claims:
        body += "\n## Claims\n\n" + "\n".join(f"- {line}" for line in claims) + "\n"
    if plots:
        body += "\n" + "\n".join(f"![{p[:-4]}]({p})" for p in plots) + "\n"
    return body


def write_csv(rows: list[Row], path: str) -> None:
    """The table unrounded; ``paper`` and ``paper_source`` give each row's own paper's number and source number,
    ``setting_differs`` what sets the row apart from the paper's setting (empty: nothing)."""
    by = list(rows[0].group)
    swept = sorted({k for r in rows for k in r.setting})
    stats = list(rows[0].stats)
    one = {s for s in stats if s in ("median", "p90")}  # a single number (its "std" is nan)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(by + list(CONTEXT) + swept + ["n", "metric"]
                   + [s if s in one else f"{s}_{x}" for s in stats for x in ("mean", "std")
                      if s not in one or x == "mean"]
                   + ["diverged", "stopped", "ours", "paper", "paper_key", "paper_unit", "paper_source",
                      "setting_differs", "runs"])
        for r in rows:
            c, mine = cell_of(r), ours(r)
            w.writerow([r.group[k] for k in by] + [r.context.get(k) for k in CONTEXT]
                       + [r.setting.get(k, "") for k in swept] + [r.n, r.metric]
                       + [v for s in stats for v in (r.stats[s][:1] if s in one else r.stats[s])]
                       + [r.diverged, r.stopped, "" if c is None or mine is None else mine[0],
                          "" if c is None else c["value"],
                          r.paper.key if r.paper else "", r.paper.unit if r.paper and r.paper.unit else "",
                          r.source or "", differs(r)]
                       + [";".join(os.path.relpath(x.path) for x in r.runs)])


def print_table(page: str, console=None) -> None:
    """The page's first table (its markdown rows) drawn with rich on stdout; off a terminal at its full width."""
    import re

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from ..progress import print_whole

    with open(page) as f:
        lines = [x.rstrip("\n") for x in f]
    start = next((i for i, x in enumerate(lines) if x.startswith("|")), None)
    if start is None:
        return
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))

    def cells(line: str) -> list[str]:  # split on unescaped pipes; \| in a cell is a literal pipe
        return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]

    rows = [cells(x) for x in lines[start:end]]
    body = [r for r in rows[1:] if not all(re.fullmatch(r":?-+:?", c) for c in r if c)]
    table = Table()
    for h in rows[0]:
        table.add_column(Text(h))
    for r in body:  # cells as plain text: a [bracket] in a cell is no rich markup
        table.add_row(*(Text(c) for c in (r + [""] * len(rows[0]))[:len(rows[0])]))
    print_whole(console or Console(), table)

