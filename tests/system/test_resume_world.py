"""Resume on any process count: a checkpoint written by W processes resumes with W' != W and goes on as a W'-process
run would from that state (equal to float summation order); the client states, keyed by client id, are shared out
again among the new processes. The runs are float64: there that order moved the model by <= 4e-16 relative under
tests/helpers/golden.py's native, aten_default and all_avx2 settings, so ``TIGHT`` holds on any CPU (docs/decisions.md,
"Two-path comparisons on any CPU"); in fp32 such orders moved a model by up to 4.8e-5."""
from __future__ import annotations

import csv

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow

BASE = ["fl.num_clients=8", "fl.clients_per_round=5", "fl.rounds=4", "fl.local_steps=3", "trainer.progress=false",
        "trainer.accelerator=cpu", "method.momentum=0.9", "method.parts.local_optimizer.state=persistent",
        "trainer.precision=64-true"]
TIGHT = 1e-12
TWO = ["trainer.devices=2", "trainer.strategy=ddp"]
ONE = ["trainer.devices=1", "trainer.strategy=auto"]


def _model(run_dir, r=4):
    return load_file(str(run_dir / "checkpoints" / f"round_{r:06d}" / "model.safetensors"))


def _diff(a: dict, b: dict) -> float:
    """The largest difference of two state dicts, relative to each tensor's largest entry."""
    assert a.keys() == b.keys() and len(a) > 0
    assert all(v.dtype == b[k].dtype == torch.float64 for k, v in a.items() if v.is_floating_point())  # F64 runs
    return max(float((a[k].double() - b[k].double()).abs().max() / a[k].double().abs().max().clamp_min(1e-30))
               for k in a)


def _clients(ckpt) -> dict[int, set[int]]:
    """Per process, the clients its index names (the states it holds)."""
    import json

    out = {}
    for f in ckpt.iterdir():
        if f.name.startswith("clients.rank") and f.suffix == ".json":
            out[int(f.name[len("clients.rank"):-5])] = {int(c) for c in json.loads(f.read_text())["clients"]}
    return out


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    d = tmp_path_factory.mktemp("straight")
    p = run_cli(BASE + [f"hydra.run.dir={d}"])
    assert p.returncode == 0, p.stderr[-2000:]
    return d


@pytest.mark.parametrize("first,then", [(TWO, ONE), (ONE, TWO)], ids=["2 then 1", "1 then 2"])
def test_a_checkpoint_resumes_on_another_process_count(tmp_path, straight, first, then):
    d = tmp_path / "run"
    p = run_cli(BASE + first + ["stop_after_rounds=2", f"hydra.run.dir={d}"])
    assert p.returncode == 0, p.stderr[-2000:]
    held = _clients(d / "checkpoints" / "round_000002")
    p = run_cli(BASE + then + [f"resume={d}"])
    assert p.returncode == 0, p.stderr[-2000:]
    a, b = _model(straight), _model(d)
    assert _diff(a, b) <= TIGHT
    rows = [list(csv.DictReader(open(x / "metrics.csv"))) for x in (straight, d)]
    assert [r["round"] for r in rows[0]] == [r["round"] for r in rows[1]]
    for x, y in zip(*rows):
        assert float(y["test_loss"]) == pytest.approx(float(x["test_loss"]), rel=TIGHT)
    # every client's state survived the change of process count, each held by exactly one new process
    after = _clients(d / "checkpoints" / "round_000004")
    assert len(after) == (2 if then is TWO else 1)
    saved = set().union(*held.values())
    assert saved and saved <= set().union(*after.values())
    if then is TWO:
        assert after[0] and after[1] and not after[0] & after[1]
