"""Two node ranks through torchrun on one host (static rendezvous, one shared run directory): the run ends as one
process's run does, to float summation order. Before, every node's first process took the run directory's lock (the
launched-child check read only Lightning's LOCAL_RANK / NODE_RANK), so the second node was refused."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.helpers.cli import FAST, ROOT, metric_rows, run_cli

pytestmark = pytest.mark.slow
SETTING = [*FAST[:4], "trainer.progress=false", "trainer.accelerator=cpu", "fl.clients_per_round=4"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_through_torchrun_equal_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert run_cli([*SETTING, f"hydra.run.dir={one}"]).returncode == 0
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port),
                               os.path.join(ROOT, "train.py"), *SETTING, "trainer.num_nodes=2", "trainer.devices=1",
                               f"hydra.run.dir={two}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    outs = [p.communicate(timeout=300) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [o[1][-2000:] for o in outs]
    assert "in use by another running job" not in "".join(o[1] for o in outs)
    a, b = metric_rows(one), metric_rows(two)
    assert [r["round"] for r in a] == [r["round"] for r in b]
    for ra, rb in zip(a, b):
        for k in ("train_loss", "test_loss", "test_acc", "uplink_bits", "downlink_bits"):
            assert float(rb[k]) == pytest.approx(float(ra[k]), rel=1e-6, abs=1e-9), (k, ra, rb)
