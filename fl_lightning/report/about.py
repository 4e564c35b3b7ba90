"""A page's ``about`` text written from the runs' own config: ``{{KEY}}`` is replaced by the values ``KEY`` had in
the report's runs, ``{{KEY | OTHER=VALUE}}`` by its values in the runs whose ``OTHER`` is ``VALUE`` (e.g.
``{{method.lr | label=Local Muon}}``; ``(not run)`` where no run has that value). One value is written as is, several
as their sorted list (``0, 1, 2``; four or more consecutive integers as a range, ``0-19``). Double braces cannot be
read as Hydra's ``${...}`` or as the single braces of a set in the text; a key no run has is a one-line error naming
the closest one.
"""
from __future__ import annotations

import re
from typing import Any

from .runs import ReportError, Run, closest

PLACEHOLDER = re.compile(r"\{\{\s*([^{}|]+?)\s*(?:\|\s*([^{}=|]+?)\s*=\s*([^{}]*?)\s*)?\}\}")


def _text(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def values(vals: list[Any]) -> str:
    """The distinct values, sorted (numbers by value), as text; runs of four or more consecutive integers as a-b."""
    distinct = {repr(v): v for v in vals}.values()
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in distinct)
    ordered = sorted(distinct, key=(lambda v: v) if numeric else _text)
    if numeric and all(isinstance(v, int) for v in ordered):
        parts, start = [], 0
        for i in range(1, len(ordered) + 1):
            if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
                seq = ordered[start:i]
                parts += [f"{seq[0]}-{seq[-1]}"] if len(seq) >= 4 else [str(v) for v in seq]
                start = i
        return ", ".join(parts)
    return ", ".join(_text(v) for v in ordered)


def fill(about: str, runs: list[Run]) -> str:
    """``about`` with every placeholder replaced by the runs' values."""
    keys = set().union(*(r.keys for r in runs))

    def one(m: re.Match) -> str:
        key, other, want = m.group(1), m.group(2), m.group(3)
        for k in (key, other):
            if k is not None and not any(r.has(k) for r in runs):
                raise ReportError(f"report: about: {m.group(0)}: no run has the key {k}{closest(k, keys)}")
        picked = [r for r in runs if other is None or _text(r.value(other)) == want]
        return values([r.value(key) for r in picked]) if picked else "(not run)"  # e.g. a sweep of fewer arms

    return PLACEHOLDER.sub(one, about)
