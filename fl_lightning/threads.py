"""CPU threads that stay fast when the machine is shared. Torch-free.

Torch's CPU kernels run on OpenMP (libgomp). By default its idle threads spin at every barrier; when another
process keeps the cores busy, a spinning thread burns the time slice the thread it waits for needs, and the default
run on a busy 2-core machine took 6x (95 s against 16 s with one thread; docs/benchmarks.md). :func:`passive_wait`
makes idle OpenMP threads sleep instead (``OMP_WAIT_POLICY=PASSIVE``, read once when torch loads its OpenMP library:
call it before ``import torch``); :func:`auto_threads` is ``trainer.threads=auto``: the CPUs this process may use
(``os.sched_getaffinity``: a Slurm or container limit counts) shared by the processes of this node, and no more than
other processes leave idle when the run starts.
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


def others_running(samples: int = 5, interval: float = 0.01) -> int | None:
    """Tasks other processes keep runnable right now: the least of a few readings of ``/proc/loadavg``'s running
    count, less this process's own thread (None where there is no such file). An instantaneous count, unlike the
    load averages, which take a minute to see a job that just started."""
    import time

    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < samples:
            time.sleep(interval)
    return max(0, min(counts) - 1)


SMALL_MODEL = 1_000_000  # parameters below which one thread per process is fastest (the default digits CNN, 53k:
# 14.9 s with one thread, 19.6 s with two sleeping threads on an idle 2-core machine; docs/benchmarks.md)


def auto_threads(processes_per_node: int = 1, num_params: int | None = None) -> int:
    """``trainer.threads=auto``: ``OMP_NUM_THREADS`` when set; else the usable CPUs over the processes per node, and
    on a machine whose every CPU this process may use (no scheduler gave it a subset), no more than the CPUs other
    processes leave idle right now (at least one): a second thread on a core another job keeps busy made the default
    run 1.65x slower than one thread, even with sleeping idle threads (docs/benchmarks.md). A model of fewer than
    :data:`SMALL_MODEL` parameters (``num_params``, once it is built) gets one thread."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    if num_params is not None and num_params < SMALL_MODEL:  # too little work per op for a second thread to pay
        return 1
    cpus, ppn = usable_cpus(), max(1, int(processes_per_node))
    n = max(1, cpus // ppn)
    if cpus == (os.cpu_count() or cpus):  # a subset (taskset, Slurm, a cpuset) is this job's own: trust it
        busy = others_running()
        if busy is not None:
            n = max(1, min(n, (cpus - busy) // ppn))
    return n
