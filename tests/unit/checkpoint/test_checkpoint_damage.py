"""Damaged checkpoints (issue "Reliability" item 4): each file kind damaged in turn in the newest checkpoint; the
resume verifies before it loads, says so in one warning line and falls back to the previous checkpoint, whose
continuation equals a run that never stopped. Every checkpoint damaged: one line, nothing loaded."""
from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from fl_lightning.checkpoint import DamagedCheckpoint, list_checkpoints
from fl_lightning.checkpoint.files import file_digest
from tests.helpers.cli import FAST, build_loop

OV = FAST + ["method.momentum=0.9", "method.parts.local_optimizer.state=persistent"]


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


def _flip_byte(path):
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _pickle_in_place(path):
    torch.save({"w": torch.zeros(3)}, path)


def _nan_weights_saved_consistently(path):
    """NaN in the model written with a matching checksum: only the finiteness check can catch it."""
    t = load_file(path)
    k = next(iter(t))
    t[k] = torch.full_like(t[k], float("nan"))
    save_file(t, path)
    meta_path = os.path.join(os.path.dirname(path), "meta.json")
    meta = json.load(open(meta_path))
    meta["files"][os.path.basename(path)] = file_digest(path)
    json.dump(meta, open(meta_path, "w"))


DAMAGE = {
    "model truncated": ("model.safetensors", _truncate),
    "model one byte flipped": ("model.safetensors", _flip_byte),
    "strategy a pickle": ("strategy.safetensors", _pickle_in_place),
    "clients deleted": ("clients.rank0.safetensors", os.remove),
    "meta garbled": ("meta.json", lambda p: open(p, "w").write("{\"format\": 2, ")),
    "meta deleted": ("meta.json", os.remove),
    "meta truncated": ("meta.json", _truncate),
    "model NaN": ("model.safetensors", _nan_weights_saved_consistently),
}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    d = tmp_path_factory.mktemp("straight")
    loop = build_loop(OV + ["fl.rounds=4"], d)
    loop.run(progress_enabled=False)
    return {k: v.clone() for k, v in loop.global_params.items()}


def _three_rounds(d):
    loop = build_loop(OV + ["fl.rounds=3"], d)
    loop.run(progress_enabled=False)
    assert [os.path.basename(p) for p in list_checkpoints(str(d / "checkpoints"))] == ["round_000002", "round_000003"]


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(kind, tmp_path, caplog, straight):
    d = tmp_path / "run"
    _three_rounds(d)
    name, damage = DAMAGE[kind]
    damage(str(d / "checkpoints" / "round_000003" / name))
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        loop = build_loop(OV + ["fl.rounds=4"], d, resume=str(d))
    assert loop.round == 2
    warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warnings) == 1 and "round_000003" in warnings[0] and "\n" not in warnings[0]
    loop.run(progress_enabled=False)
    for k, v in straight.items():
        assert torch.equal(loop.global_params[k], v), k


def test_an_empty_newer_directory_is_skipped(tmp_path):
    d = tmp_path / "run"
    _three_rounds(d)
    (d / "checkpoints" / "round_000009").mkdir()
    assert build_loop(OV + ["fl.rounds=4"], d, resume=str(d)).round == 3


def test_every_checkpoint_damaged_is_one_line(tmp_path):
    d = tmp_path / "run"
    _three_rounds(d)
    for r in (2, 3):
        _truncate(str(d / "checkpoints" / f"round_00000{r}" / "model.safetensors"))
    with pytest.raises(DamagedCheckpoint) as err:
        build_loop(OV + ["fl.rounds=4"], d, resume=str(d))
    assert "every checkpoint" in str(err.value) and "\n" not in str(err.value)


def test_a_plain_file_among_the_checkpoints_is_skipped_with_one_line(tmp_path, caplog, straight):
    """A plain file where the newest checkpoint folder was (and a dangling link beyond it): each is skipped with one
    warning line; the run continues from the previous checkpoint exactly, writes its own round 3 (the file is moved
    aside, not deleted) and resumes again later."""
    import shutil

    from fl_lightning.checkpoint import format as fmt

    fmt._SKIPPED.clear()
    d = tmp_path / "run"
    _three_rounds(d)
    ck = d / "checkpoints"
    shutil.rmtree(ck / "round_000003")
    (ck / "round_000003").write_text("not a checkpoint")
    os.symlink(tmp_path / "nowhere", ck / "round_000009")
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        loop = build_loop(OV + ["fl.rounds=4"], d, resume=str(d))
        assert loop.round == 2
        loop.run(progress_enabled=False)
    lines = [r.getMessage() for r in caplog.records if "not a folder" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in ln for ln in lines), lines
    assert {"round_000003", "round_000009"} == {ln.split("checkpoint ")[1].split(" ")[0].rsplit("/", 1)[1] for ln in lines}
    for k, v in straight.items():
        assert torch.equal(loop.global_params[k], v), k
    assert (ck / "round_000003.stray").read_text() == "not a checkpoint" and (ck / "round_000003").is_dir()
    again = build_loop(OV + ["fl.rounds=5"], d, resume=str(d))  # a later resume: the newest good one, no traceback
    assert again.round == 4


def test_a_peer_lost_after_the_rename_still_names_the_checkpoint_on_disk(tmp_path):
    """Rank 0 of 2 renames the checkpoint into place, then its peer is lost at the barrier after it: the checkpoint
    is complete, and the one line the survivor prints (``newest``) names it; so does a checkpointer that never wrote
    it (the other rank's view)."""
    from fl_lightning.checkpoint import Checkpointer, TensorDict

    calls = []

    def barrier():
        calls.append(1)
        if len(calls) == 3:  # the barrier after rank 0's commit
            raise RuntimeError("Connection reset by peer")

    root = str(tmp_path / "ck")
    ck = Checkpointer(root, rank=0, world_size=2, barrier=barrier, per_rank=())
    with pytest.raises(RuntimeError, match="reset by peer"):
        ck.save(1, {"model": TensorDict({"w": torch.arange(3.0)})})
    path = os.path.join(root, "round_000001")
    assert os.path.isdir(path) and ck.newest() == path
    assert Checkpointer(root, rank=1, world_size=2).newest() == path
    assert Checkpointer(str(tmp_path / "none")).newest() is None
