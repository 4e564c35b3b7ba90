"""Rich progress display for the federated loop: round r/R, clients done in the round, ETA, and below them the last
round's train loss, primary metric and MB communicated; and the closing summary table. Off a terminal (CI, log files)
it prints one plain line per evaluated round instead, and inside a round longer than :data:`INNER_AFTER_S` the clients
done and the ETA now and then. Progress goes to stderr, the summary (the run's result) to stdout: ``python3 train.py >
run.txt`` keeps the result. :class:`StepProgress`: a bar with ETA for a one-off job before the loop (the
``data=pydoc_topics`` MLM pre-training), shown on a terminal unless ``trainer.progress=false`` (:func:`set_enabled`)."""
from __future__ import annotations

import logging
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column, Table
from rich.text import Text

INNER_AFTER_S = 30.0  # off a terminal, a round running longer than this reports its clients done and an ETA
INNER_MAX_GAP_S = 300.0  # then each time the round's time has doubled, at least every 5 minutes


def print_whole(console: Console, renderable) -> None:
    """Print ``renderable`` on ``console``; off a terminal (a log file, a pipe, a Slurm job) at its natural width, so
    a long line or a wide table is neither wrapped at rich's default 80 columns nor cut."""
    if console.is_terminal:
        console.print(renderable, highlight=False)
        return
    from rich.measure import Measurement

    width = Measurement.get(console, console.options.update_width(1 << 16), renderable).maximum
    Console(file=console.file, width=max(width, 1), soft_wrap=True, highlight=False).print(renderable)


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


_ENABLED = [True]  # trainer.progress, set by the command line before the data are built


def set_enabled(on: bool) -> None:
    """``trainer.progress`` for the displays made outside the loop (:class:`StepProgress`)."""
    _ENABLED[0] = bool(on)


class _Live:
    """Enter/exit of a rich ``Progress`` whose log records print above the live display."""
    progress: Progress

    def __enter__(self):
        streams = sys.stdout, sys.stderr
        self.progress.__enter__()
        # rich swaps sys.stdout / sys.stderr for proxies that print above the display; logging handlers keep the
        # streams they were given (Hydra's console handler, Lightning's), so point them at the proxies meanwhile
        proxy = dict(zip(map(id, streams), (sys.stdout, sys.stderr)))
        self._moved = [(h, h.stream) for h in _stream_handlers()
                       if id(h.stream) in proxy and proxy[id(h.stream)] is not h.stream]
        for h, old in self._moved:
            h.setStream(proxy[id(old)])
        return self

    def __exit__(self, *exc):
        self._stop()

    def _stop(self) -> None:
        """Give the logging handlers their streams back and stop the live display (again: nothing)."""
        for h, old in getattr(self, "_moved", ()):
            h.setStream(old)
        self._moved = []
        self.progress.stop()


class StepProgress(_Live):
    """Steps done of ``total``, a short ``info`` text (e.g. the loss), elapsed time and ETA, live on a terminal
    (stderr) unless ``trainer.progress=false``; otherwise nothing is drawn (``live`` is False) and the caller logs
    what it needs."""

    def __init__(self, description: str, total: int, enabled: bool | None = None, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.live = (_ENABLED[0] if enabled is None else enabled) and self.console.is_terminal
        self.progress = Progress(
            TextColumn(f"[bold]{description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console, disable=not self.live,
        )
        self.task = self.progress.add_task(description, total=total, info="")

    def update(self, done: int, info: str = "") -> None:
        self.progress.update(self.task, completed=done, info=info)


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class _RoundDisplay(Progress):
    """The tasks' rows (description, bar, count, times: under 80 columns), then the last round's numbers on a line of
    their own, so that a narrow terminal keeps the bar."""
    info = ""

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        if self.info:
            yield Text(self.info, no_wrap=True, overflow="ellipsis")


class RoundProgress(_Live):
    """Rounds done and the round's clients done, live on a terminal (stderr) with ``enabled``; off a terminal one
    line per evaluated round (:meth:`end_round`) and, in a long round, the clients done (:meth:`client_done`). The
    summary table goes to ``out`` (stdout by default), once the live display has stopped."""

    def __init__(self, total_rounds: int, start_round: int, enabled: bool = True, primary: str = "test_acc",
                 console: Console | None = None, out: Console | None = None):
        self.console = console or Console(stderr=True)
        self.out = out or Console()  # the result: stdout (rich resolves sys.stdout when it prints)
        self.primary = primary
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal
        fixed = lambda: Column(no_wrap=True)  # noqa: E731 - only the bar's width is set; no column wraps
        self.progress = _RoundDisplay(
            TextColumn("[bold]{task.description:<16}", table_column=fixed()), BarColumn(bar_width=30),
            MofNCompleteColumn(table_column=fixed()), TimeElapsedColumn(table_column=fixed()),
            TextColumn("ETA", table_column=fixed()), TimeRemainingColumn(table_column=fixed()),
            console=self.console, disable=not self.live,
        )
        self.rounds = self.progress.add_task("rounds", total=total_rounds, completed=start_round)
        self.clients = self.progress.add_task("clients", total=1, visible=False)
        self._round = (start_round, 1, 0.0)  # the round running (0-based), its clients, when it started
        self._done = 0
        self._next_report = INNER_AFTER_S

    def start_round(self, r: int, n_clients: int) -> None:
        self.progress.update(self.clients, total=n_clients, completed=0, visible=True,
                             description=f"clients, round {r + 1}")
        self._round, self._done, self._next_report = (r, n_clients, self.progress.get_time()), 0, INNER_AFTER_S

    def client_done(self) -> None:
        self.progress.advance(self.clients)
        self._done += 1
        r, n, start = self._round
        if not self.enabled or self.live or self._done >= n:
            return
        spent = self.progress.get_time() - start
        if spent < self._next_report:
            return
        self._next_report = spent + min(INNER_MAX_GAP_S, max(INNER_AFTER_S, spent))
        per_client = spent / self._done
        left = per_client * (n - self._done)
        total = self.progress.tasks[self.rounds].total or 0
        run_left = left + per_client * n * max(0, total - r - 1)
        print_whole(self.console, f"round {r + 1}/{total}  clients {self._done}/{n}  {_hms(spent)} in the round  "
                                  f"ETA {_hms(left)} for the round, about {_hms(run_left)} for the run "
                                  "(evaluation not counted)")

    def end_round(self, r: int, info: dict) -> None:
        value = info.get(self.primary)
        shown = f"{value:.4f}" if isinstance(value, (int, float)) else "-"
        loss = info.get("train_loss")  # none in a round nobody was sampled in (fl.sampling=poisson)
        text = (f"loss {loss:.4f}  " if isinstance(loss, (int, float)) else "loss -  ") + (
                f"{self.primary} {shown}  up {info['uplink_mb']:.2f} MB  down {info['downlink_mb']:.2f} MB")
        if isinstance(info.get("dp_epsilon"), (int, float)):  # dp: the privacy spent so far
            text += f"  ε {info['dp_epsilon']:.3g}"
        self.progress.update(self.rounds, completed=r + 1)
        self.progress.info = f"round {r + 1}: {text}"
        if self.enabled and not self.live and info.get("evaluated"):
            task = self.progress.tasks[self.rounds]
            left = task.time_remaining if task.completed < (task.total or 0) else None  # rich's estimate from the rounds so far
            eta = f"  ETA {_hms(left)}" if left else ""
            print_whole(self.console, f"round {r + 1}/{task.total}  {text}{eta}")

    def summary(self, summary: dict) -> None:
        """The summary table on ``out``, after the live display has stopped (its last frame, the rounds' bar, stays
        above the table, not drawn again below it)."""
        if not self.enabled:
            return
        self.progress.update(self.clients, visible=False)  # the finished round's clients: not part of the result
        self._stop()
        t = Table(title=f"{summary['method']} / {summary['model']} / {summary['data']}", show_header=False)
        p = summary["primary_metric"]
        for k in ("rounds_done", f"final_{p}", f"best_{p}", "final_test_loss", "final_dp_epsilon", "uplink_mb", "downlink_mb",
                  "wall_s", "run_dir"):
            if k == "final_dp_epsilon" and k not in summary:
                continue
            v = summary.get(k)
            t.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
        print_whole(self.out, t)
