"""Slurm preemption through the CLI, under a fake Slurm (``SLURM_JOB_ID`` set and a ``scontrol`` on PATH that records
its arguments): SIGUSR1 finishes the round, checkpoints, requeues the job and exits 128 + SIGUSR1 with one line; the
requeued job (the same command, ``resume=auto``) ends equal to a run that never stopped. SIGTERM (scancel) never
requeues, nor SIGUSR1 with ``trainer.requeue=false``."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.cli import ROOT, metric_rows, run_cli

pytestmark = pytest.mark.slow

# rounds of a few seconds: the signal lands in round 2 (after round 1's checkpoint), well before the last round
LONG = ["fl.num_clients=6", "fl.clients_per_round=3", "fl.rounds=4", "fl.local_steps=200", "trainer.progress=false",
        "trainer.accelerator=cpu"]
# many short rounds: any moment after round 1's checkpoint is mid-run
SHORT = ["fl.num_clients=6", "fl.clients_per_round=3", "fl.rounds=100000", "fl.local_steps=3",
         "trainer.progress=false", "trainer.accelerator=cpu"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment of a fake Slurm job 4242 (not under srun: no ``SLURM_NTASKS``) and the file its ``scontrol``
    appends its arguments to."""
    d = tmp_path_factory.mktemp("fake_slurm")
    calls = d / "scontrol_calls"
    exe = d / "bin" / "scontrol"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n')
    exe.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "HYDRA_FULL_ERROR"}
    env.update(SLURM_JOB_ID="4242", PATH=f"{exe.parent}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1")
    return env, calls


def _signalled(args: list[str], run, env: dict, signum: int) -> tuple[int, str]:
    """``train.py *args`` stopped by ``signum`` once round 1's checkpoint is in place: (exit code, stderr)."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args, f"hydra.run.dir={run}"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while not (run / "checkpoints" / "round_000001").is_dir() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    return proc.returncode, err


def test_sigusr1_checkpoints_requeues_and_the_requeued_job_ends_as_a_straight_run(slurm, tmp_path):
    env, calls = slurm
    run, straight = tmp_path / "run", tmp_path / "straight"
    code, err = _signalled([*LONG, "resume=auto"], run, env, signal.SIGUSR1)
    assert code == 128 + signal.SIGUSR1, err[-2000:]
    assert "Traceback" not in err, err
    assert calls.read_text().split("\n")[:-1] == ["requeue 4242"]
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped after round ") and "Slurm job 4242 requeued" in last and "resume=auto" in last, last
    assert 2 <= len(metric_rows(run)) < 4  # stopped after the round the signal landed in, before the last one
    p = run_cli([*LONG, "resume=auto", f"hydra.run.dir={run}"], env=env)  # the requeued job: the same command
    assert p.returncode == 0, p.stderr[-2000:]
    p = run_cli([*LONG, f"hydra.run.dir={straight}"], env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert metric_rows(run) == metric_rows(straight)
    assert calls.read_text().split("\n")[:-1] == ["requeue 4242"]  # runs that end normally requeue nothing


@pytest.mark.parametrize("signum,extra", [(signal.SIGTERM, []), (signal.SIGUSR1, ["trainer.requeue=false"])],
                         ids=["sigterm", "requeue_false"])
def test_sigterm_and_requeue_false_stop_without_requeueing(slurm, tmp_path, signum, extra):
    env, calls = slurm
    before = calls.read_text() if calls.exists() else ""
    code, err = _signalled([*SHORT, *extra, "resume=auto"], tmp_path / "run", env, signum)
    assert code == 128 + signum, err[-2000:]
    assert "Traceback" not in err and "Slurm job" not in err, err
    assert "checkpoint saved. Resume with:" in err and f"resume={tmp_path / 'run'}" in err
    assert (calls.read_text() if calls.exists() else "") == before  # scontrol was not called
