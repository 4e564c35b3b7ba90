"""torchrun on one host, against one process's run (equal to float summation order):

* two node ranks (one shared run directory), with the static rendezvous (``--node-rank``, ``--master-addr``,
  ``--master-port``) and with the c10d one (``--rdzv-backend c10d``: torchrun assigns the node ranks). Before, every
  node's first process took the run directory's lock (the launched-child check read only Lightning's LOCAL_RANK /
  NODE_RANK), so the second node was refused;
* two nodes of two processes each;
* an elastic restart: one worker killed mid-run, torchrun (``--max-restarts 1``) starts the workers again and
  ``resume=auto`` continues from the last checkpoint."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers.cli import FAST, ROOT, metric_rows, run_cli

pytestmark = pytest.mark.slow
# float64: the processes' float summation order then left the metrics equal under tests/helpers/golden.py's native,
# aten_default and all_avx2 settings (docs/decisions.md, "Two-path comparisons on any CPU"), so TIGHT holds anywhere
SETTING = [*FAST[:4], "trainer.progress=false", "trainer.accelerator=cpu", "fl.clients_per_round=4",
           "trainer.precision=64-true"]
TIGHT = 1e-12
# rounds long enough (about a second each) to kill a worker in the middle of one
LONG = [*SETTING, "fl.local_steps=300"]
KEYS = ("train_loss", "test_loss", "test_acc", "uplink_bits", "downlink_bits")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}


def _torchrun(launch: list[str], args: list[str], env: dict | None = None) -> subprocess.Popen:
    """``python -m torch.distributed.run <launch> train.py <args>`` in a session of its own (:func:`_kill` ends it
    and its workers)."""
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *launch, os.path.join(ROOT, "train.py"),
                             *args], cwd=ROOT, env={**_env(), **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _kill(procs: list[subprocess.Popen], run_dir) -> None:
    """End torchrun (its process group) and every worker of ``run_dir``: torchrun starts each worker in a session of
    its own, so a worker outlives a killed torchrun."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for pid in _workers(str(run_dir)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        p.communicate()


def _run_all(procs: list[subprocess.Popen], run_dir, timeout: int = 300) -> list[tuple[str, str]]:
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        _kill(procs, run_dir)


def _diff(a: list[dict], b: list[dict]) -> float:
    """The largest relative difference of two runs' metrics (``KEYS``), round by round."""
    assert [r["round"] for r in a] == [r["round"] for r in b]
    return max(abs(float(rb[k]) - float(ra[k])) / max(abs(float(ra[k])), 1e-30) for ra, rb in zip(a, b) for k in KEYS)


def _assert_same_metrics(ref, run) -> None:
    a, b = metric_rows(ref), metric_rows(run)
    assert _diff(a, b) <= TIGHT, (a, b)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The one-process run of ``SETTING`` every multi-process run here is compared with."""
    d = tmp_path_factory.mktemp("one")
    p = run_cli([*SETTING, f"hydra.run.dir={d}"])
    assert p.returncode == 0, p.stderr[-2000:]
    return d


def _two_nodes(rdzv: str, nproc: int, run_dir) -> None:
    port = _free_port()
    if rdzv == "static":
        def launch(n):
            return ["--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    else:  # c10d: torchrun assigns the node ranks (the first to reach the endpoint hosts the store)
        def launch(n):
            return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"fl-{port}"]
    nodes = [_torchrun(["--nnodes", "2", "--nproc-per-node", str(nproc), *launch(n)],
                       [*SETTING, "trainer.num_nodes=2", f"trainer.devices={nproc}", f"hydra.run.dir={run_dir}"])
             for n in (0, 1)]
    outs = _run_all(nodes, run_dir)
    assert [p.returncode for p in nodes] == [0, 0], [o[1][-2000:] for o in outs]
    assert "in use by another running job" not in "".join(o[1] for o in outs)


@pytest.mark.parametrize("rdzv", ["static", "c10d"])
def test_two_nodes_through_torchrun_equal_one_process(tmp_path, one_process, rdzv):
    _two_nodes(rdzv, 1, tmp_path / "two")
    _assert_same_metrics(one_process, tmp_path / "two")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 4, reason="4 processes (2 nodes x 2) need at least 4 CPU cores")
def test_two_nodes_of_two_processes_equal_one_process(tmp_path, one_process):
    _two_nodes("static", 2, tmp_path / "four")
    _assert_same_metrics(one_process, tmp_path / "four")


def _workers(run_dir: str, rank: int | None = None) -> list[int]:
    """The processes (not torchrun: its command line has ``torch.distributed.run``) whose command line names
    ``run_dir`` and, for a ``rank``, whose environment has ``RANK=<rank>``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            if run_dir.encode() not in cmd or b"torch.distributed.run" in cmd:
                continue
            if rank is not None:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"RANK={rank}".encode() not in f.read().split(b"\0"):
                        continue
        except OSError:  # gone, or not ours to read
            continue
        found.append(int(pid))
    return found


def test_a_worker_killed_mid_run_restarts_and_resumes(tmp_path):
    """torchrun ``--max-restarts 1``: rank 1 killed (SIGKILL) once a checkpoint exists; torchrun stops rank 0 and
    starts both again, which resume (``resume=auto``) from the last checkpoint and end as a straight two-process run
    does (not the one-process run: over rounds of 300 local steps the summation order of two processes moves the
    losses by about 1e-4 relative).

    The rendezvous must be c10d, with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: this torch's workers of a restarted
    attempt otherwise join the process group through the agent's store of the first attempt (no per-attempt prefix,
    torch/distributed/rendezvous.py ``_create_c10d_store``; pytorch/pytorch#135712) and read the dead attempt's
    keys: with the static rendezvous rank 1 connects to the old rank 0's gloo address ("Gloo connectFullMesh failed
    ... Connection refused") and the run fails; with c10d and the shared store the new attempt hangs in
    ``init_process_group``."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    p = run_cli([*LONG, "trainer.devices=2", f"hydra.run.dir={ref}"])
    assert p.returncode == 0, p.stderr[-2000:]
    port = _free_port()
    tr = _torchrun(["--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"fl-{os.getpid()}-{port}"],
                   [*LONG, "trainer.devices=2", f"hydra.run.dir={run}", "resume=auto"],
                   env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    try:
        deadline = time.time() + 240
        while not (run / "checkpoints" / "round_000001").exists():
            assert tr.poll() is None, tr.communicate()[1][-2000:]
            assert time.time() < deadline, "no checkpoint round_000001"
            time.sleep(0.05)
        victims = _workers(str(run), 1)
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        _, err = tr.communicate(timeout=150)
    finally:
        _kill([tr], run)
    assert tr.returncode == 0, err[-3000:]
    assert f"failed (exitcode: -9) local_rank: 1 (pid: {victims[0]})" in err, err[-3000:]  # torchrun saw the kill
    log = (run / "train.log").read_text()
    assert log.count("Initializing distributed: GLOBAL_RANK: 0") == 2, log  # and started the workers again
    assert "resumed from" in log, log
    assert json.loads((run / "summary.json").read_text())["finished"] is True
    _assert_same_metrics(ref, run)
