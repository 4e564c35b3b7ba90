"""The paper's claims against our rows: each claim of a ``paper:`` block (``claims``, and ``ordering`` as a claim in
every setting) gets a verdict computed from the report's rows.

A claim ranks values of the first ``--by`` key: ``better`` above ``worse``, or ``order`` (best first; a list in it is
a tier whose order is not stated); or ``converges``: no run of that value diverged (the table's ``diverged`` column:
stopped on a non-finite loss, or ended worse than ``--blowup``; a run stopped without an error is none), agrees when
none did, differs when one did. It is checked in each *setting* (each combination of the other ``--by`` keys and
the data and model names) of the rows of its own paper block, or only in those ``where`` picks. Each value's range is
its row's mean ± sample std of the final metric over the runs that finished (the paper's ``key`` where the runs
logged it, else the primary metric). The verdict:

- ``differs``: a value of a later tier lies entirely above one of an earlier tier (ranges disjoint, the wrong way);
- ``agrees``: every value lies entirely above every value of the next tier;
- ``inconclusive``: neither (two ranges overlap), or a value has no row, several rows, or fewer than two runs.

Rows run in another setting than the paper's ``setting`` (:func:`.paper.differs`) are a setting of their own, whose
claims are ``not compared`` (the line says what differs).
"""
from __future__ import annotations

import math
import statistics
from typing import Any

from .paper import Paper, differs, matches, same
from .table import Row, minimised


def _measure(row: Row, key: str) -> tuple[float, float, int]:
    """(mean, sample std, n) of ``key``'s final value over the row's runs that finished."""
    vals = []
    for run in row.runs:
        series = run.series(key)
        if series and run.finished:
            vals.append(series[-1][1])
    if not vals:
        return math.nan, math.nan, 0
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0), len(vals)


def _tiers(order: list[Any]) -> list[list[Any]]:
    return [list(t) if isinstance(t, list) else [t] for t in order]


def _setting(row: Row) -> tuple:
    first = list(row.group)[0]
    return tuple((k, repr(v)) for k, v in row.group.items() if k != first) + tuple(sorted(row.context.items())) + \
        (differs(row),)


def verdict(rows: list[Row], tiers: list[list[Any]], key: str) -> tuple[str, str, list[str]]:
    """(verdict, reason, each value's ``value mean ± std``) for ``tiers`` (best first) among ``rows`` (one setting)."""
    first = list(rows[0].group)[0]
    low = minimised(key, rows[0].runs[0])
    found: dict[str, tuple[float, float, int]] = {}
    problems, missing = [], []
    for t in tiers:
        for v in t:
            hit = [r for r in rows if same(r.group[first], v)]
            if len(hit) > 1:
                problems.append(f"{len(hit)} rows for {v} (give --select or --by the key they differ in)")
            elif not hit:
                missing.append(str(v))
            else:
                found[str(v)] = _measure(hit[0], key)
    if missing:
        problems.insert(0, f"no run for {', '.join(missing)}")
    shown = [f"{v} = —" if not n else f"{v} = {m:.4f} (one run)" if n == 1 else f"{v} = {m:.4f} ± {s:.4f}"
             for v, (m, s, n) in found.items()]
    few = [v for v, (_, _, n) in found.items() if n < 2]
    if few:
        problems.append(f"fewer than two finished runs for {', '.join(few)}")
    present = [[str(v) for v in t if str(v) in found] for t in tiers]
    present = [t for t in present if t]

    def rng(v):  # the range in "goodness": higher is better
        m, s, _ = found[v]
        return (-m - s, -m + s) if low else (m - s, m + s)

    if all(n >= 2 for _, _, n in found.values()):  # a clear reversal among the values that have runs
        for i, upper in enumerate(present):
            for lower in present[i + 1:]:
                for a in upper:
                    for b in lower:
                        if rng(b)[0] > rng(a)[1]:
                            return "differs", f"{b} above {a}", shown
    overlap = next((f"{a} and {b} overlap" for upper, lower in zip(present, present[1:]) for a in upper for b in lower
                    if found[a][2] and found[b][2] and rng(a)[0] <= rng(b)[1]), None)
    if problems or overlap:
        return "inconclusive", "; ".join(problems + ([overlap] if overlap else [])), shown
    return "agrees", "", shown


def converges(rows: list[Row], value: Any) -> tuple[str, str, list[str]]:
    """(verdict, reason, shown) for "no run of ``value`` diverged" among ``rows`` (one setting)."""
    first = list(rows[0].group)[0]
    hit = [r for r in rows if same(r.group[first], value)]
    if len(hit) != 1:
        return "inconclusive", f"{len(hit)} rows for {value}" if hit else f"no run for {value}", []
    r = hit[0]
    shown = [f"{value}: {r.diverged}/{r.n} diverged" + (f" ({r.stopped} stopped)" if r.stopped else "")]
    return ("differs" if r.diverged else "agrees"), "", shown


def claim_lines(rows: list[Row], papers: list[Paper]) -> list[str]:
    """One line per claim and setting: the verdict, the claim, where, and the numbers."""
    out = []
    for i, p in enumerate(papers):
        mine = [r for r in rows if r.paper is p]
        if not mine:
            continue
        claims = ([{"order": p.ordering, "text": "the paper's ordering"}] if p.ordering else []) + p.claims
        key = p.key if p.key and all(run.series(p.key) for r in mine for run in r.runs) else mine[0].metric
        settings: dict[tuple, list[Row]] = {}
        for r in mine:
            settings.setdefault(_setting(r), []).append(r)
        tag = f" [{i + 1}]" if len(papers) > 1 else ""
        varying = [k for k in mine[0].context if len({repr(r.context[k]) for r in mine}) > 1]
        for c in claims:
            tiers = _tiers(c["order"]) if "order" in c else [[c["better"]], [c["worse"]]] if "better" in c else []
            stated = " > ".join(str(t[0]) if len(t) == 1 else "{" + ", ".join(map(str, t)) + "}" for t in tiers) \
                if tiers else f"no run of {c['converges']} diverges"
            where = c.get("where") or {}
            picked = [s for s in settings.values() if all(matches(r, where) for r in s)]
            if not picked:
                out.append(f"**inconclusive**: {c.get('text') or stated}{tag}: no run where "
                           f"{', '.join(f'{k} = {v}' for k, v in where.items())}.")
            for s in picked:
                at = ", ".join(f"{k} = {v}" for k, v in [*list(s[0].group.items())[1:],
                                                         *((k, s[0].context[k]) for k in varying)])
                if differs(s[0]):
                    out.append(f"**not compared**: {c.get('text') or stated}{tag}{' at ' + at if at else ''}: "
                               f"setting differs ({differs(s[0])}).")
                    continue
                result, reason, shown = verdict(s, tiers, key) if tiers else converges(s, c["converges"])
                what = f"mean ± std final {key}" if tiers else "runs"
                ours = f"; ours ({what}): {', '.join(shown)}" if shown else ""
                out.append(f"**{result}**: {c.get('text') or stated}{tag}{' at ' + at if at else ''}: expected "
                           f"{stated}{ours}{' (' + reason + ')' if reason else ''}.")
    return out
