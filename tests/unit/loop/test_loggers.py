"""The logger group: Fabric loggers built from _target_ nodes beside the run's own metrics.csv, which is the rows' one
file: none by default, ``logger=csv`` names that file and adds nothing (Lightning's CSVLogger under logs/ wrote every
row a second time); tensorboard in logs/tb, a resumed run in its own version folder; a logger whose package is
missing is one line. (A default run's directory through train.py: tests/system/test_run_dir.py.)"""
from __future__ import annotations

import importlib.util

import pytest

from fl_lightning.run.build import make_loggers
from fl_lightning.errors import ConfigError
from tests.helpers.cli import FAST, cli_in_process, make_cfg


@pytest.mark.parametrize("overrides", [[], ["logger=csv"]], ids=["default", "csv"])
def test_no_logger_by_default_and_csv_adds_none(tmp_path, overrides):
    assert make_loggers(make_cfg(overrides, tmp_path)) == []


def test_tensorboard_beside_the_runs_own_csv(tmp_path):
    importlib.import_module("tensorboard")  # the dev extra installs it: missing fails, never skips
    code, err = cli_in_process(FAST + ["fl.rounds=2", "logger=tensorboard", f"hydra.run.dir={tmp_path}"], tmp_path)
    assert code == 0, err
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 3  # header + 2 rounds
    assert list((tmp_path / "logs" / "tb").glob("events.out.tfevents.*"))
    code, err = cli_in_process(FAST + ["fl.rounds=3", "logger=tensorboard", f"resume={tmp_path}"], tmp_path)
    assert code == 0, err
    resumed = list((tmp_path / "logs" / "tb").glob("resumed_*"))
    assert len(resumed) == 1 and list(resumed[0].glob("events.out.tfevents.*"))
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 4  # every round, in one file
    assert list(tmp_path.rglob("*.csv")) == [tmp_path / "metrics.csv"]  # no second copy of the rows


def test_a_loggers_folders_and_names(tmp_path, monkeypatch):
    """A number is a name (0 -> "0"), a folder null is refused naming the key (the key probe's values, on the
    logger the default config no longer has)."""
    importlib.import_module("tensorboard")
    monkeypatch.chdir(tmp_path)
    tb = ["logger=tensorboard"]
    (lg,) = make_loggers(make_cfg(tb + ["logger.tensorboard.root_dir=0", "logger.tensorboard.name=-1"], tmp_path))
    assert (lg.root_dir, lg.name) == ("0", "-1")
    (lg,) = make_loggers(make_cfg(tb + ["logger.tensorboard.name=null"], tmp_path))
    assert lg.name == ""
    with pytest.raises(ConfigError, match="logger.tensorboard.root_dir: must be a folder, got null"):
        make_loggers(make_cfg(tb + ["logger.tensorboard.root_dir=null"], tmp_path))


@pytest.mark.parametrize("logger,package", [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_logger_whose_package_is_missing_is_one_line(tmp_path, logger, package):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    code, err = cli_in_process(FAST + [f"logger={logger}", f"hydra.run.dir={tmp_path}"], tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: config error: logger.{logger}:") and f"fix: pip install {package}" in lines[0]
    assert '".[loggers]"' in lines[0] and "metrics.csv" in lines[0]
