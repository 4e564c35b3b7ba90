"""PNG plots of a report (matplotlib, Agg): the primary metric against the round and against the cumulative uplink,
one line per row (mean over its seeds) with a ± one-standard-deviation band; 8 × 4.5 in at 100 dpi (800 px wide)."""
from __future__ import annotations

import math
import os

from .table import Row


def _label(row: Row) -> str:
    parts = [str(v) for v in row.group.values()] + [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in row.setting.items()]
    return ", ".join(parts) + f" (n={row.n})"


def _curve(row: Row, x_col: str | None) -> tuple[list[float], list[float], list[float]]:
    """x, mean, std over the row's runs at the rounds every run evaluated."""
    per_run = []
    for r in row.runs:
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


def plot(rows: list[Row], out_dir: str) -> list[str]:
    """Writes ``<metric>_vs_round.png`` and ``<metric>_vs_uplink.png`` into ``out_dir``; returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = rows[0].metric
    names = []
    for x_col, xlabel, name in ((None, "round", f"{metric}_vs_round.png"),
                                ("uplink_mb", "cumulative uplink (MB)", f"{metric}_vs_uplink.png")):
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for row in rows:
            x, m, s = _curve(row, x_col)
            if not x:
                continue
            line, = ax.plot(x, m, label=_label(row), linewidth=1.6)
            ax.fill_between(x, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], color=line.get_color(),
                            alpha=0.2, linewidth=0)
        if x_col is None:
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{metric} (mean ± std over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name))
        plt.close(fig)
        names.append(name)
    return names
