"""``.gitignore`` keeps the report's output folders out of git (issue 65 item 13): the default ``--out`` (./report)
and the folders the README and docs/usage.md write with ``--out``, anchored so that the package
``fl_lightning/report/`` is never ignored."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.helpers.cli import ROOT

DEFAULT_OUT = "report"  # fl_lightning/report/__main__.py: --out's default


def _ignored(path: str) -> bool:
    """Does ``.gitignore`` ignore ``path`` (git's own matching; read-only, the index left alone)?"""
    p = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode == 0


def _documented_outs() -> set[str]:
    """The top folder of every ``--out`` a report command in the README or docs/usage.md writes to."""
    outs = set()
    for page in ("README.md", os.path.join("docs", "usage.md")):
        with open(os.path.join(ROOT, page)) as f:
            for line in f:
                if "fl_lightning.report" in line or "fl-report" in line:
                    outs |= {m.split("/")[0] for m in re.findall(r"--out\s+([\w./-]+)", line)}
    return outs


@pytest.mark.skipif(shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")),
                    reason="needs git and the repository's checkout")
def test_the_reports_output_folders_are_ignored_and_the_report_package_is_not():
    outs = _documented_outs()
    assert "reports" in outs  # README: python -m fl_lightning.report sweeps/digits_grid ... --out reports/digits_grid
    for out in sorted(outs | {DEFAULT_OUT}):
        assert _ignored(f"{out}/report.md") and _ignored(f"{out}/x/report_curve.png"), out
    assert not _ignored("fl_lightning/report/new_module.py")
    assert not _ignored("tests/unit/report/test_new.py")
