"""Checkpoints written behind the next round (issue 18, item 1; ``checkpoint.background_mb``): ``save`` copies the
states and returns, a thread writes the checkpoint; what lands is the state at the save, not what the next round
does to it; the next save and ``wait`` wait for it and re-raise its error; writes above the limit, or with
several processes, happen in ``save``; a run through the CLI's builder resumes bit-exactly with it on."""
from __future__ import annotations

import errno
import os
import threading

import pytest
import torch
from safetensors.torch import load_file

import fl_lightning.checkpoint.writer as ckpt_mod
from fl_lightning.checkpoint import Checkpointer, TensorDict, list_checkpoints
from fl_lightning.loop.client_store import ClientStateStore
from tests.helpers.cli import FAST, build_loop


def _held_writer(monkeypatch) -> threading.Event:
    """The background writer waits at its first file until the returned event is set."""
    go, write = threading.Event(), ckpt_mod._put

    def held(*args, **kwargs):
        assert go.wait(30), "the test never released the writer"
        return write(*args, **kwargs)

    monkeypatch.setattr(ckpt_mod, "_put", held)
    return go


def _objects():
    store = ClientStateStore("cpu")
    for c in range(3):
        store.put(c, {"m": torch.full((4,), float(c)), "step": torch.tensor(1.0)})
    return {"model": TensorDict({"w": torch.arange(3.0)}), "clients": store}


def _restore(root: str) -> dict:
    objects = {"model": TensorDict({"w": torch.zeros(3)}), "clients": ClientStateStore("cpu")}
    Checkpointer(root).load_latest_good(objects)
    return objects


def test_the_checkpoint_holds_the_state_at_the_save_not_later_changes(tmp_path, monkeypatch):
    go = _held_writer(monkeypatch)
    objects = _objects()
    ck = Checkpointer(str(tmp_path / "ck"), background_bytes=1 << 20)
    path = ck.save(1, objects)
    assert not os.path.exists(path) and ck._thread is not None  # written behind: not in place yet
    # what the next round does while the writer waits: in place on the model and a stored client state, a new state
    objects["model"].tensors["w"].mul_(-1)
    state = objects["clients"].checkout(1)  # client 1 trains: its stored tensors are changed in place, then checked in
    state["m"].fill_(99.0)
    objects["clients"].checkin(1, state)
    objects["clients"].put(2, {"m": torch.full((4,), 7.0), "step": torch.tensor(2.0)})
    go.set()
    ck.wait()
    assert list_checkpoints(str(tmp_path / "ck")) == [path] and ck.last == path
    got = _restore(str(tmp_path / "ck"))
    assert torch.equal(got["model"].tensors["w"], torch.arange(3.0))
    assert [got["clients"].get(c)["m"][0].item() for c in range(3)] == [0.0, 1.0, 2.0]
    # the client changed during the write is in the next checkpoint, the others are referred to
    path2 = ck.save(2, objects)
    ck.wait()
    assert sorted(load_file(os.path.join(path2, "clients.rank0.safetensors"))) == ["1/m", "1/step", "2/m", "2/step"]
    got = _restore(str(tmp_path / "ck"))
    assert [got["clients"].get(c)["m"][0].item() for c in range(3)] == [0.0, 99.0, 7.0]


def test_a_failed_background_write_is_raised_by_the_next_save_and_leaves_the_previous(tmp_path, monkeypatch):
    objects = _objects()
    ck = Checkpointer(str(tmp_path / "ck"), background_bytes=1 << 20)
    first = ck.save(1, objects)
    ck.wait()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt_mod, "_put", full)
    ck.save(2, objects)
    with pytest.raises(OSError, match="No space left"):
        ck.save(3, objects)
    assert list_checkpoints(str(tmp_path / "ck")) == [first] and ck.last == first
    assert sorted(os.listdir(tmp_path / "ck")) == ["round_000001"]  # the half-written folder was removed
    ck.wait()  # the error was handed over once


def test_writes_above_the_limit_or_with_the_limit_zero_happen_in_save(tmp_path):
    for limit in (0, 8):  # 3 clients × 20 bytes of state > 8
        ck = Checkpointer(str(tmp_path / f"ck{limit}"), background_bytes=limit)
        path = ck.save(1, _objects())
        assert ck._thread is None and os.path.isdir(path) and ck.last == path


def test_several_processes_write_in_save(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"), background_bytes=1 << 20, world_size=2)
    assert not ck._snapshot(1, _objects()).copied


@pytest.mark.parametrize("offload", [False, True], ids=["memory", "disk"])
def test_a_run_written_behind_resumes_bit_exactly(tmp_path, offload):
    """With the builder's default (checkpoints written behind), a run stopped after 2 rounds and resumed equals an
    uninterrupted one; the run returns only once its last checkpoint is in place."""
    over = FAST + ["fl.rounds=4", "method=fedavg_adam"]
    store = (lambda name: [f"store.offload_dir={tmp_path / name}"]) if offload else (lambda name: [])
    whole = build_loop(over + store("whole"), tmp_path / "whole")
    assert whole.checkpointer.background_bytes == 512 << 20
    whole.run(progress_enabled=False)
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path / "whole" / "checkpoints"))] == [
        "round_000003", "round_000004"]
    part = build_loop(over + store("part"), tmp_path / "part")
    part.run(stop_after_rounds=2, progress_enabled=False)
    resumed = build_loop(over + store("resumed"), tmp_path / "part", resume=str(tmp_path / "part"))
    assert resumed.round == 2
    resumed.run(progress_enabled=False)
    for k, v in whole.global_params.items():
        assert torch.equal(v, resumed.global_params[k]), k


def test_a_checkpoint_written_behind_has_the_same_bytes_as_one_written_in_save(tmp_path):
    roots = {}
    for limit in (0, 1 << 20):
        objects, ck = _objects(), Checkpointer(str(tmp_path / f"ck{limit}"), background_bytes=limit)
        for r in (1, 2):  # the second refers to the first for clients 0 and 2
            objects["clients"].put(1, {"m": torch.full((4,), float(r)), "step": torch.tensor(float(r))})
            ck.save(r, objects)
        ck.wait()
        roots[limit] = tmp_path / f"ck{limit}"
    for r in ("round_000001", "round_000002"):
        names = sorted(os.listdir(roots[0] / r))
        assert names == sorted(os.listdir(roots[1 << 20] / r)) and "clients.rank0.json" in names
        for f in names:
            assert (roots[0] / r / f).read_bytes() == (roots[1 << 20] / r / f).read_bytes(), (r, f)
