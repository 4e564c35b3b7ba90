"""A checkpoint written before the parts declared their keys as records (tests/fixtures/checkpoints_v1, written by
commit d2f349b's code: see make.py there) loads with today's code and the run continues exactly as an uninterrupted
run of today's code: the on-disk names of every part's client and server state are unchanged."""
from __future__ import annotations

import os
import shutil
import sys

import pytest
import torch

from tests.helpers.cli import ROOT, build_loop

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "checkpoints_v1")
sys.path.insert(0, FIXTURES)
from make import METHODS, OVERRIDES  # noqa: E402


@pytest.mark.parametrize("method", METHODS)
def test_a_checkpoint_from_before_records_resumes_bit_identically(method, tmp_path):
    over = [f"method={method}", *OVERRIDES]
    straight = build_loop(over, tmp_path / "straight")
    straight.run(progress_enabled=False)
    old = tmp_path / "old"
    shutil.copytree(os.path.join(FIXTURES, method), old)
    resumed = build_loop(over, tmp_path / "resumed", resume=str(old))
    summary = resumed.run(progress_enabled=False)
    assert summary["rounds_done"] == 4
    for k, v in straight.global_params.items():
        assert torch.equal(v, resumed.global_params[k]), k
    for name, t in straight.strategy.state_dict().items():
        assert torch.equal(t, resumed.strategy.state_dict()[name]), name
