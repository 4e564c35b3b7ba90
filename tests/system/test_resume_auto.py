"""``resume=auto``: the run's own directory is resumed if it holds a checkpoint, else the run starts fresh; the one
line a job script, a requeued job or a re-run sweep needs. The result equals a run that never stopped."""
from __future__ import annotations

import json

import pytest

from tests.helpers.cli import FAST, run_cli

pytestmark = pytest.mark.slow


def _rows(d):
    return [ln.split(",")[:8] for ln in (d / "metrics.csv").read_text().splitlines()]  # without the wall-clock columns


def test_auto_starts_fresh_then_resumes_then_leaves_a_finished_run_as_it_was(tmp_path):
    run, straight = tmp_path / "run", tmp_path / "straight"
    p = run_cli([*FAST, "resume=auto", f"hydra.run.dir={run}", "stop_after_rounds=2"])
    assert p.returncode == 0, p.stderr[-2000:]  # nothing to resume: a fresh run
    assert json.loads((run / "summary.json").read_text())["rounds_done"] == 2
    p = run_cli([*FAST, "resume=auto", f"hydra.run.dir={run}"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert run_cli([*FAST, f"hydra.run.dir={straight}"]).returncode == 0
    assert _rows(run) == _rows(straight)  # resumed from round 2: the run that never stopped
    p = run_cli([*FAST, "resume=auto", f"hydra.run.dir={run}"])  # finished: resumed at its end, nothing changes
    assert p.returncode == 0 and _rows(run) == _rows(straight)
    p = run_cli([*FAST, "resume=auto", f"hydra.run.dir={run}", "method.lr=0.3"])
    assert p.returncode == 2 and "resume: this config differs" in p.stderr and "method.lr" in p.stderr


def test_a_sweep_run_again_with_auto_resumes_its_jobs(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *FAST, "seed=0,1", "resume=auto", f"hydra.sweep.dir={sweep}"]
    assert run_cli([*args, "stop_after_rounds=1"]).returncode == 0
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir())
    assert [d.name for d in jobs] == [",".join(sorted(FAST[:4] + FAST[5:] + [f"seed={s}"])) for s in (0, 1)]
    assert all(json.loads((d / "summary.json").read_text())["rounds_done"] == 1 for d in jobs)
    p = run_cli(args)  # the same command again: each job continues in its own folder
    assert p.returncode == 0, p.stderr[-2000:]
    assert all(json.loads((d / "summary.json").read_text())["finished"] for d in jobs)
    assert sorted(d for d in sweep.iterdir() if d.is_dir()) == jobs
