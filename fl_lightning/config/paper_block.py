"""A run's ``paper:`` block (:class:`fl_lightning.config.schema.Root`), read and checked: the paper's numbers and claims
that ``fl-report`` shows beside the runs, and the setting they hold for (:mod:`fl_lightning.report.paper` explains
the block). Here, below the report package, so a malformed block is refused before a run without the build importing
the report."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from ..errors import ConfigError, ReportError
from .checks import closest_key

UNITS = ("%", "fraction", None)
_KEYS = ("source", "metric", "key", "unit", "setting", "cells", "ordering", "claims")
_CLAIM_KEYS = ("better", "worse", "order", "converges", "where", "text")


class PaperError(ConfigError, ReportError):
    """A malformed ``paper:`` block: a config error (refused before a run) the report also stops on."""


@dataclass
class Paper:
    source: str = ""
    metric: str = ""
    key: str | None = None
    unit: str | None = None
    cells: list[dict[str, Any]] = field(default_factory=list)
    ordering: list[Any] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    setting: dict[str, Any] = field(default_factory=dict)  # full config key -> the paper's value (its nulls left out)


_ABSENT = object()


def _setting(block: dict, config: Any, changed: tuple[str, ...] = ()) -> dict[str, Any]:
    """The block's ``setting`` read; with ``config``, each key must be one of its keys (a null: a key the paper does
    not fix, e.g. one a parent experiment's block fixes and this table varies), or one the run's command line
    removed or replaced (``changed``: ``~data.partition.alpha``, ``data/partition=iid`` as ``data.partition``): that
    run is one of another setting, which the report shows beside the paper's (:func:`fl_lightning.report.paper.differs`)
    as it shows a shrunk run."""
    setting = block.get("setting") or {}
    if not isinstance(setting, dict):
        raise PaperError("paper.setting", f"expected a table, got {setting!r}", "give {FULL.CONFIG.KEY: VALUE, ...}: "
                         "the keys the paper's table fixes and its values (data.name, model.name, fl.rounds, ...)")
    for k, v in setting.items():
        if isinstance(v, (dict, list)):
            raise PaperError(f"paper.setting.{k}", f"got {v!r}", "give the one value the paper's table has")
        if config is not None and OmegaConf.select(config, str(k), default=_ABSENT,
                                                   throw_on_resolution_failure=False) is _ABSENT and \
                not any(str(k) == c or str(k).startswith(c + ".") for c in changed):
            near = closest_key(config, str(k))
            raise PaperError(f"paper.setting.{k}", "no such config key", "name the full key of the composed config"
                             + (f" (closest: {near})" if near else ""))
    return {str(k): v for k, v in setting.items() if v is not None}


def _tiers_ok(order: Any) -> bool:
    return isinstance(order, list) and len(order) > 0 and not any(isinstance(t, list) and not t for t in order)


def read_paper(node: Any, config: Any = None, changed=()) -> Paper | None:
    """The ``paper:`` block of a run's config (None: the config has none); a malformed block is one line, and so,
    given the composed ``config``, is a ``setting`` key it does not have, unless the run's command line removed or
    replaced it (``changed``: the keys and group nodes it deleted or chose, ``data.partition``)."""
    if node is None:
        return None
    block = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(block, dict):
        raise PaperError("paper", f"expected a table, got {block!r}", f"give {', '.join(_KEYS)}")
    unknown = set(block) - set(_KEYS)
    if unknown:
        raise PaperError(f"paper.{sorted(unknown)[0]}", "no such key", f"use {', '.join(_KEYS)}")
    key = block.get("key")
    if key is not None and not isinstance(key, str):
        raise PaperError("paper.key", f"got {key!r}", "name the run metric the numbers compare with (test_acc, "
                         "train_loss, test_ppl, ..., or rounds_to_target)")
    if block.get("unit") not in UNITS:
        raise PaperError("paper.unit", f"got {block['unit']!r}", "use '%', fraction or null (the metric's own scale)")
    cells = block.get("cells") or []
    if not isinstance(cells, list):
        raise PaperError("paper.cells", "expected a list", "write cells: [{KEY: VALUE, ..., value: NUMBER}]")
    for i, c in enumerate(cells):
        if not isinstance(c, dict) or not isinstance(c.get("value"), (int, float)) or isinstance(c.get("value"), bool) \
                or len(c) < 2:
            raise PaperError(f"paper.cells[{i}]", f"got {c!r}",
                             "give the keys that pick the row and the paper's number, {KEY: VALUE, ..., value: NUMBER}")
    ordering = block.get("ordering") or []
    if ordering and not _tiers_ok(ordering):
        raise PaperError("paper.ordering", "expected a list", "list the first --by key's values best first (a list "
                         "inside it is a tier whose order is not stated)")
    claims = block.get("claims") or []
    if not isinstance(claims, list):
        raise PaperError("paper.claims", "expected a list", "write claims: [{better: A, worse: B, text: ...}]")
    for i, c in enumerate(claims):
        where = f"paper.claims[{i}]"
        if not isinstance(c, dict) or set(c) - set(_CLAIM_KEYS):
            raise PaperError(where, f"got {c!r}", f"use the keys {', '.join(_CLAIM_KEYS)}")
        kinds = ("better" in c and "worse" in c) + ("order" in c) + ("converges" in c)
        if kinds != 1 or ("order" in c and not _tiers_ok(c["order"])) or (("better" in c) != ("worse" in c)):
            raise PaperError(where, f"got {c!r}", "give one of: better and worse, order (values of the first --by "
                             "key, best first), or converges (a value none of whose runs may diverge)")
        if not isinstance(c.get("where", {}), dict):
            raise PaperError(f"{where}.where", f"got {c['where']!r}", "give {KEY: VALUE, ...} of the other --by keys")
    return Paper(str(block.get("source") or ""), str(block.get("metric") or ""), key, block.get("unit"), cells,
                 ordering, claims, _setting(block, config, tuple(changed)))
