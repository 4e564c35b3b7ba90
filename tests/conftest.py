"""Markers: ``slow`` (system tests: the CLI in subprocesses, resume, several processes; run by default, skip with
``-m "not slow"`` for a quick loop) and ``gpu`` (skipped without CUDA). Helpers live in tests/helpers/."""
from __future__ import annotations

import getpass
import os
import tempfile

# torch.compile's CPU kernels are cached by source, not by the ISA they were built for: after a run with
# ATEN_CPU_CAPABILITY forced (the golden tests' off-machine check), a later run loaded those kernels and crashed
# (a segfault in tests/system/test_compile.py). Each forced capability gets its own cache.
if os.environ.get("ATEN_CPU_CAPABILITY") and not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{os.environ['ATEN_CPU_CAPABILITY'].lower()}")

import pytest  # noqa: E402
import torch  # noqa: E402

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
