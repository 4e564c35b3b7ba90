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
          metrics: [train_loss]  # optional: columns reported by their final value
          about: "... {{fl.rounds}} rounds, seeds {{seed}} ..."   # the runs' values (fl_lightning.report.about)

Hydra calls :meth:`ReportWhenDone.on_multirun_end` in the launching process after every job has returned (any
launcher: basic, joblib, submitit); a single run (no ``-m``) writes nothing.
"""
from __future__ import annotations

import inspect
import os
import shlex
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class ReportWhenDone(Callback):
    def __init__(self, out: str, name: str = "report", by: list[str] | None = None, select: str | None = None,
                 target: float | None = None, title: str | None = None, about: str | None = None,
                 plots: bool = True, round_means: list[str] | None = None, stat: str = "mean",
                 blowup: float | None = None, metrics: list[str] | None = None) -> None:
        self.out, self.name, self.by, self.select, self.target = out, name, list(by or ["method"]), select, target
        self.title, self.about, self.plots, self.round_means = title, about, plots, list(round_means or [])
        self.stat, self.blowup, self.metrics = stat, blowup, list(metrics or [])

    @staticmethod
    def command(config: DictConfig) -> str:
        """The command line that ran the sweep (its task and Hydra overrides, without the mode Hydra adds)."""
        ov = config.hydra.overrides
        args = [*ov.hydra, *ov.task]
        return "python train.py -m " + " ".join(shlex.quote(str(a)) for a in args if not str(a).startswith("hydra.mode="))

    def write(self, config: DictConfig, sweep_dir: str) -> list:
        """The page, from the runs under ``sweep_dir``; raises :class:`~fl_lightning.report.ReportError`."""
        from . import report

        again = f"python -m fl_lightning.report {shlex.quote(sweep_dir)} --declared   # again, from the runs on disk"
        rows = report([sweep_dir], self.out, self.by, self.select, self.target, self.plots, self.name, self.title,
                      f"{self.command(config)}\n    {again}", self.about, self.round_means, stat=self.stat,
                      blowup=self.blowup, metrics=self.metrics)
        print(f"report: {len(rows)} rows from {sum(r.n for r in rows)} runs in {self.out}/{self.name}.md")
        return rows

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from . import ReportError

        try:
            self.write(config, str(config.hydra.sweep.dir))
        except ReportError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)


def declared(sweep_dir: str) -> list:
    """``fl-report DIR --declared``: the page the sweep in ``sweep_dir`` declared (its ``multirun.yaml``'s
    ``hydra.callbacks``), written again from the runs on disk (after a change to the report, or runs added)."""
    from omegaconf import OmegaConf

    from . import ReportError
    from .runs import closest

    path = os.path.join(sweep_dir, "multirun.yaml")
    if not os.path.exists(path):
        raise ReportError(f"report: {path} does not exist; fix: --declared takes a Hydra sweep directory "
                          "(python train.py -m ...)")
    cfg = OmegaConf.load(path)
    nodes = [n for n in (OmegaConf.select(cfg, "hydra.callbacks") or {}).values()
             if str(n.get("_target_", "")).endswith("ReportWhenDone")]
    if not nodes:
        raise ReportError(f"report: {path} declares no report (hydra.callbacks.<name>._target_: "
                          "fl_lightning.report.callback.ReportWhenDone); fix: give --by/--out instead of --declared")
    kwargs = {k: v for k, v in OmegaConf.to_container(nodes[0], resolve=False).items() if k != "_target_"}
    known = inspect.signature(ReportWhenDone.__init__).parameters
    for k in kwargs:
        if k not in known:
            raise ReportError(f"report: {path}: the report callback's {k}: no such option"
                              f"{closest(k, set(known) - {'self'})}")
    return ReportWhenDone(**kwargs).write(cfg, sweep_dir)
