"""The one check of a run's config, in one place: :func:`check_run`. The command line runs it before anything is
built (``cli.py``); ``build.build`` receives a valid config and checks nothing in it again."""
from __future__ import annotations

from omegaconf import DictConfig

from .args import check_targets
from .checks import check
from .paper_block import read_paper
from .schema import FEDERATION_KEYS


def check_run(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Every key of a composed run config, first ``ConfigError`` wins: the schema's keys, ranges and rules
    (:func:`.checks.check`, torch-free, so a mistyped key fails in a moment), the ``paper:`` block, then every
    ``_target_`` node against its constructor (:func:`.args.check_targets`; importing the targets loads torch)."""
    check(cfg, overrides)
    if cfg.get("paper") is not None:  # the report reads it after the runs: a malformed block is refused before them
        read_paper(cfg.paper, cfg)
    check_targets(cfg, drop={"data": FEDERATION_KEYS})
