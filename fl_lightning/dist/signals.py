"""SIGINT / SIGTERM / SIGUSR1 before a round of this invocation is done: the process ends at once, with one line.

While Python imports, Hydra composes, the run is built or restored and the first round runs, nothing is worth a
checkpoint, and an exception raised from a signal handler can land anywhere (inside an extension module's import it
becomes an unrelated error): :func:`during_setup` installs handlers that pass the signal on to the ranks this process
launched, print one line and leave with ``os._exit`` (the exit code ``128 + signal``). Once a round is done the loop's
own handler takes over (finish the round, checkpoint, stop: ``FederatedLoop.run``). Torch-free.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)  # SIGUSR1: Slurm's warning ahead of the time limit
LAUNCHERS: list = []  # Lightning launchers of this process (their ``procs`` are the ranks it started)
_STATE = {"phase": "starting", "resume": None}


def set_phase(phase: str, resume: str | None = None) -> None:
    """What the process is doing (the line a signal prints says so); ``resume``: the run directory being resumed."""
    _STATE["phase"] = phase
    if resume is not None:
        _STATE["resume"] = resume


_RANK_VARS = ("LOCAL_RANK", "NODE_RANK", "RANK", "GROUP_RANK", "SLURM_PROCID")


def is_launched_child() -> bool:
    """A process of rank > 0, however it was started: Lightning's launcher (``LOCAL_RANK``, ``NODE_RANK``), torchrun
    (``RANK``, and ``GROUP_RANK`` for a node after the first), srun (``SLURM_PROCID``). Only global rank 0 owns the
    run directory (its lock, the fresh-run guard, the one line on a stop)."""
    return any(int(os.environ.get(v, 0) or 0) > 0 for v in _RANK_VARS)


def launched_children() -> list:
    """The rank processes this process's Fabric launchers started (``subprocess.Popen``), still running."""
    return [p for la in LAUNCHERS for p in getattr(la, "procs", []) if p.poll() is None]


def tell_children(signum: int, wait_s: float = 30.0) -> None:
    """Pass a signal on to the ranks this process started (a signal reaches the launcher only) and wait for them, so
    no rank is left waiting in a collective; one still running after ``wait_s`` is killed."""
    procs = launched_children()
    for p in procs:
        p.send_signal(signum)
    deadline = time.time() + wait_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.time()))
        except Exception:
            p.kill()


def stop_now(signum: int, frame=None) -> None:
    """End the process at once: one line on stderr (rank 0 only; first, before a child's exit can make Lightning's
    process observer kill this process), children told and waited for, exit ``128 + signum``. A launched child exits
    0: its launcher reports the stop, and a non-zero child would make that observer kill the launcher."""
    child = is_launched_child()
    if not child:
        resume = _STATE["resume"]
        hint = f" (resume again with: python3 train.py resume={resume})" if resume else ""
        msg = f"error: stopped by signal {signum} while {_STATE['phase']}; this invocation wrote no checkpoint{hint}\n"
        try:
            if sys.stderr.isatty():
                msg = "\x1b[?25h\n" + msg  # a progress bar may have hidden the cursor
            sys.stderr.flush()
            os.write(2, msg.encode())
        except Exception:
            pass
    tell_children(signum)
    os._exit(0 if child else 128 + signum)


def install() -> dict:
    """:func:`stop_now` for :data:`SIGNALS`; returns the handlers replaced (none outside the main thread)."""
    old = {}
    try:
        for s in SIGNALS:
            old[s] = signal.signal(s, stop_now)
    except ValueError:  # not the main thread: no signal handling
        pass
    return old


def ignore() -> None:
    """:data:`SIGNALS` ignored from now on (the last steps of a stop: ``scontrol requeue`` signals the job it
    requeues, which must not cut the line that says so)."""
    try:
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


def restore(old: dict) -> None:
    for s, h in old.items():
        signal.signal(s, h)


@contextlib.contextmanager
def during_setup(phase: str):
    """:func:`install` while the block runs (set-up: a signal ends the process at once), then the old handlers."""
    set_phase(phase)
    old = install()
    try:
        yield
    finally:
        restore(old)


def interruptible(fn):
    """``fn()`` in a helper thread while this (main) thread waits, so a signal's handler runs at once: Python runs a
    handler only between bytecodes of the main thread, and the process group's rendezvous blocks in C++ until a
    peer comes or its timeout passes (a SIGTERM to a rank waiting for a node that never starts was ignored for 30
    minutes). ``fn``'s exception is raised here."""
    import threading

    out: list = []

    def call():
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 (re-raised in the caller's thread)
            out.append(err)

    t = threading.Thread(target=call, name="fl-launch", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.1)
    if out:
        raise out[0]
