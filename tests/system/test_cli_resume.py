"""Exact resume through the CLI (invariant 2), refusal on a changed config, and SIGTERM checkpointing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.cli import ROOT, metric_rows, run_cli, saved_model, without_logs

pytestmark = pytest.mark.slow

BASE = ["fl.num_clients=6", "fl.clients_per_round=3", "fl.local_steps=3", "trainer.progress=false",
        "trainer.accelerator=cpu", "method.momentum=0.9", "method.parts.local_optimizer.state=persistent"]


rows = metric_rows


def final_model(run_dir, r=6):
    return saved_model(run_dir, r)


def assert_same_model(a, b):
    ma, mb = final_model(a), final_model(b)
    assert ma.keys() == mb.keys()
    for k in ma:
        assert (ma[k] == mb[k]).all(), k  # bit-identical


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    d = tmp_path_factory.mktemp("straight")
    p = run_cli(BASE + ["fl.rounds=6", f"hydra.run.dir={d}"])
    assert p.returncode == 0, p.stderr
    return d


def test_stop_after_rounds_then_resume_is_bit_identical(straight, tmp_path):
    d = tmp_path / "chunked"
    p = run_cli(BASE + ["fl.rounds=6", "stop_after_rounds=3", f"hydra.run.dir={d}"])
    assert p.returncode == 0, p.stderr
    assert len(rows(d)) == 3
    p = run_cli(BASE + ["fl.rounds=6", f"resume={d}", f"hydra.run.dir={tmp_path / 'h'}"])
    assert p.returncode == 0, p.stderr
    assert rows(d) == rows(straight)
    assert_same_model(d, straight)
    for f in ("summary.json", "config.yaml"):
        assert (d / f).exists()


def test_three_rounds_then_resume_to_six(straight, tmp_path):
    d = tmp_path / "short"
    assert run_cli(BASE + ["fl.rounds=3", f"hydra.run.dir={d}"]).returncode == 0
    p = run_cli(BASE + ["fl.rounds=6", f"resume={d}", f"hydra.run.dir={tmp_path / 'h'}"])
    assert p.returncode == 0, p.stderr
    assert rows(d) == rows(straight)
    assert_same_model(d, straight)


def test_resume_with_result_changing_config_is_refused(straight, tmp_path):
    p = run_cli(BASE + ["fl.rounds=8", "method.lr=0.2", f"resume={straight}", f"hydra.run.dir={tmp_path / 'h'}"])
    assert p.returncode != 0
    lines = without_logs(p.stderr).strip().splitlines()  # log records: stderr's too
    assert len(lines) == 1 and "force_resume=true" in lines[0] and "Traceback" not in p.stderr
    p = run_cli(BASE + ["fl.rounds=7", "method.lr=0.2", f"resume={straight}", "force_resume=true", f"hydra.run.dir={tmp_path / 'h2'}"])
    assert p.returncode == 0, p.stderr
    assert len(rows(straight)) == 7


def test_sigterm_checkpoints_and_says_how_to_resume(tmp_path):
    d = tmp_path / "sig"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *BASE, "fl.rounds=100000",
                             "checkpoint.every=1000000", f"hydra.run.dir={d}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (d / "metrics.csv").exists() and time.time() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "resume=" in err and "Traceback" not in err
    ckpts = sorted((d / "checkpoints").glob("round_*"))
    assert ckpts and not list((d / "checkpoints").glob("*.tmp"))
    # the checkpoint resumes
    done = len(rows(d))
    p = run_cli(BASE + [f"fl.rounds={done + 1}", f"resume={d}", f"hydra.run.dir={tmp_path / 'h'}"])
    assert p.returncode == 0, p.stderr
    assert len(rows(d)) == done + 1


def test_resume_accepts_a_key_only_the_resumed_runs_config_has(tmp_path):
    """``method.mu`` exists in ``method=fedprox`` (the resumed run's) but not in the default config: the saved
    overrides are composed first, so giving it (unchanged) on resume is accepted and the run continues."""
    d = tmp_path / "run"
    fast = ["fl.num_clients=4", "fl.clients_per_round=2", "fl.local_steps=2", "trainer.progress=false",
            "trainer.accelerator=cpu"]
    p = run_cli(fast + ["method=fedprox", "fl.rounds=3", "stop_after_rounds=1", f"hydra.run.dir={d}"])
    assert p.returncode == 0, p.stderr
    p = run_cli([f"resume={d}", "method.mu=0.01", "trainer.progress=false"])
    assert p.returncode == 0, p.stderr
    assert [r["round"] for r in rows(d)] == ["1", "2", "3"]
