"""Run directories as the report reads them: ``config.yaml`` (the composed config), ``metrics.csv`` (one row per
round) and ``summary.json`` (the primary metric and its mode), found recursively under the paths given."""
from __future__ import annotations

import csv
import difflib
import json
import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..errors import ReportError  # noqa: F401 (the report package names it from here)
from ..config import not_setting_keys

# group keys that name a config group by its display name (``method.name``...), as the CLI and summaries do
_NAMED = {"method": "method.name", "model": "model.name", "data": "data.name", "partition": "data.partition.name"}
# keys that never tell two settings apart: the schema's (``setting=False``: those that leave results alone, and
# what only evaluation or storage reads), the seed (runs of one setting differ by it), the logger, and lookups
IGNORED_KEYS = (*not_setting_keys(), "seed", "logger", "tables")


def closest(name: str, known) -> str:
    """``; closest: X`` naming the existing name nearest ``name`` (difflib), for a one-line error."""
    near = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.0)
    return f"; closest: {near[0]}" if near else ""


def no_such(option: str, name: str, what: str, known) -> ReportError:
    """The one-line error for an option naming a key or column that no run has."""
    return ReportError(f"report: {option} {name}: no run has this {what}{closest(name, known)}")

_ABSENT = object()


@dataclass
class Run:
    path: str
    config: DictConfig
    rows: list[dict[str, float]]
    summary: dict[str, Any] = field(default_factory=dict)
    typed: set[str] = field(default_factory=set)  # the keys of the run's command-line overrides (overrides.yaml)
    job: int = -1  # the run's job number in its Hydra multirun (the sweep's order), -1 outside one

    @property
    def primary(self) -> tuple[str, str]:
        """(metric, "max" | "min"): the model's declared primary metric, from the summary (else test_acc, max)."""
        return str(self.summary.get("primary_metric", "test_acc")), str(self.summary.get("primary_mode", "max"))

    @property
    def finished(self) -> bool:
        """Did the run reach its last round: its summary.json says it finished and names no error?"""
        return bool(self.summary.get("finished", False)) and "error" not in self.summary

    @property
    def diverged(self) -> bool:
        """Did the run stop on its error: its summary.json names it (a non-finite loss; the trainer writes it so)?"""
        return "error" in self.summary

    @property
    def stopped(self) -> bool:
        """Did the run end before its last round without an error: no summary.json (stopped by a signal and never
        resumed, or killed) or one that says it did not finish (``stop_after_rounds``)? Neither finished nor
        diverged: the report counts it apart and leaves it out of the means."""
        return not self.finished and not self.diverged

    def value(self, key: str) -> Any:
        """A config value by key; ``method`` / ``model`` / ``data`` / ``partition`` are the groups' display names, a
        run without a ``label`` (an arm's name) is labelled by its method."""
        v = OmegaConf.select(self.config, _NAMED.get(key, key), default=None)
        if key == "label" and v is None:
            return self.value("method")
        return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v

    def series(self, metric: str) -> list[tuple[int, float]]:
        """(round, value) of every row that has ``metric`` (evaluated rounds only)."""
        return [(int(r["round"]), r[metric]) for r in self.rows if not math.isnan(r.get(metric, math.nan))]

    def has(self, key: str) -> bool:
        """Does the run's config have ``key`` (a group's display name and ``label`` always count)?"""
        return key in _NAMED or key == "label" or \
            OmegaConf.select(self.config, key, default=_ABSENT, throw_on_resolution_failure=False) is not _ABSENT

    @cached_property
    def leaves(self) -> dict[str, Any]:
        """The whole config as ``{dotted key: value}`` (lists as tuples)."""
        out: dict[str, Any] = {}

        def walk(node, prefix):
            if isinstance(node, dict):
                for k, v in node.items():
                    walk(v, f"{prefix}{k}.")
            else:
                out[prefix[:-1]] = tuple(node) if isinstance(node, list) else node

        walk(OmegaConf.to_container(self.config, resolve=True), "")
        return out

    @property
    def keys(self) -> set[str]:
        """The keys ``--by`` and the about text's placeholders may name."""
        return set(self.leaves) | set(_NAMED) | {"label"}

    @cached_property
    def columns(self) -> set[str]:
        """The metrics.csv columns this run logged (a value in at least one row)."""
        return {k for r in self.rows for k, v in r.items() if not math.isnan(v)}

    @cached_property
    def flat(self) -> dict[str, Any]:
        """The config as ``{dotted key: value}`` (lists as tuples), without the keys in ``IGNORED_KEYS``."""
        return {k: v for k, v in self.leaves.items() if not any(k == i or k.startswith(i + ".") for i in IGNORED_KEYS)}


def _float(v: str) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def read_run(path: str) -> Run:
    """One run directory (``config.yaml`` and ``metrics.csv``; a run that stopped in its first round has
    ``summary.json`` instead of ``metrics.csv``)."""
    try:
        cfg = OmegaConf.load(os.path.join(path, "config.yaml"))
        rows = []
        if os.path.exists(os.path.join(path, "metrics.csv")) or not os.path.exists(os.path.join(path, "summary.json")):
            with open(os.path.join(path, "metrics.csv"), newline="") as f:
                rows = [{k: _float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    except Exception as err:  # noqa: BLE001 - any unreadable file: one line naming it
        raise ReportError(f"report: cannot read the run in {path} ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''})") from None
    summary = {}
    if os.path.exists(os.path.join(path, "summary.json")):
        try:
            with open(os.path.join(path, "summary.json")) as f:
                summary = json.load(f)
        except (OSError, ValueError):
            summary = {}
    typed = set()
    try:
        typed = {str(o).split("=", 1)[0].lstrip("+~") for o in OmegaConf.load(os.path.join(path, "overrides.yaml"))}
    except Exception:  # noqa: BLE001 - no overrides file (a run made by the Python API): fall back to the shortest key
        pass
    job = -1
    try:
        job = int(OmegaConf.select(OmegaConf.load(os.path.join(path, ".hydra", "hydra.yaml")), "hydra.job.num"))
    except Exception:  # noqa: BLE001 - not a multirun job: ordered by path
        pass
    return Run(path, cfg, rows, summary, typed, job)


def find_runs(paths: list[str]) -> list[Run]:
    """Every run directory under ``paths`` (each a run or a folder of runs, e.g. a Hydra multirun), whatever the
    order the paths are given in: the paths sorted, and per path a sweep's runs in its job order (the order of its
    grid), other runs by path; a run found under two of the paths counts once."""
    for p in paths:
        if not os.path.isdir(p):
            raise ReportError(f"report: {p} is not a directory; fix: give run or sweep directories")
    found: dict[str, int] = {}
    for i, p in enumerate(sorted({os.path.abspath(p) for p in paths})):
        for root, dirs, files in os.walk(p):
            dirs[:] = sorted(d for d in dirs if d not in ("checkpoints", "logs", ".hydra"))
            if "config.yaml" in files and ("metrics.csv" in files or "summary.json" in files):
                found.setdefault(root, i)
    if not found:
        raise ReportError(f"report: no run (a folder with metrics.csv and config.yaml) under {', '.join(paths)}")
    runs = [(i, read_run(p)) for p, i in found.items()]
    return [r for _, r in sorted(runs, key=lambda ir: (ir[0], ir[1].job, ir[1].path))]
