"""fl_lightning/dist/slurm.py: which job ``scontrol requeue`` names, and one line (never a traceback) when it cannot run."""
from __future__ import annotations

import os

import pytest

from fl_lightning.dist.slurm import RequeueError, job_id, requeue


def _scontrol(tmp_path, body: str) -> dict:
    exe = tmp_path / "bin" / "scontrol"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return {"PATH": str(exe.parent)}


def test_job_id_names_the_array_task_else_the_job():
    assert job_id({}) is None
    assert job_id({"SLURM_JOB_ID": "4242"}) == "4242"
    assert job_id({"SLURM_JOB_ID": "4250", "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "7"}) == "4242_7"
    assert job_id({"SLURM_JOB_ID": "4250", "SLURM_ARRAY_JOB_ID": "4242"}) == "4250"


def test_requeue_calls_scontrol_with_the_job(tmp_path):
    calls = tmp_path / "calls"
    env = _scontrol(tmp_path, f'echo "$@" >> "{calls}"') | {"SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "7",
                                                            "SLURM_JOB_ID": "4250"}
    assert requeue(env) == "Slurm job 4242_7 requeued"
    assert calls.read_text() == "requeue 4242_7\n"


@pytest.mark.parametrize("body,needle", [
    ("echo 'scontrol: error: Invalid job id specified' >&2; exit 1", "exited 1 (scontrol: error: Invalid job id"),
    ("sleep 5", "gave no answer in 0.5 s"),
    (None, "scontrol is not on PATH"),
])
def test_requeue_failures_are_one_line(tmp_path, body, needle):
    env = _scontrol(tmp_path, body) if body else {"PATH": str(tmp_path)}
    with pytest.raises(RequeueError) as err:
        requeue(env | {"SLURM_JOB_ID": "4242"}, timeout=0.5)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("Slurm job 4242 was not requeued: ") and needle in msg, msg


def test_requeue_outside_slurm_is_refused(tmp_path):
    with pytest.raises(RequeueError, match="SLURM_JOB_ID is not set"):
        requeue({"PATH": os.environ.get("PATH", "")})


def test_trainer_requeue_changes_neither_the_config_hash_nor_a_sweep_folder_name():
    from omegaconf import OmegaConf

    from fl_lightning.config.schema import register
    from fl_lightning.config import config_hash
    from tests.helpers.cli import CONF, make_cfg

    assert config_hash(make_cfg(["trainer.requeue=false"], "r")) == config_hash(make_cfg([], "r"))
    register()  # conf/config.yaml's exclude_keys call its resolver
    hydra = OmegaConf.load(os.path.join(CONF, "config.yaml")).hydra
    assert "trainer.requeue" in hydra.job.config.override_dirname.exclude_keys
