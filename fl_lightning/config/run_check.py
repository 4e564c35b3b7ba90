"""The one check of a run's config, in one place: :func:`check_run`. The command line runs it before anything is
built (``cli.py``); ``build.build`` receives a valid config and checks nothing in it again."""
from __future__ import annotations

from omegaconf import DictConfig

from .args import check_targets, target_info
from .checks import check
from .groups import drop_left_behind
from .paper_block import read_paper
from .schema import FEDERATION_KEYS


def check_run(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Every key of a composed run config, first ``ConfigError`` wins: the schema's keys, ranges and rules
    (:func:`.checks.check`, torch-free, so a mistyped key fails in a moment), the ``paper:`` block, then every
    ``_target_`` node against its constructor (:func:`.args.check_targets`; importing the targets loads torch).

    With the command line's ``overrides``, what its group choices left behind of the members they replaced is
    dropped from ``cfg`` first (:func:`.groups.drop_left_behind`: an experiment's ``data.partition.alpha`` under
    ``data/partition=iid``), and a ``paper.setting`` key that the command line removed or replaced is a run of another
    setting, not an error."""
    check(cfg, overrides)
    dropped = drop_left_behind(cfg, overrides, {"data": FEDERATION_KEYS}, target_info=target_info) if overrides else []
    if cfg.get("paper") is not None:  # the report reads it after the runs: a malformed block is refused before them
        changed = [str(o).split("=", 1)[0].lstrip("+~").replace("/", ".") for o in overrides or ()]
        read_paper(cfg.paper, cfg, changed=[*changed, *dropped])
    check_targets(cfg, drop={"data": FEDERATION_KEYS})
