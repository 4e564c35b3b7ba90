"""Issue 65, items 9, 10 and 13, as a user meets them: ``python3 train.py > run.txt`` keeps the result (the summary
table on stdout) while the log records and the round lines go to stderr, with no line about ``trainer.cohort=auto``
on a CPU; ``--rounds 3`` is one line naming ``fl.rounds=3``; a run resumed by a relative path keeps an absolute
``run_dir`` in summary.json."""
from __future__ import annotations

import json
import os

import pytest

from tests.helpers.cli import FAST, cli_in_process, run_cli


@pytest.mark.slow
def test_the_summary_goes_to_stdout_and_the_logs_and_progress_to_stderr(tmp_path):
    d = tmp_path / "run"
    shrunk = [a for a in FAST if not a.startswith(("fl.rounds", "trainer.progress"))] + ["fl.rounds=2"]
    p = run_cli(shrunk + [f"hydra.run.dir={d}"])  # stdout and stderr captured apart, neither a terminal
    assert p.returncode == 0, p.stderr[-2000:]
    assert "rounds_done" in p.stdout and "final_test_acc" in p.stdout and str(d) in p.stdout, p.stdout
    assert "[INFO]" not in p.stdout and "round 1/2" not in p.stdout, p.stdout
    assert "[fl_lightning][INFO] - data digits" in p.stderr and "round 2/2  loss" in p.stderr, p.stderr
    assert "rounds_done" not in p.stderr, p.stderr
    assert "trainer.cohort=auto" not in p.stdout + p.stderr  # nothing chosen on a CPU: no INFO line
    assert "data digits" in (d / "train.log").read_text()  # the log file keeps the records

    bad = run_cli(["--rounds", "3"])
    assert bad.returncode == 2 and bad.stdout == "", (bad.stdout, bad.stderr)
    assert bad.stderr.strip() == "error: unknown option --rounds; keys are set as key=value: fl.rounds=3", bad.stderr


@pytest.mark.slow
def test_a_run_resumed_by_a_relative_path_keeps_an_absolute_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = cli_in_process(FAST + ["stop_after_rounds=2", "hydra.run.dir=run"], tmp_path / "run")
    assert code == 0, err
    code, err = cli_in_process(FAST + ["resume=run"], tmp_path / "elsewhere")
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_done"] == 4 and summary["run_dir"] == os.path.join(str(tmp_path), "run"), summary
