"""Markers: ``slow`` (system tests: the CLI in subprocesses, resume, several processes; run by default, skip with
``-m "not slow"`` for a quick loop) and ``gpu`` (skipped without CUDA). Helpers live in tests/helpers/."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.cli import FAST, build_loop, make_cfg, run_cli  # noqa: F401  (older imports: from tests.conftest import ...)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fast_overrides():
    return list(FAST)
