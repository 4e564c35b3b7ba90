"""RunRecorder: the metric rows, the communication counters and the run's summary.

A row is whatever the round produced: the loop's ``train_loss`` and ``lr_factor``, the metrics every strategy part
returned from ``server_update`` (FedPAC's preconditioner drift, bits per direction, ...), the model's evaluation
metrics (``test_acc``, F1, MCC, perplexity, ...), the round's exact uplink/downlink bits, the cumulative bits (and
megabytes, for display) and the wall time. ``metrics.csv`` has open
columns: the union of the rows' keys in first-seen order, blank where a row lacks a value. Rows are kept for the
evaluated rounds; every row also goes to the Fabric loggers the run asked for (``logger=tensorboard | wandb |
mlflow``; none by default: this file is the rows' one copy).

``summary.json`` declares the run's primary metric and its direction (``("test_acc", "max")`` for classifiers,
``("test_loss", "min")`` or perplexity for language models; set by the model's ``primary_metric``), its final and
best values, the final value of every other metric, and every total. The recorder is stateful (rows, counters,
wall time), so a resumed run continues the same files.

Wall-clock stamps (``time.time()``, seconds since the epoch) let a parent process time this one from outside
(``tools/bench_w2.py``): ``loop_start_unix``, when this invocation's round loop began (after the imports, the data,
the model, Fabric and the strategy's set-up); ``first_client_unix``, when this process finished its first client's
local training (its first optimizer steps, with whatever they load on first use); and ``round_end_unix``, one per
round this invocation ran, taken after the round's training and server update (before its evaluation and
checkpoint). A parent subtracts its own ``time.time()`` at spawn to get the start-up; all are this invocation's only
(a resumed run restamps them).
"""
from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any, Callable

_COUNTERS = ("uplink_bits", "downlink_bits")


class RunRecorder:
    def __init__(self, run_dir: str, *, primary: tuple[str, str] = ("test_acc", "max"), rank: int = 0,
                 log_fn: Callable[[dict, int], None] | None = None, info: Mapping[str, Any] | None = None):
        if primary[1] not in ("max", "min"):
            raise ValueError(f"primary metric direction must be 'max' or 'min', got {primary[1]!r}")
        self.run_dir, self.primary, self.rank, self.log_fn = run_dir, (str(primary[0]), primary[1]), rank, log_fn
        self.info = dict(info or {})
        self.rows: list[dict[str, Any]] = []
        self.totals: dict[str, float] = {k: 0 for k in _COUNTERS}
        self.wall_before = 0.0
        self._t0 = time.perf_counter()
        self.loop_start_unix: float | None = None
        self.first_client_unix: float | None = None
        self.round_end_unix: list[float] = []

    # ------------------------------------------------------------------ during the run
    def start_clock(self) -> None:
        self._t0 = time.perf_counter()
        self.loop_start_unix = time.time()

    def client_done(self) -> None:
        """A client's local training is done (the first one of this invocation: ``first_client_unix``)."""
        if self.first_client_unix is None:
            self.first_client_unix = time.time()

    def stamp_round(self) -> None:
        """A round's training and server update are done (``round_end_unix``)."""
        self.round_end_unix.append(time.time())

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self._t0

    def add(self, **counts: float) -> None:
        """Add to the cumulative counters (``uplink_bits=...``, ``downlink_bits=...``, ...)."""
        for k, v in counts.items():
            self.totals[k] = self.totals.get(k, 0) + v

    def record(self, round_done: int, metrics: Mapping[str, Any], keep: bool = True) -> dict[str, Any]:
        """The row of round ``round_done``: its metrics, the cumulative counters, the wall time. ``keep``: add it to
        ``metrics.csv`` (evaluated rounds) and the loggers."""
        row = {"round": round_done, **metrics, **self.totals, **self._mb(), "wall_s": round(self.wall(), 3)}
        if keep:
            self.rows.append(row)
            self.write_csv()
            if self.log_fn is not None:
                self.log_fn({k: v for k, v in row.items() if k != "round" and isinstance(v, (int, float))}, round_done)
        return row

    def _mb(self) -> dict[str, float]:
        """Cumulative megabytes of every ``*_bits`` counter (for display; the bits are exact)."""
        return {k[: -len("_bits")] + "_mb": v / 8e6 for k, v in self.totals.items() if k.endswith("_bits")}

    def columns(self) -> list[str]:
        cols: dict[str, None] = {}
        for row in self.rows:
            cols.update(dict.fromkeys(row))
        return list(cols)

    def write_csv(self) -> None:
        if self.rank != 0:
            return
        path = os.path.join(self.run_dir, "metrics.csv")
        tmp = path + ".tmp"
        cols = self.columns()
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, restval="")
            w.writeheader()
            w.writerows(self.rows)
        os.replace(tmp, path)

    def last(self, key: str) -> Any:
        """The newest recorded value of ``key`` (None if never recorded)."""
        for row in reversed(self.rows):
            if key in row:
                return row[key]
        return None

    # ------------------------------------------------------------------ the end
    def summary(self, **extra: Any) -> dict[str, Any]:
        name, mode = self.primary
        values = [r[name] for r in self.rows if isinstance(r.get(name), (int, float)) and not math.isnan(r[name])]
        best = (max if mode == "max" else min)(values) if values else None
        finals: dict[str, Any] = {}
        for col in self.columns():
            if col not in ("round", "wall_s", *self.totals, *self._mb()):
                finals[f"final_{col}"] = self.last(col)
        if isinstance(extra.get("run_dir"), str):  # absolute, a resumed run's too (resume= may name it relatively)
            extra["run_dir"] = os.path.abspath(extra["run_dir"])
        s = {**self.info, **extra, "primary_metric": name, "primary_mode": mode, "final": self.last(name),
             "best": best, f"best_{name}": best, **finals, **self.totals, **self._mb(), "wall_s": round(self.wall(), 2),
             "loop_start_unix": self.loop_start_unix, "first_client_unix": self.first_client_unix,
             "round_end_unix": self.round_end_unix}
        if self.rank == 0:
            with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
                json.dump(s, f, indent=2)
        return s

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "totals": self.totals, "wall_s": self.wall()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rows = [dict(r) for r in state["rows"]]
        self.totals = dict(state["totals"])
        self.wall_before = float(state["wall_s"])
        self._t0 = time.perf_counter()
