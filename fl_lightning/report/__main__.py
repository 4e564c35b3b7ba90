"""``python -m fl_lightning.report``: see :mod:`fl_lightning.report`."""
from __future__ import annotations

import argparse
import os
import shlex
import sys


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line with the closest option (not the usage block), exit 2."""

    def error(self, message: str):
        import difflib

        options = sorted(o for o in self._option_string_actions if o.startswith("--"))
        words = [w for w in message.replace(",", " ").split() if w.startswith("-")]
        near = difflib.get_close_matches(words[0], options, n=1, cutoff=0.5) if words else []
        fix = f"did you mean {near[0]}?" if near else f"options: {', '.join(options)}"
        print(f"error: fl-report: {message}; fix: {fix} (fl-report --help lists them)", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    from . import ReportError, report

    ap = _OneLineParser(prog="fl-report", description="Run and sweep directories to report.md, report.csv "
                                 "and PNG plots (mean ± std over seeds).")
    ap.add_argument("dirs", nargs="+", help="run directories or folders of runs (searched recursively)")
    ap.add_argument("--by", nargs="+", default=["method"], help="config keys that make a row (default: method)")
    ap.add_argument("--select", default=None, help="keep, per row, the swept setting with the best mean final value "
                    "of this metric (e.g. val_acc)")
    ap.add_argument("--target", type=float, default=None, help="report the rounds to reach this primary metric")
    ap.add_argument("--stat", choices=("mean", "median"), default="mean", help="the final metric's mean ± std over "
                    "seeds (default), or its median and 90th percentile (a diverged run counting as the worst, a "
                    "stopped one left out)")
    ap.add_argument("--blowup", type=float, default=None, help="a run whose final metric is worse than this counts as "
                    "diverged, as does one whose loss became non-finite (the diverged column; a run stopped without an "
                    "error is counted as stopped)")
    ap.add_argument("--out", default="report", help="output folder (default: ./report)")
    ap.add_argument("--round-means", nargs="+", default=[], metavar="COLUMN",
                    help="metrics.csv columns reported as their mean over each run's rounds (e.g. precond_drift)")
    ap.add_argument("--metrics", nargs="+", default=[], metavar="COLUMN",
                    help="metrics.csv columns reported by their final value, mean ± std (e.g. train_loss)")
    ap.add_argument("--name", default="report", help="file stem: OUT/NAME.md, OUT/NAME.csv, OUT/NAME_*.png")
    ap.add_argument("--title", default=None, help="the page's title")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--dedupe", choices=("newest",), default=None, help="of runs that repeat a setting and seed, "
                    "keep the newest (else such a row shows its mean without a std, marked)")
    ap.add_argument("--declared", action="store_true", help="write again the page a sweep's experiment declares "
                    "(hydra.callbacks.report in DIR/multirun.yaml), from the runs on disk; other options are ignored")
    argv_used = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(argv)
    try:
        if a.declared:
            from .callback import declared

            for d in a.dirs:
                declared(d)
            return 0
        rows = report(a.dirs, a.out, a.by, a.select, a.target, plots=not a.no_plots, name=a.name, title=a.title,
                      round_means=a.round_means, stat=a.stat, blowup=a.blowup, metrics=a.metrics, dedupe=a.dedupe,
                      command="python -m fl_lightning.report " + " ".join(shlex.quote(x) for x in argv_used))
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from .write import print_table

    print_table(os.path.join(a.out, f"{a.name}.md"))
    print(f"{len(rows)} rows from {sum(r.n for r in rows)} runs: {a.out}/{a.name}.md, {a.out}/{a.name}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
