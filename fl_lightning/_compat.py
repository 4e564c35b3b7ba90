"""The private APIs of torch and Lightning this package relies on, each in one place (tests/unit/test_compat.py
fails loudly, naming the installed versions, when one of them moves). Written for torch 2.14 and lightning 2.6."""
from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

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
    (this one too) without a word; make its next poll end it instead (fl_lightning.dist.peers watches in its place).
    False if no such thread runs."""
    import threading

    observer = next((t for t in threading.enumerate() if t.name == OBSERVER_THREAD), None)
    if observer is None or not hasattr(observer, "_run"):
        return False
    observer._run = lambda: True  # its loop: ``while not finished: sleep; finished = self._run()``
    return True


# ``lightning/__init__.py`` (lightning 2.6) imports lightning.fabric and lightning.pytorch (Trainer, LightningModule,
# callbacks), whose import loads all of torchmetrics and through it transformers, matplotlib, scipy and torchvision's
# detection ops: seconds of start-up that a run on Fabric alone does not use. :func:`import_fabric` imports
# lightning.fabric under a ``lightning`` package that provides these names when first asked for instead.
LIGHTNING_NAMES = {"Fabric": "lightning.fabric.fabric", "seed_everything": "lightning.fabric.utilities.seed",
                   "Callback": "lightning.pytorch.callbacks", "LightningDataModule": "lightning.pytorch.core",
                   "LightningModule": "lightning.pytorch.core", "Trainer": "lightning.pytorch.trainer"}
_FLAG = "_TORCHMETRICS_GREATER_EQUAL_1_0_0"  # lightning.fabric.utilities.imports: compare_version imports torchmetrics


def lazy_lightning() -> bool:
    """Put a ``lightning`` package in ``sys.modules`` that does what lightning/__init__.py does (the ``lightning``
    logger, ``__version__`` and the ``__about__`` names) except its imports: ``lightning.<name>`` of
    :data:`LIGHTNING_NAMES` (lightning/__init__.py's ``__all__``; tests/unit/test_compat.py checks that they are the
    same) imports the module that defines it when first asked for. Submodules (``lightning.fabric``,
    ``lightning.pytorch``, ...) import as usual. False if ``lightning`` was imported already (nothing to do)."""
    if "lightning" in sys.modules:
        return False
    spec = importlib.util.find_spec("lightning")
    pkg = importlib.util.module_from_spec(spec)
    log = logging.getLogger("lightning")  # as lightning/__init__.py sets it up
    log.setLevel(logging.INFO)
    handler = logging.StreamHandler()
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    log.addHandler(handler)
    sys.modules["lightning"] = pkg
    try:
        about = importlib.import_module("lightning.__about__")
        pkg.__dict__.update({k: getattr(about, k) for k in getattr(about, "__all__", ())})
        pkg.__version__ = importlib.import_module("lightning.__version__").version
    except BaseException:
        del sys.modules["lightning"]
        log.removeHandler(handler)
        raise

    def __getattr__(name: str):
        if name in LIGHTNING_NAMES:
            value = getattr(importlib.import_module(LIGHTNING_NAMES[name]), name)
            setattr(pkg, name, value)
            return value
        if f"lightning.{name}" in sys.modules:  # a submodule being imported (``import lightning.fabric as f`` in it)
            return sys.modules[f"lightning.{name}"]
        raise AttributeError(f"module 'lightning' has no attribute {name!r}")

    pkg.__getattr__ = __getattr__
    return True


def import_fabric():
    """``lightning.fabric`` (the module), imported without lightning.pytorch and without torchmetrics: under
    :func:`lazy_lightning`'s package, and with torchmetrics hidden while lightning.fabric.utilities.imports asks
    for its version (``compare_version`` imports the package to read it; its only user is SpikeDetection). The
    answer is then put back as the installed metadata gives it (a ``RequirementCache``, true or false as
    ``compare_version`` would have said), in that module and in any module that copied it."""
    if "lightning.fabric" in sys.modules:
        return sys.modules["lightning.fabric"]
    lazy_lightning()
    hide = "torchmetrics" not in sys.modules
    if hide:
        sys.modules["torchmetrics"] = None  # an import of it raises ImportError, which compare_version answers False
    try:
        fabric = importlib.import_module("lightning.fabric")
    finally:
        if hide and sys.modules.get("torchmetrics", 0) is None:
            del sys.modules["torchmetrics"]
    if hide:
        from lightning_utilities.core.imports import RequirementCache

        answer = RequirementCache("torchmetrics>=1.0.0")
        for name, mod in list(sys.modules.items()):
            if name.startswith("lightning.") and getattr(mod, _FLAG, None) is False:
                setattr(mod, _FLAG, answer)
    return fabric
