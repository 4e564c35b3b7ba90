"""A lost peer is one line (fl_lightning/dist/peers.py): a rank killed mid-run ends every survivor within seconds with one
line naming the rank and the resume command, and the last checkpoint resumes; a rank waiting for a peer that never
comes stops at trainer.timeout_s, or at once on SIGTERM; processes that do not share the run directory stop with one
line each, exit 2."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers.cli import ROOT, metric_rows, run_cli

pytestmark = pytest.mark.slow

# rounds of a few seconds on a busy 2-core machine, so the kill lands inside one
LONG = ["fl.num_clients=8", "fl.clients_per_round=4", "fl.rounds=30", "fl.local_steps=400", "trainer.progress=false",
        "trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp"]
NOISE = ("Traceback", "frame #", "terminate called", "TCPStore.cpp")


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_pids(run_dir) -> dict[int, int]:
    """The train.py processes of ``run_dir`` by global rank (the launcher is rank 0: no LOCAL_RANK)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if any(c.endswith(b"train.py") for c in cmd) and f"hydra.run.dir={run_dir}".encode() in cmd:
            out[int(env.get(b"LOCAL_RANK", b"0"))] = int(d)
    return out


def _errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("error:")]


@pytest.mark.parametrize("victim", [1, 0], ids=["a launched rank", "the launcher (rank 0)"])
def test_a_killed_rank_is_one_line_and_the_run_resumes(tmp_path, victim):
    d = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *LONG, f"hydra.run.dir={d}"], cwd=ROOT,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 180
        while not (d / "checkpoints" / "round_000001").exists() and time.time() < deadline:
            time.sleep(0.2)
        pids = _rank_pids(d)
        assert set(pids) == {0, 1} and proc.poll() is None, pids
        os.kill(pids[victim], signal.SIGKILL)
        killed = time.time()
        survivor = pids[1 - victim]
        while os.path.exists(f"/proc/{survivor}") and time.time() < killed + 60:
            try:
                with open(f"/proc/{survivor}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
                        break
            except OSError:
                break
            time.sleep(0.1)
        took = time.time() - killed
        _, err = proc.communicate(timeout=60)  # the survivor's stderr is this pipe too
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lines = _errors(err)
    assert len(lines) == 1, err[-3000:]
    assert not any(n in err for n in NOISE), err[-3000:]
    assert f"rank {1 - victim}:" in lines[0] and f"rank {victim}" in lines[0].split(":", 2)[2], lines[0]
    assert f"resume with: python3 train.py resume={d}" in lines[0], lines[0]
    assert took < 20, took  # seconds, not gloo's 30 minutes
    # the last checkpoint named is intact: the run resumes from it on one process and finishes
    last = lines[0].split("the last checkpoint is ")[1].split(";")[0]
    assert os.path.isdir(last)
    p = run_cli([f"resume={d}", "trainer.devices=1", "trainer.strategy=auto", "fl.rounds=" + str(int(last[-6:]) + 1)])
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(metric_rows(d)) == int(last[-6:]) + 1


def test_a_peer_that_never_comes_ends_at_the_timeout(tmp_path):
    """Node 0 of two, the other node never started: one line after trainer.timeout_s, not 30 minutes."""
    env = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), NODE_RANK="0")
    t = time.time()
    p = run_cli(["fl.rounds=2", "trainer.progress=false", "trainer.accelerator=cpu", "trainer.num_nodes=2",
                 "trainer.devices=1", "trainer.strategy=ddp", "trainer.timeout_s=5", f"hydra.run.dir={tmp_path}"],
                env=env, timeout=120)
    took = time.time() - t
    lines = _errors(p.stderr)
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-3000:]
    assert "not every process joined within trainer.timeout_s=5 s" in lines[0]
    assert took < 60, took


def test_sigterm_while_waiting_for_a_peer_ends_at_once(tmp_path):
    env = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), NODE_RANK="0")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), "fl.rounds=2", "trainer.progress=false",
                             "trainer.accelerator=cpu", "trainer.num_nodes=2", "trainer.devices=1",
                             "trainer.strategy=ddp", f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # waiting in the rendezvous from here on
            if "Initializing distributed" in line:
                break
        time.sleep(1.0)
        t = time.time()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.time() - t
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert _errors(err) == [ln for ln in err.splitlines() if ln.startswith("error: stopped by signal 15")], err
    assert took < 10, took


def test_processes_that_do_not_share_the_run_directory_stop_with_one_line(tmp_path):
    """Two torchrun nodes, each its own run directory (as on two machines with local disks)."""
    port = _free_port()
    setting = ["fl.rounds=2", "trainer.progress=false", "trainer.accelerator=cpu", "trainer.num_nodes=2",
               "trainer.devices=1"]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
                               "1", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port),
                               os.path.join(ROOT, "train.py"), *setting, f"hydra.run.dir={tmp_path / f'node{n}'}"],
                              cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for n in (0, 1)]
    outs = [p.communicate(timeout=300) for p in nodes]
    for n, (p, (_, err)) in enumerate(zip(nodes, outs)):
        ours = _errors(err)
        assert p.returncode != 0 and len(ours) == 1, err[-3000:]
        assert f"the processes do not share the run directory {tmp_path / 'node0'}" in ours[0], ours[0]
        assert "rank 1 cannot read what rank 0 wrote there" in ours[0] and "hydra.run.dir=" in ours[0]
        assert "exitcode  : 2" in err  # torchrun's own report of the worker's exit code follows our line
    assert not (tmp_path / "node0" / "checkpoints").exists()
