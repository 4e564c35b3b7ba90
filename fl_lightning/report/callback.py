"""The report of a sweep, written when the sweep ends: a Hydra callback an experiment config declares, so that one
command runs the grid and writes its page (``docs/results/<name>.md`` and its PNGs)::

    hydra:
      callbacks:
        report:
          _target_: fl_lightning.report.callback.ReportWhenDone
          out: docs/results
          name: fedpac_small_scale
          by: [label]
          stat: median        # optional: median and 90th percentile of the final metric (default: mean ± std)
          blowup: 37.07       # optional: a final metric worse than this counts as diverged

Hydra calls :meth:`ReportWhenDone.on_multirun_end` in the launching process after every job has returned (any
launcher: basic, joblib, submitit); a single run (no ``-m``) writes nothing.
"""
from __future__ import annotations

import shlex
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class ReportWhenDone(Callback):
    def __init__(self, out: str, name: str = "report", by: list[str] | None = None, select: str | None = None,
                 target: float | None = None, title: str | None = None, about: str | None = None,
                 plots: bool = True, stat: str = "mean", blowup: float | None = None) -> None:
        self.out, self.name, self.by, self.select, self.target = out, name, list(by or ["method"]), select, target
        self.title, self.about, self.plots, self.stat, self.blowup = title, about, plots, stat, blowup

    @staticmethod
    def command(config: DictConfig) -> str:
        """The command line that ran the sweep (its task and Hydra overrides, without the mode Hydra adds)."""
        ov = config.hydra.overrides
        args = [*ov.hydra, *ov.task]
        return "python train.py -m " + " ".join(shlex.quote(str(a)) for a in args if not str(a).startswith("hydra.mode="))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from . import ReportError, report

        try:
            rows = report([str(config.hydra.sweep.dir)], self.out, self.by, self.select, self.target, self.plots,
                          self.name, self.title, self.command(config), self.about, stat=self.stat,
                          blowup=self.blowup)
        except ReportError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        print(f"report: {len(rows)} rows from {sum(r.n for r in rows)} runs in {self.out}/{self.name}.md")
