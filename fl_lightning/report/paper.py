"""The paper's numbers beside ours: each run's own ``paper:`` block (:class:`fl_lightning.config.schema.Root`).

    paper:
      source: "seed 002 (FedSMU), Table 2: CIFAR-10, Dir (0.25)-H"   # where the numbers are printed
      metric: "top-1 test accuracy (%), 4000 rounds"                # what they measure, in the paper's words
      key: test_acc          # the run metric the numbers are compared with: a metrics.csv column (its final value),
                             # or rounds_to_target (the report's rounds to --target)
      unit: "%"              # the paper's unit: "%" (a fraction of ours is shown x 100), fraction, or null (ours)
      setting: {data.name: cifar10, model.name: cnn_fedsmu, fl.rounds: 4000}   # what the table fixes: full config
                             # keys and the paper's values (null: not fixed, e.g. a key a parent experiment fixes)
      cells:                 # one per reproduced cell: the keys that pick the row (report keys, as --by takes them)
        - {method: fedavg, value: 55.2}                             # + the paper's number
      ordering: [fedmuon_bc, local_muon, fedavg]   # a claim in every setting: --by's first key's values, best first
                                                   # (a list in it: a tier, its order not stated)
      claims:                # what the paper says, each checked on the report's rows (:mod:`.claims`)
        - {better: fedsmu, worse: fedavg, text: "FedSMU above FedAvg (Table 2)"}
        - {order: [2, [0, 1, 4]], where: {data.partition.alpha: 0.1}, text: "T = 2 is best at beta = 0.1 (Fig. 2)"}

A cell matches a report row when each of its keys has the row's value (numbers compared to 1e-9 relative), for every
run of the row. Rows never mix runs of two blocks (:func:`.table.summarize`), so each row is compared with its own
paper. A row some of whose runs differ from the paper's ``setting`` (a shrunk run, another data set) was run in another
setting (:func:`differs`): the page shows the paper's number beside it with what differs, and compares neither it nor
the claims on it. Seed 000 prints no numbers, only orderings: ``ordering`` and ``claims`` state them.
"""
from __future__ import annotations

import math
from typing import Any


from ..config import UNITS, Paper, PaperError, read_paper  # noqa: F401 (the report's names for them)
from ..errors import ReportError
from .about import values
from .table import Row

FRACTIONS = ("acc", "f1", "mcc", "frac")  # our metrics whose value is a fraction: test_acc, val_f1, mu_frac, ...


def same(a: Any, b: Any) -> bool:
    """Config values equal: numbers to 1e-9 relative, anything else by its text."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return str(a) == str(b)


def matches(row: Row, keys: dict[str, Any]) -> bool:
    """Does every run of ``row`` have these keys' values (a ``--by`` key: the row's)?"""
    return all(same(row.group[k] if k in row.group else run.value(k), v) for run in row.runs for k, v in keys.items())


def differs(row: Row) -> str:
    """What sets the row apart from its paper's ``setting``, ``KEY: ours, paper: theirs; ...`` for each key some run of
    the row has another value of ("": the paper's setting, or no paper)."""
    if row.paper is None:
        return ""
    off = []
    for k, v in row.paper.setting.items():
        mine = [run.value(k) for run in row.runs]
        if not all(same(m, v) for m in mine):
            off.append(f"{k}: {values(mine)}, paper: {values([v])}")
    return "; ".join(off)


def cell_of(row: Row) -> dict[str, Any] | None:
    """The cell of the row's own paper that every run of the row matches (None: none). A cell that only some of the
    row's runs match is an error: the row mixes runs the paper tells apart."""
    if row.paper is None:
        return None
    for c in row.paper.cells:
        keys = {k: v for k, v in c.items() if k != "value"}
        hits = [all(same(row.group[k] if k in row.group else run.value(k), v) for k, v in keys.items())
                for run in row.runs]
        if all(hits):
            return c
        if any(hits):
            raise ReportError(f"report: the row {_where(row.group)} mixes runs that the paper cell {_where(keys)} "
                              "tells apart; fix: add those keys to --by")
    return None


def fraction(metric: str) -> bool:
    """Is our ``metric`` a fraction (accuracy, F1, MCC, ``*_frac``), to be shown x 100 beside a paper in %?"""
    return metric.rsplit("_", 1)[-1] in FRACTIONS


def ours(row: Row) -> tuple[float, float] | None:
    """The row's number to put beside its paper's, in the paper's unit: (center, std); None where the paper declares
    no key or its key is not one the row's runs logged."""
    p = row.paper
    if p is None or not p.key:
        return None
    if p.key == row.metric:
        name = "median" if "median" in row.stats else "final"
    else:
        name = p.key if p.key == "rounds_to_target" else f"final {p.key}"
    mean, std = row.stats.get(name, (math.nan, math.nan))
    if math.isnan(mean):
        return None
    factor = 100.0 if p.unit == "%" and fraction(p.key) else 1.0
    return mean * factor, (math.nan if row.n == 1 else std * factor)


def _where(keys: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in keys.items())


def notes(rows: list[Row], papers: list[Paper]) -> list[str]:
    """One line per thing a reader must know about the paper columns: a paper whose metric the runs did not log (or
    whose unit cannot be converted), and every cell that no row matched (``no run for``)."""
    out = []
    for i, p in enumerate(papers):
        mine = [r for r in rows if r.paper is p]
        tag = f"Paper [{i + 1}]" if len(papers) > 1 else "The paper"
        if p.cells and not p.key:
            out.append(f"{tag} declares no `key` (the run metric its numbers measure): its numbers are shown as "
                       "printed, not compared with ours.")
        elif p.cells and all(ours(r) is None for r in mine):
            logged = sorted(set().union(*(run.columns for r in mine for run in r.runs)) - {"round"})
            why = "needs --target" if p.key == "rounds_to_target" else \
                f"is not one these runs logged (they logged {', '.join(logged)})"
            out.append(f"{tag}'s metric `{p.key}` ({p.metric or 'no description'}) {why}: its numbers are shown as "
                       "printed, not compared with ours.")
        elif p.cells and p.unit in ("%", "fraction") and not fraction(p.key):
            out.append(f"{tag} gives `{p.key}` as a {'percentage' if p.unit == '%' else 'fraction'}, which ours is "
                       "not: ours is shown unconverted.")
        matched = {id(cell_of(r)) for r in mine}
        for c in p.cells:
            if id(c) not in matched:
                out.append(f"{tag}: no run for {_where({k: v for k, v in c.items() if k != 'value'})} "
                           f"(the paper's {c['value']:g}).")
    return out
