"""The run directory through the CLI (issue "Reliability"): resume from the directory alone, a crash with the
offload store resumes bit-identical, a refused resume leaves the run untouched and names the differing keys, a
locked or used directory is refused in one line, boolean flags parse strictly, and SIGTERM to a two-process launcher
stops both processes cleanly with a checkpoint from every rank; a default run writes its rows once (metrics.csv, no
logs/ copy)."""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from tests.helpers.cli import ROOT, metric_rows, one_line_error, run_cli, saved_model

pytestmark = pytest.mark.slow

# 12 clients, 2 a round: after 3 rounds at most 6 clients have trained, so rounds 4-5 bring new ones
BASE = ["fl.num_clients=12", "fl.clients_per_round=2", "fl.local_steps=3", "trainer.progress=false",
        "trainer.accelerator=cpu", "method.momentum=0.9", "method.parts.local_optimizer.state=persistent"]


rows, model = metric_rows, saved_model


def test_offload_crash_resumes_bit_identical_from_the_directory_alone(tmp_path):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    p = run_cli(BASE + ["fl.rounds=6", f"store.offload_dir={tmp_path / 'off_a'}", f"hydra.run.dir={straight}"])
    assert p.returncode == 0, p.stderr[-2000:]
    off = tmp_path / "off_b"
    p = run_cli(BASE + ["fl.rounds=5", "checkpoint.every=3", f"store.offload_dir={off}", f"hydra.run.dir={crashed}"])
    assert p.returncode == 0, p.stderr[-2000:]
    # a crash after round 5's client files were written but before its checkpoint: drop that checkpoint
    shutil.rmtree(crashed / "checkpoints" / "round_000005")
    in_ckpt = {k.split("/")[0] for k in load_file(str(crashed / "checkpoints" / "round_000003" / "clients.rank0.safetensors"))}
    on_disk = {f[7:13].lstrip("0") or "0" for f in os.listdir(off) if f.endswith(".safetensors")}
    assert on_disk - in_ckpt, "the test needs a client whose only state is newer than the checkpoint"
    here = tmp_path / "cwd"  # where Hydra's default outputs/<date>/<time>/ would be made (apart from other tests')
    here.mkdir()
    p = run_cli(["fl.rounds=6", f"resume={crashed}"], cwd=here)  # the directory alone: its overrides are re-used
    assert p.returncode == 0, p.stderr[-2000:]
    assert list(here.iterdir()) == []  # the resumed run writes into its own directory, no outputs/<date>/<time>/
    assert rows(crashed) == rows(straight)
    for d in (straight, crashed):  # no logger by default: the run's metrics.csv is the rows' one file, resumed or not
        assert sorted(d.rglob("*.csv")) == [d / "metrics.csv"] and not (d / "logs").exists()
    a, b = model(straight, 6), model(crashed, 6)
    assert all(bool((a[k] == b[k]).all()) for k in a)


def test_refused_resume_leaves_the_run_alone_and_names_the_keys(tmp_path):
    d = tmp_path / "run"
    assert run_cli(BASE + ["fl.rounds=2", f"hydra.run.dir={d}"]).returncode == 0
    before = (d / "config.yaml").read_bytes(), (d / "overrides.yaml").read_bytes(), rows(d)
    p = run_cli(["fl.rounds=3", "method.lr=0.5", f"resume={d}"])
    one_line_error(p, "method.lr", "0.5", "force_resume=true")
    assert ((d / "config.yaml").read_bytes(), (d / "overrides.yaml").read_bytes(), rows(d)) == before
    p = run_cli(["fl.rounds=3", f"resume={d}", "force_resume=no"])
    one_line_error(p, "force_resume", "true or false")
    p = run_cli(["fl.rounds=3", f"resume={tmp_path / 'no_such_run'}"])
    one_line_error(p, "resume", "no run directory")
    assert not (tmp_path / "no_such_run").exists()


def test_a_locked_or_used_directory_is_refused(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    with open(d / ".lock", "a") as f:  # another job holds the directory
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        one_line_error(run_cli(BASE + ["fl.rounds=1", f"hydra.run.dir={d}"]), "in use by another running job")
    assert run_cli(BASE + ["fl.rounds=2", f"hydra.run.dir={d}"]).returncode == 0
    first = rows(d)
    one_line_error(run_cli(BASE + ["fl.rounds=1", f"hydra.run.dir={d}"]), "already holds a run", "resume=",
                   "overwrite=true")
    assert rows(d) == first
    p = run_cli(BASE + ["fl.rounds=1", "overwrite=true", f"hydra.run.dir={d}"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(rows(d)) == 1 and sorted(os.listdir(d / "checkpoints")) == ["round_000001"]


def test_sigterm_to_a_two_process_launcher_stops_every_rank_with_a_checkpoint(tmp_path):
    d = tmp_path / "ddp"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *BASE, "fl.rounds=100000",
                             "checkpoint.every=3", "trainer.devices=2", "trainer.strategy=ddp", f"hydra.run.dir={d}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while not (d / "metrics.csv").exists() and time.time() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "resume=" in err and "Traceback" not in err, err[-3000:]
    last = sorted((d / "checkpoints").glob("round_*"))[-1]
    assert {"clients.rank0.safetensors", "clients.rank1.safetensors"} <= {f.name for f in last.iterdir()}
    assert int(last.name[6:]) == len(rows(d))  # the stop round was checkpointed, not the last multiple of 3


def _children(pid: int) -> list[int]:
    kids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                if d.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return kids


@pytest.mark.parametrize("phase", ["forming", "building"])
def test_sigterm_before_the_loop_stops_the_launched_ranks_too(tmp_path, phase):
    """A signal reaches the launcher only: while the process group forms (0.5 s after rank 1 starts) or while the
    ranks build (as soon as the group is registered), the launcher passes it on, every rank exits, and the user reads
    one line, no C++ error from a rank left behind."""
    d = tmp_path / "early"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *BASE, "fl.rounds=100000",
                             "trainer.devices=2", "trainer.strategy=ddp", f"hydra.run.dir={d}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        deadline = time.time() + 120
        while not (kids := _children(proc.pid)) and time.time() < deadline:
            time.sleep(0.05)
        if phase == "forming":
            time.sleep(0.5)
        else:
            for line in proc.stderr:  # Lightning's banner: every rank is past init_process_group, none in the loop
                seen.append(line)
                if "All distributed processes registered" in line:
                    break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    err = "".join(seen) + err
    deadline = time.time() + 10
    while any(os.path.exists(f"/proc/{k}") for k in kids) and time.time() < deadline:
        time.sleep(0.1)
    assert kids and not any(os.path.exists(f"/proc/{k}") for k in kids)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:") or "Error" in ln or "frame #" in ln
              or "Traceback" in ln]
    assert len(errors) == 1 and errors[0].startswith("error: stopped by signal 15"), err[-3000:]
    assert proc.returncode == 128 + signal.SIGTERM
