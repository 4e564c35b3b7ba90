"""Compose the real Hydra config (as train.py does) with small overrides; run train.py as a user would."""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONF = os.path.join(ROOT, "conf")

FAST = ["fl.num_clients=6", "fl.clients_per_round=3", "fl.rounds=4", "fl.local_steps=3", "trainer.progress=false",
        "trainer.accelerator=cpu"]


def make_cfg(overrides: list[str], run_dir=None):
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from fl_lightning.config.schema import register

    register()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    with open_dict(cfg):
        cfg.run_dir = str(run_dir)
    return cfg


def build_loop(overrides: list[str], run_dir, resume: str | None = None):
    from fl_lightning.run.build import build

    cfg = make_cfg(overrides, run_dir)
    loop = build(cfg, str(run_dir), resume=resume)
    loop.setup(resume=resume)
    return loop


def build_error(overrides: list[str], run_dir) -> str:
    """Build a run in-process as ``train.py`` would and return the one-line message of the ``FLError`` it raises
    (what the CLI prints after ``error: ``); fails the test if it builds. Much cheaper than a subprocess, for tests
    of many bad values (the CLI's printing of an FLError is tested in tests/system/test_cli_errors.py)."""
    import pytest

    from fl_lightning.run.build import build
    from fl_lightning.errors import FLError

    with pytest.raises(FLError) as err:
        build(make_cfg(overrides, run_dir), str(run_dir))
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def cli_in_process(argv: list[str], run_dir) -> tuple[int, str]:
    """What ``python train.py *argv`` does, in this process (train.py's checks before Hydra, the composition, then
    ``cli.task``, train.py's Hydra task): ``(exit code, stderr)``. Any exception other than the CLI's exit propagates (a traceback)."""
    import contextlib
    import io

    from fl_lightning.run import cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            argv = cli.prepare(argv, CONF)
            try:
                cfg = make_cfg(argv, run_dir)
            except Exception as bad:  # what cli.main prints for a config that does not compose
                cli.fail(cli.composition_error(bad, argv, CONF))
            cli.task(cfg)
            code = 0
        except SystemExit as stop:
            code = stop.code
        finally:
            while cli._HELD_LOCKS:  # a process holds its run directory's lock until it exits: release it here
                cli._HELD_LOCKS.pop()._f.close()
    return code, err.getvalue()


def metric_rows(run_dir) -> list[dict]:
    """A run's metrics.csv rows without the wall clock (what two equal runs share exactly)."""
    import csv

    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(f)]


def saved_model(run_dir, round_done: int) -> dict:
    """The global model tensors of a run's checkpoint ``round_<round_done>``."""
    from safetensors.torch import load_file

    return load_file(os.path.join(run_dir, "checkpoints", f"round_{round_done:06d}", "model.safetensors"))


def run_cli(args: list[str], timeout: int = 300, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """``python train.py *args`` from the repository root (or ``cwd``: where Hydra's default outputs/ would go)."""
    e = dict(os.environ)
    e.pop("HYDRA_FULL_ERROR", None)
    e.update(env or {})
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or ROOT, env=e)


# a log record as Hydra's console handler writes it: on stderr since issue 65 (the result is stdout's), beside an error
LOG_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\]\[[\w.]+\]\[(DEBUG|INFO|WARNING)\] - ")


def without_logs(text: str) -> str:
    """``text`` (a run's stderr) without its log records: what a test of the run's own lines reads."""
    return "\n".join(ln for ln in text.splitlines() if not LOG_RECORD.match(ln))


def one_line_error(p: subprocess.CompletedProcess | tuple[int, str], *needles: str) -> str:
    """Assert ``p`` (a finished ``train.py``, or ``cli_in_process``'s ``(exit code, stderr)``) failed with exit 2 and
    exactly one stderr line ``error: ...`` (besides log records) holding every needle; return it."""
    code, err = (p.returncode, p.stderr) if isinstance(p, subprocess.CompletedProcess) else p
    err = without_logs(err).strip()
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]
