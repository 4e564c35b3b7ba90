"""PNG plots of a report (matplotlib, Agg): the primary metric against the round and against the cumulative uplink,
one line per row (mean over its seeds) with a ± one-standard-deviation band; 8 × 4.5 in at 100 dpi (800 px wide)."""
from __future__ import annotations

import math
import os

from .table import Row


def _label(row: Row, shown: list[str], context: list[str] = ()) -> str:
    parts = [str(row.group[k]) for k in shown] + [str(row.context.get(k)) for k in context] + \
        [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in row.setting.items()]
    return ", ".join(parts) + f" (n={row.n})"


def curve(row: Row, x_col: str | None) -> tuple[list[float], list[float], list[float]]:
    """x, mean, std over the row's runs at the rounds every run evaluated (a run stopped early without an error left
    out, as in the table's means, unless every run of the row stopped)."""
    per_run = []
    for r in [r for r in row.runs if not r.stopped] or row.runs:
        xs = {int(d["round"]): (d["round"] if x_col is None else d.get(x_col, math.nan)) for d in r.rows}
        per_run.append({rd: (xs[rd], v) for rd, v in r.series(row.metric)})
    common = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    x, m, s = [], [], []
    for rd in common:
        vals = [p[rd][1] for p in per_run]
        x.append(sum(p[rd][0] for p in per_run) / len(per_run))
        mean = sum(vals) / len(vals)
        m.append(mean)
        s.append((sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0)
    return x, m, s


def _spread(rows: list[Row]) -> float:
    """The ratio of the largest to the smallest total uplink among ``rows``."""
    ups = [r.stats["uplink_mb"][0] for r in rows if r.stats.get("uplink_mb", (0,))[0] > 0]
    return max(ups) / min(ups) if ups else 1.0


def _panels(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """One figure per combination of the ``--by`` keys after the first (a grid's other axis, e.g. the Dirichlet
    alpha), so that a figure's lines compare the first key's values; the suffix names the combination."""
    rest = list(rows[0].group)[1:]
    panels: dict[str, list[Row]] = {}
    for r in rows:
        suffix = "".join(f"_{k.rsplit('.', 1)[-1]}{r.group[k]}" for k in rest)
        panels.setdefault(suffix, []).append(r)
    return list(panels.items())


def plot(rows: list[Row], out_dir: str, prefix: str = "") -> list[str]:
    """Writes ``<prefix><metric>_vs_round<suffix>.png`` and ``<prefix><metric>_vs_uplink<suffix>.png`` into
    ``out_dir`` (a suffix per value of the second and later ``--by`` keys); returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    metric = rows[0].metric
    first = list(rows[0].group)[:1]
    context = [k for k in rows[0].context if len({repr(r.context.get(k)) for r in rows}) > 1]  # data / model names
    names = []
    for suffix, members in _panels(rows):
        title = ", ".join(f"{k} = {members[0].group[k]}" for k in list(members[0].group)[1:])
        for x_col, xlabel, stem in ((None, "round", "vs_round"), ("uplink_mb", "cumulative uplink (MB)", "vs_uplink")):
            fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
            for i, row in enumerate(members):
                x, m, s = curve(row, x_col)
                if not x:
                    continue
                style = ("-", "--", ":")[min(i // 10, 2)]  # the colour cycle repeats after 10 lines
                line, = ax.plot(x, m, style, label=_label(row, first, context), linewidth=1.6)
                ax.fill_between(x, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)],
                                color=line.get_color(), alpha=0.2, linewidth=0)
            if x_col is None:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            elif _spread(members) > 10:  # e.g. 1-bit signs beside dense fp32 deltas: a log axis shows both
                ax.set_xscale("log")
                xlabel += ", log scale"
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{metric} (mean ± std over seeds)")
            if title:
                ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
            if len(members) > 8:  # many lines: the legend beside the axes, in columns, not over the curves
                ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 + len(members) // 24,
                          frameon=False)
            else:
                ax.legend(fontsize=8, loc="best")
            fig.tight_layout()
            name = f"{prefix}{metric}_{stem}{suffix}.png"
            fig.savefig(os.path.join(out_dir, name))
            plt.close(fig)
            names.append(name)
    if any(math.isfinite(r.stats.get("final dp_epsilon", (math.nan,))[0]) for r in rows):
        names.append(epsilon_plot(rows, out_dir, prefix, plt))
    return names


def epsilon_plot(rows: list[Row], out_dir: str, prefix: str, plt) -> str:
    """``<prefix><metric>_vs_epsilon.png`` (dp runs): each first ``--by`` value's final metric against the ε it spent,
    one point per row (a noise level); a row without noise (no ε: clipping only) is a dashed level of its colour."""
    metric, key = rows[0].metric, list(rows[0].group)[:1]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(", ".join(str(r.group[k]) for k in key), []).append(r)
    for label, members in groups.items():
        pts = sorted((r.stats["final dp_epsilon"][0], r.stats["final"][0]) for r in members
                     if math.isfinite(r.stats["final dp_epsilon"][0]))
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label, linewidth=1.6)
        for r in members:
            if not math.isfinite(r.stats["final dp_epsilon"][0]):
                ax.axhline(r.stats["final"][0], color=line.get_color(), linestyle="--", linewidth=1,
                           label=f"{label}, no noise (ε = ∞)")
    ax.set_xscale("log")
    ax.set_xlabel("ε spent over the run (log scale)")
    ax.set_ylabel(f"final {metric} (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    name = f"{prefix}{metric}_vs_epsilon.png"
    fig.savefig(os.path.join(out_dir, name))
    plt.close(fig)
    return name
