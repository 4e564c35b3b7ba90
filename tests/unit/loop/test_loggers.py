"""The logger group: Fabric loggers built from _target_ nodes; csv by default (Lightning's CSV under logs/, a resumed
run in its own version folder), tensorboard beside it; a logger whose package is missing is one line."""
from __future__ import annotations

import importlib.util

import pytest

from tests.helpers.cli import FAST, cli_in_process


def test_csv_by_default_and_tensorboard_beside_it(tmp_path):
    pytest.importorskip("tensorboard")
    code, err = cli_in_process(FAST + ["fl.rounds=2", "logger=tensorboard", f"hydra.run.dir={tmp_path}"], tmp_path)
    assert code == 0, err
    assert len((tmp_path / "logs" / "metrics.csv").read_text().splitlines()) == 3  # header + 2 rounds
    assert list((tmp_path / "logs" / "tb").glob("events.out.tfevents.*"))
    code, err = cli_in_process(FAST + ["fl.rounds=3", f"resume={tmp_path}"], tmp_path)
    assert code == 0, err
    resumed = list((tmp_path / "logs").glob("resumed_*"))
    assert len(resumed) == 1 and (resumed[0] / "metrics.csv").exists()
    assert len((tmp_path / "logs" / "metrics.csv").read_text().splitlines()) == 3  # the first part kept


@pytest.mark.parametrize("logger,package", [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_logger_whose_package_is_missing_is_one_line(tmp_path, logger, package):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    code, err = cli_in_process(FAST + [f"logger={logger}", f"hydra.run.dir={tmp_path}"], tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: config error: logger.{logger}:") and f"fix: pip install {package}" in lines[0]
    assert '".[loggers]"' in lines[0]
