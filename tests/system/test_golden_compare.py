"""The refactor guard: ``python -m tests.helpers.golden --compare BASE`` runs BASE (a temporary worktree) and the
working tree on this machine and reports the methods whose bits differ."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.helpers.cli import ROOT


@pytest.mark.slow
def test_compare_reports_a_changed_method_and_passes_an_unchanged_one(tmp_path):
    if shutil.which("git") is None or subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                                                     capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"  # a copy of HEAD to change, so the checkout under test is left alone
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", ROOT, str(clone)], check=True)
    run = [sys.executable, "-m", "tests.helpers.golden", "--compare", "HEAD", "fedavg", "scaffold"]
    same = subprocess.run(run, cwd=clone, capture_output=True, text=True, timeout=600)
    assert same.returncode == 0 and "all 2 methods are bit-identical to HEAD" in same.stdout, same.stdout + same.stderr
    yaml = clone / "conf" / "method" / "fedavg.yaml"
    yaml.write_text(yaml.read_text().replace("\nlr: 0.05\n", "\nlr: 0.05005\n"))
    changed = subprocess.run(run, cwd=clone, capture_output=True, text=True, timeout=600)
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "fedavg: digest" in changed.stdout and "scaffold" not in changed.stdout.split("fedavg: digest")[1]
    assert "1 of 2 methods differ in their bits from HEAD" in changed.stdout
