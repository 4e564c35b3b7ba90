"""A checkpoint written before the parts declared their keys as records (tests/fixtures/checkpoints_v1, written by
commit d2f349b's code: see make.py there) loads with today's code, every tensor landing where today's code keeps it,
and the run goes on from it as from today's own checkpoint.

No arithmetic of the recording machine is needed (its CPU summed in its own order; see tests/helpers/golden.py):

1. resume from the old checkpoint and save at once, without training: every tensor and every non-tensor value of the
   re-saved checkpoint equals the old one's, key for key (the on-disk names of every part's client and server state
   are unchanged: the mapping from old names to today's is the identity, ``RENAMED`` below);
2. the run resumed from the old checkpoint and the run resumed from the re-saved one continue bit-identically on this
   machine (nothing the old checkpoint holds is read and then dropped)."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch

from tests.helpers.cli import ROOT, build_loop

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "checkpoints_v1")
sys.path.insert(0, FIXTURES)
from make import METHODS, OVERRIDES  # noqa: E402

RENAMED: dict[str, str] = {}  # old on-disk key -> today's (none has moved since checkpoints_v1)
ROUND = "round_000002"


def at_fixture_precision(method: str) -> list[str]:
    """The fixtures ran Newton-Schulz in bf16 where the yamls now say ``auto`` (fl_lightning/precision.py), which
    may resolve to fp32 on this machine: pin what they were written with."""
    from fl_lightning import precision
    from tests.helpers.cli import make_cfg

    cfg = make_cfg([f"method={method}"], "unused")
    return [f"{k}=bfloat16" for k, v in precision.dtype_keys(cfg).items() if v == precision.AUTO]


def tensors(loop, path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path`` as ``object/key`` (client states ``clients/<cid>/<key>``), read
    and checked by the checkpointer itself."""
    states, _ = loop.checkpointer.verify(str(path), loop.stateful())
    return {f"{obj}/{RENAMED.get(k, k)}": v[k] for obj, v in states.items() for k in v}


def values(path) -> dict:
    """The checkpoint's non-tensor state (meta.json's ``state``: the loop's round, the recorder's rows and totals)."""
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    state = meta["state"]
    state.get("recorder", {}).pop("wall_s", None)  # this process's clock, not a result
    return {"round": meta["round"], "world_size": meta["world_size"], "objects": meta["objects"], "state": state}


@pytest.mark.parametrize("method", METHODS)
def test_an_old_checkpoint_lands_key_for_key_and_continues(method, tmp_path):
    over = [f"method={method}", *OVERRIDES, *at_fixture_precision(method)]
    old = tmp_path / "old"
    shutil.copytree(os.path.join(FIXTURES, method), old)

    loaded = build_loop(over, tmp_path / "resaved", resume=str(old))
    assert loaded.round == 2
    loaded.checkpointer.save(loaded.round, loaded.stateful())
    loaded.checkpointer.wait()
    resaved = tmp_path / "resaved" / "checkpoints" / ROUND
    before, after = tensors(loaded, old / "checkpoints" / ROUND), tensors(loaded, resaved)
    assert sorted(after) == sorted(before)
    assert any(k.startswith(("clients/", "strategy/")) for k in before)  # each fixture has a part with state
    for k, t in before.items():
        assert after[k].dtype == t.dtype and after[k].shape == t.shape, k
        assert torch.equal(after[k].view(-1).view(torch.uint8), t.view(-1).view(torch.uint8)), k  # bits (NaN too)
    assert values(resaved) == values(old / "checkpoints" / ROUND)

    copy = tmp_path / "copy"  # the re-saved run as it stood (the runs below prune their own checkpoints)
    shutil.copytree(tmp_path / "resaved", copy)
    from_old = build_loop(over, tmp_path / "from_old", resume=str(old))
    from_new = build_loop(over, tmp_path / "from_new", resume=str(copy))
    for loop in (from_old, from_new):
        assert loop.run(progress_enabled=False)["rounds_done"] == 4
    for k, v in from_old.global_params.items():
        assert torch.equal(v, from_new.global_params[k]), k
    a, b = from_old.strategy.state_dict(), from_new.strategy.state_dict()
    assert sorted(a) == sorted(b)
    for name, t in a.items():
        assert torch.equal(t, b[name]) if isinstance(t, torch.Tensor) else t == b[name], name
    clockless = [[{k: v for k, v in row.items() if k != "wall_s"} for row in loop.recorder.rows]
                 for loop in (from_old, from_new)]
    assert len(clockless[0]) == 4 and clockless[0] == clockless[1]
