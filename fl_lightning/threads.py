"""CPU threads that stay fast when the machine is shared. Torch-free.

Torch's CPU kernels run on OpenMP (libgomp). By default its idle threads spin at every barrier; when another
process keeps the cores busy, a spinning thread burns the time slice the thread it waits for needs, and the default
run on a busy 2-core machine took 6x (95 s against 16 s with one thread; docs/benchmarks.md). :func:`passive_wait`
makes idle OpenMP threads sleep instead (``OMP_WAIT_POLICY=PASSIVE``, read once when torch loads its OpenMP library:
call it before ``import torch``); :func:`auto_threads` is ``trainer.threads=auto``: the CPUs this process may use
(``os.sched_getaffinity``: a Slurm or container limit counts) shared by the processes of this node.
"""
from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("fl_lightning")


def passive_wait() -> bool:
    """``OMP_WAIT_POLICY=PASSIVE`` unless the user set a policy; True if it can still take effect (torch, and with it
    libgomp, not loaded yet)."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "torch" not in sys.modules


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: taskset, cgroups cpusets, Slurm's --cpus-per-task)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def auto_threads(processes_per_node: int = 1) -> int:
    """``trainer.threads=auto``: ``OMP_NUM_THREADS`` when set, else the usable CPUs over the processes per node."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, usable_cpus() // max(1, int(processes_per_node)))
