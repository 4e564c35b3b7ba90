"""The command line behind ``train.py``: group-name checks before Hydra, one-line errors, and a run's life: start,
stop and resume from the directory alone (:mod:`fl_lightning.run.run_dir`: the saved overrides re-composed, new ones on
top, differences in result-relevant keys named; the directory's lock and guard)."""
from __future__ import annotations

import errno
import logging
import os
import signal
import sys

from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..dist import peers, signals, slurm
from ..errors import FLError, NonFiniteLossError, StopRequested
from ..progress import _stream_handlers, set_enabled
from .run_dir import (CONTROL, OVERRIDES_FILE, RunDirLock, in_sweep, override_key, resume_hint, saved_overrides, task_overrides,
                      guard_fresh_run, merge_overrides, resume_command, resume_config)
from ..config import check_run, check_value, register
from .argv import (GROUPS, _to_log_file, check_groups, check_options, composition_error, fail,  # noqa: F401
                   option_key, prepare, user_full_error)  # the command line's checks, used through this module too

register()  # the schema (conf/config.yaml's first default) before Hydra composes

log = logging.getLogger("fl_lightning")
_HELD_LOCKS: list = []

OmegaConf.register_new_resolver(
    "fl_run_dir", lambda resume, default: str(default if resume in (None, "", "auto") else resume), replace=True)


def main(hydra_main, argv: list[str], conf_dir: str) -> None:
    """``train.py``'s body: :func:`prepare`, then the Hydra app; a config that does not compose is one line, exit 2."""
    try:
        with signals.during_setup("composing the config"):
            argv = prepare(argv, conf_dir)
            sys.argv[1:] = argv
            os.environ.setdefault("FL_HYDRA_FULL_ERROR", "1" if user_full_error() else "0")
            os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing; we print one line
            hydra_main()
    except Exception as err:
        if user_full_error() or not isinstance(err, (HydraException, OmegaConfBaseException)):
            raise
        fail(composition_error(err, argv, conf_dir))


def flag(cfg: DictConfig, key: str, default: bool = False) -> bool:
    """A boolean setting, strictly: true/false (``force_resume=no`` is an error, not a yes)."""
    v = OmegaConf.select(cfg, key, default=None)
    if v is None:
        return default
    check_value(key, v)
    return bool(v)


def _say_where(summary: dict, run_dir: str, progress: bool, cfg: DictConfig | None = None) -> None:
    """Where the run is (the progress bar's table says it on a terminal) and, when ``stop_after_rounds`` ended it
    before ``fl.rounds``, how to go on."""
    if not progress:
        p = summary.get("primary_metric", "test_acc")
        fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
        print(f"{summary.get('method')}: {summary.get('rounds_done')} of {summary.get('rounds')} rounds, final {p} "
              f"{fmt(summary.get(f'final_{p}'))} (best {fmt(summary.get(f'best_{p}'))}); run directory {run_dir}",
              flush=True)
    if not summary.get("finished", True):  # stop_after_rounds, or the privacy budget (dp.max_epsilon) before it
        why = " or ".join(k for k in ("stop_after_rounds", "dp.max_epsilon")
                          if cfg is not None and OmegaConf.select(cfg, k) is not None) or "stop_after_rounds"
        print(f"stopped after round {summary.get('rounds_done')} ({why}); checkpoint saved. Resume with:\n"
              f"{resume_hint(run_dir, cfg)}", file=sys.stderr, flush=True)


def _requeue_line(cfg: DictConfig, stop: StopRequested, run_dir: str, asked: str | None) -> str | None:
    """After a SIGUSR1 stop under Slurm with ``trainer.requeue`` (default): requeue the job (rank 0) and return the one
    line that says so, or why not; None outside Slurm or with ``trainer.requeue=false`` (the plain stop line)."""
    if slurm.job_id() is None or not flag(cfg, "trainer.requeue", default=True):
        return None
    signals.ignore()  # scontrol requeue signals this job: the line below must not be cut
    head = f"stopped after round {stop.round_done}; checkpoint saved; "
    manual = resume_command(run_dir, cfg)
    try:
        done = slurm.requeue()
    except slurm.RequeueError as err:
        return f"{head}{err}; resume with: {manual}"
    if asked in (None, ""):
        return (f"{head}{done}, but its command has no resume=auto: add it to the job script, or it starts over "
                f"(or: {manual})")
    return f"{head}{done}: it resumes by itself with resume={asked} (or: {manual})"


_DISK_ERRORS = {"ENOSPC": "the disk is full", "EDQUOT": "the disk quota is exceeded", "EACCES": "permission denied",
                "EPERM": "permission denied", "EROFS": "the file system is read-only"}


def _disk_message(err: OSError, run_dir: str, loop, cfg: DictConfig | None = None) -> str | None:
    """One line for an output failure (disk full, read-only, forbidden), or None for any other OSError."""
    what = {getattr(errno, k): v for k, v in _DISK_ERRORS.items() if hasattr(errno, k)}.get(err.errno)
    if what is None:
        return None
    last = getattr(getattr(loop, "checkpointer", None), "last", None)
    where = f" at {err.filename}" if err.filename else ""
    kept = (f"; the last complete checkpoint is {last} (resume with: {resume_command(run_dir, cfg)})" if last
            else "")
    return f"{what}{where}{kept}; fix: free space, or choose a writable hydra.run.dir / store.offload_dir"


def _lost_peer(err: BaseException, cfg: DictConfig) -> None:
    """One line naming the rank that is gone (:mod:`fl_lightning.dist.peers`), then ``os._exit(1)``: nothing of the broken
    process group is torn down (its threads could abort the process with a second message); the checkpoints written
    are complete (each renamed into place), and a non-zero exit lets torchrun's ``--max-restarts`` start again."""
    dist = sys.modules["torch.distributed"]
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0) or 0)
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1) or 1)
    peers.ENDING.set()  # before the heartbeat check: a launched rank's exit is this loss, not news
    msg = peers.lost_peer_message(err, rank, world, float(cfg.trainer.timeout_s))
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(2, f"error: {msg}\n".encode())
    finally:
        os._exit(1)


def _resume_dir(cfg: DictConfig) -> str | None:
    """``resume``: null (or empty) for a fresh run, else a directory, even one whose name reads as a number;
    ``auto``: the run's own directory (``hydra.run.dir``, a sweep job's folder) if it holds a checkpoint, else a fresh
    run: the one line a job script, a requeued Slurm job or a re-run sweep needs."""
    r = cfg.get("resume")
    if r == "auto":
        from ..checkpoint import list_checkpoints  # imports torch (2 s): only for resume=auto, after the checks

        run_dir = str(cfg.run_dir)
        return run_dir if list_checkpoints(os.path.join(run_dir, "checkpoints")) else None
    return None if r is None or r == "" else str(r)


# ---------------------------------------------------------------------------------------------- run
def task(cfg: DictConfig) -> float:
    """``train.py``'s Hydra task: :func:`run`, returning the final value of ``objective`` (default: the primary
    metric) for a sweeper that searches (Optuna); NaN for a run that diverged in a sweep (a failed trial)."""
    logs_to_stderr()
    summary = run(cfg) or {}
    name = cfg.get("objective") or summary.get("primary_metric")
    value = summary.get("final" if name == summary.get("primary_metric") else f"final_{name}")
    if summary and value is None and name is not None and not summary.get("error"):
        fail(f"config error: objective: the run logged no {name!r}; fix: name a metrics.csv column (val_* needs "
             "data.val_fraction > 0)")
    return float("nan") if value is None else float(value)


def logs_to_stderr() -> None:
    """The log records on stderr, with the progress: Hydra's console handler (its default ``job_logging``) writes
    them to stdout, which holds the run's result (the summary), so that ``python3 train.py > run.txt`` keeps the
    result and the terminal the rest. Run by each job, once Hydra has configured its logging."""
    outs = {id(sys.stdout), id(sys.__stdout__)}
    for h in _stream_handlers():
        if id(h.stream) in outs:
            h.setStream(sys.stderr)


def run(cfg: DictConfig) -> dict | None:
    """Build and run one job; user errors become one line on stderr and a non-zero exit."""
    with signals.during_setup("building the run"):  # the loop takes the signals over after its first round
        resume = _resume_dir(cfg)
        signals.set_phase("building the run", resume)
        try:
            return _run(cfg, resume)
        finally:
            set_enabled(True)  # trainer.progress is this run's (a process running several, like the tests, resets)
            leave_process_group()


def leave_process_group() -> None:
    """Destroy the process group while the interpreter is still whole: gloo's worker threads left for interpreter
    shutdown can abort a process whose run succeeded ("terminate called without an active exception", SIGABRT;
    pytorch/pytorch#190489). Each job of a sweep forms its own group."""
    peers.stop_heartbeat()
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        dist.destroy_process_group()
    except Exception:  # a peer already gone: nothing left to tidy
        pass


def _run(cfg: DictConfig, resume: str | None) -> dict | None:
    full = user_full_error()
    run_dir = os.path.abspath(resume) if resume else str(cfg.run_dir)  # absolute in every message and summary.json
    child = signals.is_launched_child()
    asked = cfg.get("resume")  # as typed (auto, a directory or none): what a requeued job's command will do
    loop = None
    try:
        check_run(cfg, task_overrides())  # the config's one check: schema keys and rules torch-free first, then targets
        from .build import build  # imports torch (2 s): after the check, so a bad key fails in a moment
        force = flag(cfg, "force_resume")
        if resume:
            cfg = resume_config(cfg, run_dir, force)
        os.makedirs(run_dir, exist_ok=True)
        if not child:
            _HELD_LOCKS.append(RunDirLock(run_dir))  # held until the process exits
            if not resume:
                guard_fresh_run(run_dir, flag(cfg, "overwrite"))
        set_enabled(flag(cfg, "trainer.progress", default=True))  # also for what runs before the loop (pre-training)
        peers.set_run(run_dir, lambda: loop and loop.checkpointer.newest(), lambda: loop and loop.round + 1)
        loop = build(cfg, run_dir, checked=True, resume=resume)  # check_run ran above (a resumed config is composed
                                                                   # from the run's saved overrides: the same check)
        signals.set_phase("restoring the checkpoint" if resume else "setting up the strategy")
        loop.setup(resume=resume, force=force)
        if loop.rank == 0:  # only once the run is accepted: a refused resume leaves the saved config alone
            OmegaConf.save(cfg, os.path.join(run_dir, "config.yaml"), resolve=True)
            ov = saved_overrides()
            if ov is not None:
                saved = os.path.join(run_dir, OVERRIDES_FILE)
                old = [str(o) for o in OmegaConf.load(saved)] if resume and os.path.exists(saved) else []
                kept = [o for o in merge_overrides(old, ov) if override_key(o) not in CONTROL]
                OmegaConf.save(ListConfig(kept), saved)
        progress = flag(cfg, "trainer.progress", default=True)
        summary = loop.run(cfg.get("stop_after_rounds"), progress)
        if loop.rank == 0:
            _say_where(summary, run_dir, progress, cfg)
        return summary
    except StopRequested as stop:
        if child:  # rank 0 reports (and a non-zero child would make Lightning's observer kill the launcher)
            sys.exit(0)
        line = _requeue_line(cfg, stop, run_dir, asked) if stop.signum == signal.SIGUSR1 else None
        print(line or f"stopped after round {stop.round_done}; checkpoint saved. Resume with:\n{resume_hint(run_dir, cfg)}",
              file=sys.stderr)
        sys.exit(128 + stop.signum)
    except KeyboardInterrupt:  # a second Ctrl-C / SIGTERM: abort now, without a traceback
        last = getattr(getattr(loop, "checkpointer", None), "last", None)
        fail(f"aborted by a second signal; the last checkpoint is {last or 'none'}"
             + (f"; resume with: {resume_command(run_dir, cfg)}" if last else ""), code=130)
    except NonFiniteLossError as err:
        if full:
            raise
        if in_sweep():  # one diverged job of a sweep: its summary.json holds the error; the other jobs go on
            print(f"error: {err}", file=sys.stderr)
            return None
        fail(str(err))
    except FLError as err:
        if full:
            raise
        fail(str(err))
    except OSError as err:  # disk full, read-only or forbidden output: one line; saved checkpoints stay intact
        msg = None if full else _disk_message(err, run_dir, loop, cfg)
        if msg is None:
            raise
        fail(msg)
    except Exception as err:  # config values Hydra/OmegaConf could not resolve, etc.
        if not full and peers.is_peer_failure(err):  # another process is gone: one line, out at once
            _lost_peer(err, cfg)

        if full or not isinstance(err, OmegaConfBaseException):
            raise
        fail(f"config: {str(err).splitlines()[0]}")
    return None
