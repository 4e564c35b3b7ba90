"""A run's directory: the overrides it keeps (``overrides.yaml``), the config a resume composes from them (a
difference in a key that changes results is refused), the lock that keeps a second job out, the guard that keeps a
new run from mixing into an old one, and the command that resumes it."""
from __future__ import annotations

import fcntl
import logging
import os
import re
import shlex
import shutil
import sys

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ..config import result_diff
from ..errors import ConfigError, ResumeError

log = logging.getLogger("fl_lightning")
CONTROL = ("resume", "force_resume", "stop_after_rounds", "overwrite")  # how to run now, never carried over
OVERRIDES_FILE = "overrides.yaml"  # the run's own overrides (Hydra's .hydra/ copy is rewritten by every invocation)


# ---------------------------------------------------------------------------------------------- overrides
def task_overrides() -> list[str] | None:
    """The command line's config overrides (not hydra.*), or None outside a Hydra app."""
    try:
        return list(HydraConfig.get().overrides.task)
    except Exception:
        return None


def saved_overrides() -> list[str] | None:
    """What a run keeps in its ``overrides.yaml``: the command line's config overrides and its ``hydra.searchpath``
    (a method, model or dataset of the user's own configs must be found again by ``resume=DIR``), ``file://``
    folders made absolute so that the resume command works from any directory; None outside a Hydra app."""
    ov = task_overrides()
    if ov is None:
        return None
    for o in HydraConfig.get().overrides.hydra:
        if override_key(str(o)) == "hydra.searchpath":
            ov.append(absolute_searchpath(str(o)))
    return ov


def absolute_searchpath(override: str) -> str:
    """``hydra.searchpath=[file://rel/conf,pkg://x]`` with each relative ``file://`` folder made absolute."""
    key, _, val = override.partition("=")
    items = []
    for item in val.strip().strip("[]").split(","):
        item = item.strip().strip("'\"")
        if item.startswith("file://") and not os.path.isabs(item[len("file://"):]):
            item = "file://" + os.path.abspath(item[len("file://"):])
        if item:
            items.append(item if re.fullmatch(r"[\w/.:+@-]+", item) else "'" + item.replace("'", "\\'") + "'")
    return f"{key}=[{','.join(items)}]"


def in_sweep() -> bool:
    """Is this job one of a Hydra multirun (``-m``)?"""
    try:
        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:  # noqa: BLE001 - outside a Hydra app
        return False


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(saved: list[str], new: list[str]) -> list[str]:
    """The saved run's overrides with the new ones on top (a new ``key=...`` replaces the saved one); the control
    keys (resume, force_resume, stop_after_rounds, overwrite) are never carried over."""
    keys = {override_key(o) for o in new}
    return [o for o in saved if override_key(o) not in keys and override_key(o) not in CONTROL] + list(new)


def resume_config(cfg: DictConfig, run_dir: str, force: bool) -> DictConfig:
    """Check the config resuming ``run_dir`` (composed from the run's saved overrides with this command's on top,
    :func:`prepare`): a difference from the saved config in a key that changes results is refused with one line
    naming the keys, unless ``force_resume=true``."""
    from ..data.hub import inherit_source
    from ..precision import inherit

    saved_cfg = os.path.join(run_dir, "config.yaml")
    if os.path.exists(saved_cfg):
        saved = OmegaConf.load(saved_cfg)
        inherit(cfg, saved)  # ns_dtype: auto keeps the precision the run resolved when it started
        inherit_source(cfg, saved)  # a run saved before data.source existed: the reader it ran with
        diff = result_diff(saved, cfg)
        if diff and not force:
            shown = ", ".join(f"{k} ({a!r} -> {b!r})" for k, a, b in diff[:4])
            more = f" and {len(diff) - 4} more" if len(diff) > 4 else ""
            raise ResumeError(f"resume: this config differs from the one that wrote {run_dir} in {shown}{more}; drop "
                              "those overrides to continue the run as it was, or add force_resume=true")
    return cfg


# ---------------------------------------------------------------------------------------------- run directory
class RunDirLock:
    """An exclusive lock on ``<run_dir>/.lock`` for the life of the process: a second run on the same directory is
    refused with one line instead of silently mixing two runs' results."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, ".lock")
        self._f = open(self.path, "a+")
        try:
            fcntl.flock(self._f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._f.close()
            raise ConfigError("hydra.run.dir", f"{run_dir} is in use by another running job",
                              "wait for it to finish, or give this run its own hydra.run.dir=...") from None
        self._f.seek(0)
        self._f.truncate()
        self._f.write(f"{os.getpid()}\n")
        self._f.flush()


def guard_fresh_run(run_dir: str, overwrite: bool) -> None:
    """A new run (no ``resume=``) into a directory that already holds a run's checkpoints is refused, unless
    ``overwrite=true``, which removes that run's checkpoints, metrics, summary and logs first."""
    from ..checkpoint import list_checkpoints  # imports torch (2 s): only when resuming

    ckpts = list_checkpoints(os.path.join(run_dir, "checkpoints"))
    if not ckpts:
        return
    if not overwrite:
        raise ConfigError("hydra.run.dir", f"{run_dir} already holds a run (checkpoints up to "
                          f"{os.path.basename(ckpts[-1])})", f"continue it with resume={run_dir}, pick another "
                          "hydra.run.dir, or add overwrite=true to replace it")
    log.warning("overwrite=true: removing the earlier run's checkpoints, metrics and logs in %s", run_dir)
    for name in ("checkpoints", "logs"):
        shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
    for name in ("metrics.csv", "summary.json", OVERRIDES_FILE):
        if os.path.exists(os.path.join(run_dir, name)):
            os.remove(os.path.join(run_dir, name))


def resume_hint(run_dir: str, cfg: DictConfig | None = None) -> str:
    return f"  {resume_command(run_dir, cfg)}"


def resume_command(run_dir: str, cfg: DictConfig | None = None) -> str:
    """``python3 train.py resume=DIR``, after ``PYTHONPATH=...`` when a ``_target_`` of ``cfg`` was imported from a
    ``PYTHONPATH`` folder (a part, model or dataset of the user's own, outside the package: examples/fednova); the
    configs of a ``hydra.searchpath`` are found again from the run's ``overrides.yaml``. Paths absolute, so that the
    command works from any folder."""
    path = _user_pythonpath(cfg)
    return (f"{'PYTHONPATH=' + shlex.quote(path) + ' ' if path else ''}python3 train.py "
            f"resume={shlex.quote(os.path.abspath(run_dir))}")


def _user_pythonpath(cfg: DictConfig | None) -> str:
    """The ``PYTHONPATH`` entries (as the user wrote them) holding a module of the run's ``_target_`` nodes, other
    than this package; empty when there is none (or they came from site-packages)."""
    env = os.environ.get("PYTHONPATH", "")
    if not env or cfg is None:
        return ""
    targets: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            t = node.get("_target_")
            if isinstance(t, str):
                targets.add(t.split(".")[0])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    try:
        walk(OmegaConf.to_container(cfg, resolve=False))
    except Exception:  # noqa: BLE001 - a config that is not a container: no hint rather than no message
        return ""
    homes = set()  # the folder each top-level module was imported from (a package's parent folder)
    for m in targets - {__package__.split(".")[0]}:
        f = getattr(sys.modules.get(m), "__file__", None)
        if f:
            f = os.path.dirname(os.path.abspath(f))
            homes.add(os.path.dirname(f) if hasattr(sys.modules[m], "__path__") else f)
    return os.pathsep.join(os.path.abspath(e) for e in env.split(os.pathsep) if e and os.path.abspath(e) in homes)
