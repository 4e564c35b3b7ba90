"""Issue 65, items 10 and 13: an option typed as ``--rounds 3`` names the key (one line, exit 2); no INFO line for
``trainer.cohort/compile=auto`` off CUDA (nothing is chosen there); every printed command says ``python3``;
summary.json's ``run_dir`` is absolute."""
from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from omegaconf import OmegaConf

from fl_lightning.run import cli
from fl_lightning.dist import peers, signals
from fl_lightning.cohort import auto
from fl_lightning.recorder import RunRecorder
from fl_lightning.run.run_dir import resume_command
from tests.helpers.cli import CONF


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.prepare(argv, CONF)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, (stop.value.code, err)
    return err[0]


@pytest.mark.parametrize("argv, line", [
    (["--rounds", "3"], "error: unknown option --rounds; keys are set as key=value: fl.rounds=3"),
    (["method=fedavg", "--seed=4"], "error: unknown option --seed; keys are set as key=value: seed=4"),
    (["--local-steps", "2", "fl.rounds=2"], "error: unknown option --local-steps; keys are set as key=value: "
                                            "fl.local_steps=2"),
    (["--epochs", "1"], "error: unknown option --epochs; keys are set as key=value: fl.local_epochs=1"),
])
def test_an_option_is_one_line_naming_the_key_it_meant(argv, line, capsys):
    assert _refused(argv, capsys) == line


def test_an_option_no_key_matches_says_how_keys_are_set(capsys):
    line = _refused(["--no-such-thing"], capsys)
    assert line.startswith("error: unknown option --no-such-thing; keys are set as key=value, e.g. fl.rounds=3"), line


def test_hydras_own_options_still_pass(capsys):
    assert cli.prepare(["-m", "seed=0,1", "--cfg", "job"], CONF)[-2:] == ["--cfg", "job"]


def test_auto_settings_say_nothing_at_info_level_off_cuda(caplog):
    cfg = OmegaConf.create({"trainer": {"cohort": "auto", "compile": "auto"}})
    with caplog.at_level(logging.INFO, logger="fl_lightning"):
        out = auto.resolve(cfg, None, torch.device("cpu"), 1, lambda: (1, "cpu"), lambda k, m: 1.0)
    assert out == {"cohort": 1, "compile": "none"} and cfg.trainer.cohort == 1  # the resolved values: in the config
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], caplog.text


def test_printed_commands_say_python3(monkeypatch, capfd):
    d = "/runs/a"
    assert resume_command(d) == f"python3 train.py resume={d}"
    try:
        peers.set_run(d, lambda: f"{d}/checkpoints/round_000002")
        assert "resume with: python3 train.py resume=/runs/a" in peers._where()
        peers.set_run(d)
        assert "start again with: python3 train.py resume=auto hydra.run.dir=/runs/a" in peers._where()
    finally:
        peers.set_run(None)
    monkeypatch.setattr(signals, "_STATE", {"phase": "building the run", "resume": d})
    monkeypatch.setattr(signals, "is_launched_child", lambda: False)
    monkeypatch.setattr(signals, "tell_children", lambda signum: None)
    monkeypatch.setattr(os, "_exit", lambda code: None)
    signals.stop_now(15)
    assert "(resume again with: python3 train.py resume=/runs/a)" in capfd.readouterr().err


def test_summary_json_names_the_run_directory_absolute_when_given_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("run")
    RunRecorder("run").summary(run_dir="run")  # a resume=run: the directory as typed
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["run_dir"] == str(tmp_path / "run")
