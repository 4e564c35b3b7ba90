"""cli.run and the loop's stop logic in-process (issue "Reliability" items 3-4): a full disk is one line that names the
last complete checkpoint; a signal during the last round lets the run finish with its summary; a signal during a
save stops right after it; SIGUSR1 under Slurm says in one line whether the job was requeued (a signal during set-up:
tests/system/test_hardening.py; the requeue through train.py: tests/system/test_preemption.py)."""
from __future__ import annotations

import errno
import json
import os
import signal

import pytest

from fl_lightning.run import cli
from fl_lightning.checkpoint import Checkpointer
from fl_lightning.loop import StopRequested
from tests.helpers.cli import FAST, build_loop, make_cfg


@pytest.fixture
def restore_signals():
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    yield
    for s, h in old.items():
        signal.signal(s, h)


def _run_cli(cfg, capsys):
    with pytest.raises(SystemExit) as ex:
        cli.run(cfg)
    err = capsys.readouterr().err.strip().splitlines()
    return ex.value.code, err


def test_a_full_disk_is_one_line_naming_the_last_checkpoint(tmp_path, monkeypatch, capsys, restore_signals):
    real = Checkpointer.save

    def save(self, round_done, objects):
        if round_done == 2:
            raise OSError(errno.ENOSPC, "No space left on device", os.path.join(self.root, "round_000002.tmp"))
        return real(self, round_done, objects)

    monkeypatch.setattr(Checkpointer, "save", save)
    code, err = _run_cli(make_cfg(FAST, tmp_path), capsys)
    assert code == 2 and len(err) == 1, err
    assert "the disk is full" in err[0] and "round_000001" in err[0] and "resume=" in err[0]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["round_000001"]  # the earlier checkpoint is intact


def test_a_signal_in_the_last_round_lets_the_run_finish(tmp_path):
    loop = build_loop(FAST + ["fl.rounds=2"], tmp_path)
    evaluate = loop.evaluate

    def evaluate_then_signal():
        if loop.round == 2:
            loop._on_signal(signal.SIGTERM, None)
        return evaluate()

    loop.evaluate = evaluate_then_signal
    summary = loop.run(progress_enabled=False)
    assert summary["finished"] and json.loads((tmp_path / "summary.json").read_text())["rounds_done"] == 2


def test_a_signal_during_a_save_stops_right_after_it(tmp_path):
    loop = build_loop(FAST + ["fl.rounds=4"], tmp_path)
    save = loop.checkpointer.save

    def save_with_signal(round_done, objects):
        if round_done == 1:
            loop._on_signal(signal.SIGTERM, None)
        return save(round_done, objects)

    loop.checkpointer.save = save_with_signal
    with pytest.raises(StopRequested) as stop:
        loop.run(progress_enabled=False)
    assert stop.value.round_done == 1 and loop.round == 1


def test_a_signal_in_the_first_round_stops_at_once(tmp_path, monkeypatch):
    """Before this invocation finished a round nothing is worth a checkpoint: the loop's handler ends the process at
    once (``signals.stop_now``) instead of finishing the round; from the second round on it checkpoints first."""
    from fl_lightning.dist import signals

    calls = []

    def stop_now(signum, frame=None):
        calls.append((signum, signals._STATE["phase"]))
        raise SystemExit(128 + signum)

    monkeypatch.setattr(signals, "stop_now", stop_now)
    loop = build_loop(FAST + ["fl.rounds=3"], tmp_path)
    run_round = loop.run_round

    def signalled_round(r, progress):
        if r == 0:
            loop._on_signal(signal.SIGTERM, None)
        return run_round(r, progress)

    loop.run_round = signalled_round
    with pytest.raises(SystemExit):
        loop.run(progress_enabled=False)
    assert calls == [(signal.SIGTERM, "running round 1, before this invocation finished a round")]
    assert not (tmp_path / "checkpoints").exists() or not os.listdir(tmp_path / "checkpoints")


@pytest.mark.parametrize("scontrol,needle", [
    (None, "Slurm job 4242 was not requeued: scontrol is not on PATH; resume with: python3 train.py resume="),
    ("exit 0", "Slurm job 4242 requeued, but its command has no resume=auto: add it to the job script"),
], ids=["no_scontrol", "no_resume_auto"])
def test_sigusr1_under_slurm_is_one_line_saying_whether_the_job_was_requeued(tmp_path, monkeypatch, capsys,
                                                                             restore_signals, scontrol, needle):
    from fl_lightning.loop import FederatedLoop

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if scontrol:
        (bin_dir / "scontrol").write_text(f"#!/bin/sh\n{scontrol}\n")
        (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    run_round = FederatedLoop.run_round

    def signalled_round(self, r, progress):
        if r == 1:
            self._on_signal(signal.SIGUSR1, None)
        return run_round(self, r, progress)

    monkeypatch.setattr(FederatedLoop, "run_round", signalled_round)
    code, err = _run_cli(make_cfg(FAST, tmp_path / "run"), capsys)
    assert code == 128 + signal.SIGUSR1 and len(err) == 1, err
    assert err[0].startswith("stopped after round 2; checkpoint saved; ") and needle in err[0], err
