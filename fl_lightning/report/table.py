"""Runs grouped, settings selected and seeds aggregated: the numbers of ``report.md`` / ``report.csv``.

A *group* is the runs sharing the ``--by`` keys' values (default: the method). Within a group, keys other than the
seed whose values differ between runs (a swept ``method.lr``) make *settings*. Without ``--select`` every setting is
its own row; with ``--select METRIC`` the setting with the best mean final METRIC over its seeds is kept (max, or min
for a loss / perplexity) and reported on the primary metric: the papers' "tuned on the grid", done on held-out data
when METRIC is a ``val_*`` metric (``data.val_fraction``). Mean and sample standard deviation (n - 1) over seeds;
with ``stat="median"`` the median and the 90th percentile of the final value instead (a run that diverged counting
as the worst value, +inf for a minimised metric). A row counts its runs that *diverged*: stopped on their error
(:attr:`Run.diverged`: a non-finite loss, named in summary.json) or, with ``blowup``, finished worse than it; and apart
those that *stopped* before their last round without an error (:attr:`Run.stopped`: a signal and no resume, or
``stop_after_rounds``), which tell nothing of the method and are left out of the means and medians.

Runs of different data, models or ``paper:`` blocks never share a row, whatever ``--by`` says (:attr:`Row.context`,
:attr:`Row.paper_id`), so that each row is compared with its own paper's cells. A ``--by`` key, ``--select``,
``--round-means`` or ``--metrics`` column that no run has is a one-line error naming the closest that exists.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from .runs import ReportError, Run, no_such

CONTEXT = ("data", "model")  # what a row never mixes: the data set's and the model's names


def minimised(metric: str, run: Run | None = None) -> bool:
    """Lower is better: the run's declared mode for its primary metric (``grad_norm`` is min), else by the name."""
    if run is not None and "primary_mode" in run.summary and metric == run.primary[0]:
        return run.primary[1] == "min"
    return any(s in metric for s in ("loss", "ppl", "perplexity", "error"))


@dataclass
class Row:
    group: dict[str, Any]                       # the --by keys' values
    setting: dict[str, Any]                     # the swept keys' values of the kept setting (empty: one setting)
    runs: list[Run]
    metric: str                                 # the primary metric reported
    stats: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (mean, std)
    selected_on: str | None = None
    candidates: int = 1                         # settings the selection chose from
    diverged: int = 0                           # runs that stopped on their error or ended worse than ``blowup``
    blowup: float | None = None
    context: dict[str, Any] = field(default_factory=dict)  # the data and model names of its runs
    paper_id: str | None = None                 # its runs' paper: block (canonical JSON), None without one
    paper: Any = None                           # that block read (:class:`.paper.Paper`), set by the report
    source: int | None = None                   # its number in the page's list of paper sources
    repeated_seeds: bool = False                # two of its runs share a seed: not independent, no std shown
    stopped: int = 0                            # runs that ended before their last round without an error

    @property
    def center(self) -> float:
        """The row's final primary metric as ``stat`` summarises it (the mean, or the median)."""
        return self.stats["median"][0] if "median" in self.stats else self.stats["final"][0]

    @property
    def n(self) -> int:
        return len(self.runs)


def _mean_std(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile, linear between order statistics (numpy's default); an infinite neighbour wins."""
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return math.nan
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    a, b, frac = xs[lo], xs[min(lo + 1, len(xs) - 1)], pos - lo
    if frac == 0 or a == b or math.isinf(a):
        return a
    return b if math.isinf(b) else a + (b - a) * frac


def run_numbers(run: Run, metric: str, target: float | None, low: bool | None = None,
                round_means: list[str] = (), metrics: list[str] = ()) -> dict[str, float]:
    """Final and best ``metric``, rounds to reach ``target``, total uplink / downlink MB, wall seconds of one run, the
    final value of each ``metrics`` column (``final <column>``) and the mean over its logged rounds of each
    ``round_means`` column (``mean <column>``); ``low``: lower is better (None: :func:`minimised`)."""
    series = run.series(metric)
    vals = [v for _, v in series]
    low = minimised(metric, run) if low is None else low
    best = (min if low else max)(vals) if vals else math.nan
    out = {"final": vals[-1] if vals else math.nan, "best": best}
    if target is not None:
        hit = [r for r, v in series if (v <= target if low else v >= target)]
        out["rounds_to_target"] = float(hit[0]) if hit else math.nan
    last = run.rows[-1] if run.rows else {}
    for col in ("uplink_mb", "downlink_mb", "wall_s"):
        out[col] = last.get(col, math.nan)
    for col in metrics:
        vals = [v for _, v in run.series(col)]
        out[f"final {col}"] = vals[-1] if vals else math.nan
    for col in round_means:
        vals = [v for _, v in run.series(col)]
        out[f"mean {col}"] = statistics.fmean(vals) if vals else math.nan
    return out


def paper_id(run: Run) -> str | None:
    """The identity of a run's ``paper:`` block: its canonical JSON (None: the run has none)."""
    block = run.value("paper")
    return None if block is None else json.dumps(block, sort_keys=True, default=str)


def check_names(runs: list[Run], by: list[str], select: str | None, round_means: list[str],
                metrics: list[str]) -> None:
    """Every ``--by`` key is some run's config key, every column some run's metrics.csv column; else one line naming
    the closest one that exists."""
    keys = set().union(*(r.keys for r in runs))
    for k in by:
        if not any(r.has(k) for r in runs):
            raise no_such("--by", k, "config key", keys)
    columns = set().union(*(r.columns for r in runs))
    for option, names in (("--select", [select] if select else []), ("--round-means", round_means),
                          ("--metrics", metrics)):
        for c in names:
            if c not in columns and c.startswith("val_") and not any(k.startswith("val_") for k in columns):
                raise ReportError(f"report: {option} {c}: no run has a validation split (no val_* column); fix: "
                                  "run the sweep with data.val_fraction=0.1 (a held-out part of each client's data) "
                                  "to tune on it, not on the test set")
            if c not in columns:
                raise no_such(option, c, "metrics.csv column", columns)


def _swept(runs: list[Run], by: list[str]) -> list[str]:
    """The keys whose values differ between ``runs`` (besides the seed and the ``by`` keys). Keys that always vary
    together (``method.lr`` and the ``optimizer.lr`` interpolating it) count once, as the key the runs' command
    lines typed (``overrides.yaml``), else the shortest."""
    flats = [r.flat for r in runs]
    keys = sorted(set().union(*flats))
    by_full = {b if b not in ("method", "model", "data") else f"{b}.name" for b in by} | set(by)
    varying = [k for k in keys if k not in by_full and len({repr(f.get(k)) for f in flats}) > 1
               and not k.endswith(".name")]
    typed = set().union(*(r.typed for r in runs))
    seeds = tuple(repr(r.value("seed")) for r in runs)  # keys that follow the seed (``${seed}``) are the seed
    kept: dict[tuple, str] = {}
    for k in varying:
        pattern = tuple(repr(f.get(k)) for f in flats)
        if pattern == seeds:
            continue
        old = kept.get(pattern)
        rank = (k not in typed, k.count("."), k)
        if old is None or rank < (old not in typed, old.count("."), old):
            kept[pattern] = k
    return sorted(kept.values())


def summarize(runs: list[Run], by: list[str], select: str | None = None, target: float | None = None,
              metric: str | None = None, round_means: list[str] = (), stat: str = "mean",
              blowup: float | None = None, metrics: list[str] = ()) -> list[Row]:
    """The report's rows, in the order the groups first appear in ``runs``; ``stat``: ``mean`` (± std) or
    ``median`` (and 90th percentile) of the final metric; ``blowup``: a final metric worse than this is a divergence;
    ``round_means``: columns reported as their mean over each run's rounds; ``metrics``: columns reported by their
    final value (mean ± std)."""
    if not runs:
        raise ReportError("report: no runs")
    if stat not in ("mean", "median"):
        raise ReportError(f"report: --stat {stat}: expected mean or median")
    check_names(runs, by, select, list(round_means), list(metrics))
    if "dp_epsilon" not in metrics and any(r.series("dp_epsilon") for r in runs):  # dp=central: the privacy spent
        metrics = [*metrics, "dp_epsilon"]
    metric = metric or next((r for r in runs if r.summary), runs[0]).primary[0]  # a run killed early has no summary
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        key = tuple(repr(r.value(k)) for k in (*by, *CONTEXT)) + (paper_id(r),)
        groups.setdefault(key, []).append(r)
    rows = []
    for members in groups.values():
        swept = _swept(members, by)
        settings: dict[tuple, list[Run]] = {}
        for r in members:
            flat = r.flat
            settings.setdefault(tuple(repr(flat.get(k)) for k in swept), []).append(r)
        group = {k: members[0].value(k) for k in by}
        extra = {"context": {k: members[0].value(k) for k in CONTEXT}, "paper_id": paper_id(members[0])}
        chosen = list(settings.values())
        if select and len(chosen) > 1:
            if not all(r.series(select) for s in chosen for r in s if not r.stopped):
                raise ReportError(f"report: --select {select}: some runs never logged it (val_* needs "
                                  "data.val_fraction > 0); fix: select on a metric every run has")
            score = {i: _selection(s, select) for i, s in enumerate(chosen)}
            known = {i: v for i, v in score.items() if not math.isnan(v)} or score  # all runs stopped: no score
            pick = (min if minimised(select, members[0]) else max)(known, key=lambda i: known[i])
            rows.append(_row(group, swept, chosen[pick], metric, target, select, len(chosen), stat, blowup,
                             round_means, metrics, extra))
        else:
            rows.extend(_row(group, swept, s, metric, target, None, 1, stat, blowup, round_means, metrics, extra)
                        for s in chosen)
    return rows


def _selection(runs: list[Run], select: str) -> float:
    """A setting's score for ``--select``: the mean final ``select`` of its runs that did not stop early without an
    error (a stopped run's last value is from an earlier round)."""
    return _mean_std([run_numbers(r, select, None)["final"] for r in runs if not r.stopped])[0]


def _row(group, swept, runs, metric, target, select, candidates, stat, blowup, round_means, metrics, extra) -> Row:
    flat = runs[0].flat
    low = minimised(metric, next((r for r in runs if r.summary), runs[0]))  # a run killed early has no summary
    per_run = [run_numbers(r, metric, target, low, round_means, metrics) for r in runs]
    kept = [p for r, p in zip(runs, per_run) if r.finished]  # mean ± std: over the runs that finished (none: —)
    stats = {k: _mean_std([p[k] for p in kept]) for k in per_run[0]}
    if select:
        stats[f"selected_{select}"] = _mean_std([run_numbers(r, select, None)["final"] for r in runs
                                                 if not r.stopped])
    worse = (lambda v: v > blowup if low else v < blowup) if blowup is not None else (lambda v: False)
    down = [r.diverged or (r.finished and worse(p["final"])) for r, p in zip(runs, per_run)]
    if stat == "median":  # a diverged run is the worst value, a stopped one none; the mean's final and best give way
        finals = [(math.inf if low else -math.inf) if d else p["final"]
                  for r, d, p in zip(runs, down, per_run) if not r.stopped]
        del stats["final"], stats["best"]
        stats = {"median": (quantile(finals, 0.5), math.nan), "p90": (quantile(finals, 0.9), math.nan), **stats}
    seeds = [repr(r.value("seed")) for r in runs]
    repeated = len(set(seeds)) < len(seeds)
    if repeated:  # runs of one seed are not independent draws: their spread is no standard deviation
        stats = {k: (v[0], math.nan) for k, v in stats.items()}
    return Row(group, {k: flat.get(k) for k in swept}, runs, metric, stats, select, candidates,
               sum(down), blowup, **extra, repeated_seeds=repeated, stopped=sum(r.stopped for r in runs))


def dedupe_newest(runs: list[Run]) -> list[Run]:
    """``--dedupe newest``: of the runs of one setting and seed (the same config up to the keys that leave results
    alone), the newest (its metrics.csv or summary.json last written), in the runs' order."""
    import os

    def when(r: Run) -> float:
        paths = [os.path.join(r.path, f) for f in ("summary.json", "metrics.csv")]
        return max((os.path.getmtime(p) for p in paths if os.path.exists(p)), default=0.0)

    newest: dict[tuple, Run] = {}
    for r in runs:
        key = (tuple(sorted((k, repr(v)) for k, v in r.flat.items())), repr(r.value("seed")))
        if key not in newest or when(r) >= when(newest[key]):
            newest[key] = r
    keep = {id(r) for r in newest.values()}
    return [r for r in runs if id(r) in keep]
