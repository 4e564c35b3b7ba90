"""The private APIs of torch and Lightning this package relies on, each in one place (tests/unit/test_compat.py
fails loudly, naming the installed versions, when one of them moves). Written for torch 2.14 and lightning 2.6."""
from __future__ import annotations

import torch
from torch import Tensor

_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)  # no public way to ask whether a storage is shared


def storage_use_count(t: Tensor) -> int | None:
    """How many references hold ``t``'s storage (views and tensors sharing it, plus this probe's), or None when this
    torch does not say (callers then assume it is shared)."""
    return None if _USE_COUNT is None else int(_USE_COUNT(t.untyped_storage()._cdata))


# Lightning's launcher that starts processes from a function (ddp_spawn, ddp_fork, ddp_notebook); matched by name so
# that importing it (a private module) is not needed
FUNCTION_LAUNCHER = "_MultiProcessingLauncher"


def starts_processes_from_a_function(launcher) -> bool:
    """Does Fabric's ``launcher`` start its processes from a function (not by re-running the script)?"""
    return launcher is not None and any(c.__name__ == FUNCTION_LAUNCHER for c in type(launcher).__mro__)


def set_collective_timeout(strategy, seconds: float) -> bool:
    """Fabric's DDP / FSDP strategies pass ``_timeout`` to ``init_process_group`` (the rendezvous and every collective;
    torch's default is 30 minutes); the constructor takes it, but Fabric builds the strategy from a name. False if
    this strategy has none (one process)."""
    from datetime import timedelta

    if not hasattr(strategy, "_timeout"):
        return False
    strategy._timeout = timedelta(seconds=float(seconds))
    return True


def default_store():
    """The default process group's rendezvous store (torch has no public accessor)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


OBSERVER_THREAD = "child-process-observer"  # the thread name of Lightning's _ChildProcessObserver


def silence_child_observer() -> bool:
    """Lightning's launcher watches the ranks it started in a thread that, when one dies, SIGKILLs every process
    (this one too) without a word; make its next poll end it instead (fl_lightning.peers watches in its place).
    False if no such thread runs."""
    import threading

    observer = next((t for t in threading.enumerate() if t.name == OBSERVER_THREAD), None)
    if observer is None or not hasattr(observer, "_run"):
        return False
    observer._run = lambda: True  # its loop: ``while not finished: sleep; finished = self._run()``
    return True
