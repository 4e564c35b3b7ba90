"""The paper's numbers beside ours: an experiment config's ``paper:`` block (:class:`fl_lightning.schema.Root`).

    paper:
      source: "seed 002 (FedSMU), Table 2: CIFAR-10, Dir (0.25)-H"   # where the numbers are printed
      metric: "top-1 test accuracy (%), 4000 rounds"                # what they measure, in the paper's units
      cells:                                                        # one per reproduced cell: the keys that pick the
        - {method: fedavg, value: 55.2}                             # row (report keys, as --by takes them) + value
      ordering: [fedmuon_bc, local_muon, fedavg]                    # expected order, best first, of --by's first key
                                                                    # (a list in it: a tier, its order not stated:
                                                                    # [fedmuon, [fedavg, scaffold]] = fedmuon above both)

A cell matches a report row when each of its keys has the row's value (numbers compared to 1e-9 relative). Seed 000
prints no numbers, only orderings: ``ordering`` states them and the report says whether ours agrees.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from ..errors import ConfigError
from .runs import ReportError
from .table import Row


class PaperError(ConfigError, ReportError):
    """A malformed ``paper:`` block: a config error (refused before a run) the report also stops on."""


@dataclass
class Paper:
    source: str = ""
    metric: str = ""
    cells: list[dict[str, Any]] = field(default_factory=list)
    ordering: list[Any] = field(default_factory=list)


def read_paper(node: Any) -> Paper | None:
    """The ``paper:`` block of a run's config (None: the config has none); a malformed block is one line."""
    if node is None:
        return None
    block = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(block, dict):
        raise PaperError("paper", f"expected a table, got {block!r}", "give source, metric, cells, ordering")
    unknown = set(block) - {"source", "metric", "cells", "ordering"}
    if unknown:
        raise PaperError(f"paper.{sorted(unknown)[0]}", "no such key", "use source, metric, cells, ordering")
    cells = block.get("cells") or []
    if not isinstance(cells, list):
        raise PaperError("paper.cells", "expected a list", "write cells: [{KEY: VALUE, ..., value: NUMBER}]")
    for i, c in enumerate(cells):
        if not isinstance(c, dict) or not isinstance(c.get("value"), (int, float)) or isinstance(c.get("value"), bool) \
                or len(c) < 2:
            raise PaperError(f"paper.cells[{i}]", f"got {c!r}",
                             "give the keys that pick the row and the paper's number, {KEY: VALUE, ..., value: NUMBER}")
    ordering = block.get("ordering") or []
    if not isinstance(ordering, list) or any(isinstance(t, list) and not t for t in ordering):
        raise PaperError("paper.ordering", "expected a list", "list the first --by key's values best first (a list "
                         "inside it is a tier whose order is not stated)")
    return Paper(str(block.get("source") or ""), str(block.get("metric") or ""), cells, ordering)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return str(a) == str(b)


def cell_value(row: Row, paper: Paper) -> float | None:
    """The paper's number for ``row`` (its first run's values of the cell's keys), or None."""
    run = row.runs[0]
    for c in paper.cells:
        if all(_same(row.group.get(k, run.value(k)), v) for k, v in c.items() if k != "value"):
            return float(c["value"])
    return None


def ordering_lines(rows: list[Row], paper: Paper) -> list[str]:
    """Ours against the paper's ordering: per combination of the other ``--by`` keys, the ordered values of the first
    key by mean (or median) final primary metric, and whether it agrees: no value ranked above one of an earlier tier."""
    if not paper.ordering or not rows:
        return []
    first = list(rows[0].group)[0]
    sign = -1.0 if rows[0].runs[0].primary[1] == "min" else 1.0
    tiers = [[str(v) for v in t] if isinstance(t, list) else [str(t)] for t in paper.ordering]
    tier = {v: i for i, t in enumerate(tiers) for v in t}
    shown = [t[0] if len(t) == 1 else "{" + ", ".join(t) + "}" for t in tiers]
    lines = [f"The paper's ordering (best first{'; braces: order not stated' if len(shown) < len(tier) else ''}): "
             f"{' > '.join(shown)}."]
    blocks: dict[tuple, list[Row]] = {}
    for r in rows:
        blocks.setdefault(tuple(repr(v) for k, v in r.group.items() if k != first), []).append(r)
    stat = "median" if "median" in rows[0].stats else "mean"
    for members in blocks.values():
        ours = sorted((r for r in members if str(r.group[first]) in tier), key=lambda r: -sign * r.center)
        got = [str(r.group[first]) for r in ours]
        agrees = all(tier[a] <= tier[b] for a, b in zip(got, got[1:]))
        where = ", ".join(f"{k} = {v}" for k, v in members[0].group.items() if k != first)
        lines.append(f"Ours{' at ' + where if where else ''} ({stat} final {rows[0].metric}): {' > '.join(got)}: "
                     f"{'agrees' if agrees else 'differs'}.")
    return lines
