"""Invariant 3: the same run on 1 and on 2 Fabric processes (gloo, CPU) gives the same global model up to float
summation order. Clients are owned by process ``client % world_size``; uploads are all-reduced."""
from __future__ import annotations

from safetensors.torch import load_file

from tests.conftest import run_cli

BASE = ["fl.num_clients=8", "fl.clients_per_round=5", "fl.rounds=3", "fl.local_steps=3", "trainer.progress=false",
        "trainer.accelerator=cpu", "method.momentum=0.9", "method.parts.local_optimizer.state=persistent"]


def test_two_processes_match_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    p1 = run_cli(BASE + [f"hydra.run.dir={one}"])
    p2 = run_cli(BASE + ["trainer.devices=2", "trainer.strategy=ddp", f"hydra.run.dir={two}"])
    assert p1.returncode == 0, p1.stderr
    assert p2.returncode == 0, p2.stderr
    a = load_file(str(one / "checkpoints" / "round_000003" / "model.safetensors"))
    b = load_file(str(two / "checkpoints" / "round_000003" / "model.safetensors"))
    diffs = [float((a[k] - b[k]).abs().max()) for k in a]
    assert max(diffs) < 1e-5
    # the two-process checkpoint holds both processes' client states
    names = {f.name for f in (two / "checkpoints" / "round_000003").iterdir()}
    assert {"clients.rank0.safetensors", "clients.rank1.safetensors"} <= names
