"""Strict resume: a checkpoint whose state does not match what this run's objects read (a key removed, an extra key)
is refused with one line naming the key; force_resume=true starts what is missing fresh and ignores the rest."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from fl_lightning.checkpoint import MissingStateKey, TrackedState
from tests.helpers.cli import one_line_error, run_cli

pytestmark = pytest.mark.slow

BASE = ["method=scaffold", "fl.num_clients=6", "fl.clients_per_round=3", "fl.local_steps=2", "trainer.progress=false",
        "trainer.accelerator=cpu"]


@pytest.fixture
def stopped(tmp_path):
    d = tmp_path / "run"
    p = run_cli(BASE + ["fl.rounds=4", "stop_after_rounds=2", f"hydra.run.dir={d}"])
    assert p.returncode == 0, p.stderr[-2000:]
    return d, d / "checkpoints" / "round_000002"


def _edit(ckpt, fn):
    """Change the saved state as another code version would have written it: the file and its recorded checksum
    (a file that does not match its checksum is damage, handled by falling back: tests/unit/checkpoint/test_checkpoint_damage.py)."""
    from fl_lightning.checkpoint.files import file_digest

    f = ckpt / "strategy.safetensors"
    t = load_file(str(f))
    fn(t)
    save_file(t, str(f))
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"][f.name] = file_digest(str(f))
    (ckpt / "meta.json").write_text(json.dumps(meta))


def test_missing_part_key_is_refused(stopped, tmp_path):
    d, ckpt = stopped
    victim = sorted(k for k in load_file(str(ckpt / "strategy.safetensors")) if k.startswith("correction/c/"))[0]
    _edit(ckpt, lambda t: t.pop(victim))
    p = run_cli(BASE + ["fl.rounds=4", f"resume={d}", f"hydra.run.dir={tmp_path / 'h'}"])
    one_line_error(p, "lacks key", victim, "force_resume=true")
    p = run_cli(BASE + ["fl.rounds=4", f"resume={d}", "force_resume=true", f"hydra.run.dir={tmp_path / 'h2'}"])
    assert p.returncode == 0, p.stderr[-2000:]


def test_extra_part_key_is_refused(stopped, tmp_path):
    d, ckpt = stopped
    _edit(ckpt, lambda t: t.__setitem__("aggregation/server_momentum/x", torch.zeros(3)))
    p = run_cli(BASE + ["fl.rounds=4", f"resume={d}", f"hydra.run.dir={tmp_path / 'h'}"])
    one_line_error(p, "aggregation/server_momentum/x", "nothing in this run reads")


def test_other_method_is_refused(stopped, tmp_path):
    d, _ = stopped
    p = run_cli(["method=fedavg"] + BASE[1:] + ["fl.rounds=4", f"resume={d}", f"hydra.run.dir={tmp_path / 'h'}"])
    one_line_error(p, "force_resume=true")


def test_damaged_meta_everywhere_is_one_line(stopped, tmp_path):
    d, ckpt = stopped
    for c in (d / "checkpoints").glob("round_*"):  # every kept checkpoint: nothing to fall back to
        (c / "meta.json").write_text("{not json")
    p = run_cli(BASE + ["fl.rounds=4", f"resume={d}", f"hydra.run.dir={tmp_path / 'h'}"])
    one_line_error(p, "every checkpoint", "meta.json")


def test_tracked_state_records_reads():
    s = TrackedState({"a/x": 1, "a/y": 2, "b": 3})
    a = s.sub("a/")
    assert "x" in a and list(a) == ["x", "y"] and s.unused() == ["a/x", "a/y", "b"]
    assert a["x"] == 1 and a.get("z") is None
    assert s.unused() == ["a/y", "b"]
    assert dict(a.items()) == {"x": 1, "y": 2} and s.unused() == ["b"]
    with pytest.raises(MissingStateKey, match="a/z"):
        a["z"]
    assert json.dumps(sorted(s.unused())) == '["b"]'
