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

The page goes into the sweep's own folder (``<hydra.sweep.dir>/<name>.md``). ``out`` (the repository's published
results) is written only when asked: ``hydra.callbacks.report.publish=true``; and a publishing sweep whose command
line changes a key that changes results (rounds, data, model, method settings, seeds, the sweeper's grid; not
``trainer.*``, how it runs) is refused
before any job runs, in one line naming the key, so a shrunk sweep never overwrites a published page.
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
                 blowup: float | None = None, metrics: list[str] | None = None, publish: bool = False) -> None:
        self.out, self.name, self.by, self.select, self.target = out, name, list(by or ["method"]), select, target
        self.publish = publish  # checked at the sweep's start (a non-bool is one line there, not a silent true)
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
        out = self.out if self.publish is True else sweep_dir
        rows = report([sweep_dir], out, self.by, self.select, self.target, self.plots, self.name, self.title,
                      f"{self.command(config)}\n    {again}", self.about, self.round_means, stat=self.stat,
                      blowup=self.blowup, metrics=self.metrics)
        where = "" if self.publish is True else (f" (the sweep's own folder; {self.out}/{self.name}.md is rewritten only with "
                                         "hydra.callbacks.report.publish=true)")
        from .write import print_table

        print_table(os.path.join(out, f"{self.name}.md"))
        print(f"report: {len(rows)} rows from {sum(r.n for r in rows)} runs in {out}/{self.name}.md{where}")
        return rows

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A publishing sweep must run the experiment as declared: refused, before any job, if it changes a result."""
        if not isinstance(self.publish, bool):
            print(f"error: hydra.callbacks.report.publish: expected true or false, got {self.publish!r}; fix: set it "
                  "to true (rewrite the published page) or false (the report goes into the sweep's folder)",
                  file=sys.stderr)
            sys.exit(2)
        if not self.publish:
            return
        changed = result_overrides(config)
        if changed:
            print(f"error: hydra.callbacks.report.publish: the command line changes {changed[0]}, which the "
                  f"experiment fixes, so the page in {self.out} would hold another setting's numbers; fix: run the "
                  "experiment as it is to publish, or leave publish out (the report then goes into the sweep's "
                  "folder)", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from . import ReportError

        try:
            self.write(config, str(config.hydra.sweep.dir))
        except ReportError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)


def result_overrides(config: DictConfig) -> list[str]:
    """The command line's overrides that change what the runs compute: every task override but the experiment itself,
    the keys that leave results alone (``schema.not_result_keys``) and how it runs (``trainer.*``: the device, its
    precision), and any change of the sweeper's grid."""
    from ..config import not_result_keys

    free = set(not_result_keys())
    out = []
    for o in config.hydra.overrides.task:
        key = str(o).split("=", 1)[0].lstrip("+~").replace("/", ".")
        if key != "experiment" and key not in free and not key.startswith(("hydra.", "logger", "trainer.")):
            out.append(key)
    for o in config.hydra.overrides.hydra:
        key = str(o).split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra.sweeper.params"):
            out.append(key)
    return out


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
