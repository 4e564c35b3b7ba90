"""Slurm: requeue the job this process runs in, after a SIGUSR1 stop wrote its checkpoint (``trainer.requeue``).

Slurm sends SIGUSR1 ahead of the time limit when the job script asks for it (``#SBATCH --signal=USR1@120``); the loop
checkpoints after the round and stops, and global rank 0 calls :func:`requeue`, so the job runs again and, with
``resume=auto`` in its command, continues from that checkpoint. Torch-free.
"""
from __future__ import annotations

import os
import shutil
import subprocess

from ..errors import FLError


class RequeueError(FLError):
    """The job could not be requeued (no Slurm job, ``scontrol`` missing, failed or silent); ``str``: why, one line."""


def job_id(env=os.environ) -> str | None:
    """The job to requeue: ``<array job>_<task>`` for a task of a job array, else ``SLURM_JOB_ID``; None outside
    Slurm."""
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID") or None


def requeue(env=os.environ, timeout: float = 60.0) -> str:
    """``scontrol requeue <job>``; returns the tail of the stop line (``Slurm job 4242 requeued``) or raises
    :class:`RequeueError` naming what went wrong."""
    job = job_id(env)
    if job is None:
        raise RequeueError("not a Slurm job (SLURM_JOB_ID is not set)")
    exe = shutil.which("scontrol", path=env.get("PATH"))
    if exe is None:
        raise RequeueError(f"Slurm job {job} was not requeued: scontrol is not on PATH")
    try:
        p = subprocess.run([exe, "requeue", job], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RequeueError(f"Slurm job {job} was not requeued: scontrol requeue gave no answer in {timeout:g} s"
                           ) from None
    except OSError as err:
        why = err.strerror or err
        raise RequeueError(f"Slurm job {job} was not requeued: scontrol could not run ({why})") from None
    if p.returncode != 0:
        why = " ".join((p.stderr or p.stdout or "").split())[:300]
        raise RequeueError(f"Slurm job {job} was not requeued: scontrol requeue exited {p.returncode}"
                           + (f" ({why})" if why else ""))
    return f"Slurm job {job} requeued"
