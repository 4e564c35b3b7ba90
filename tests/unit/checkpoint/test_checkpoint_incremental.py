"""Incremental client checkpoints (issue 18, item 1): a checkpoint writes only the clients changed since the previous
one and refers to earlier checkpoints' client files for the rest; pruning keeps the files still referred to; a
damaged referred-to file makes every checkpoint referring to it damaged; a resume through references, with the store
in memory or on disk, continues bit-identically."""
from __future__ import annotations

import logging
import os

import pytest
import torch
from safetensors.torch import load_file

from fl_lightning.checkpoint import RETAINED, Checkpointer, DamagedCheckpoint, TensorDict, list_checkpoints
from fl_lightning.loop.client_store import ClientStateStore
from tests.helpers.cli import FAST, build_loop


def _state(c: int, version: int) -> dict:
    g = torch.Generator().manual_seed(100 * c + version)
    return {"m": torch.randn(3, 4, generator=g), "step": torch.tensor(float(version)),
            "mask": torch.rand(5, generator=g) > 0.5, "h": torch.randn(2, generator=g).to(torch.bfloat16)}


def _names(root) -> list[str]:
    return sorted(os.listdir(root))


def _chain(tmp_path, offload: bool):
    """Six clients; save 1 writes all, each later save changes one or two clients. Returns the checkpointer, the
    objects and the expected states (an independent record of what was put)."""
    store = ClientStateStore("cpu", str(tmp_path / "store") if offload else None)
    expect = {}
    model = TensorDict({"w": torch.zeros(2)})
    ck = Checkpointer(str(tmp_path / "ck"), keep_last=2)
    changes = {1: range(6), 2: [0], 3: [1, 2], 4: [0], 5: [3]}
    written = {}
    for r, cids in changes.items():
        for c in cids:
            expect[c] = _state(c, r)
            if r == 5:  # a state whose keys changed: the earlier file's stale key must not come back
                expect[c].pop("h")
            store.put(c, expect[c])
        model.tensors["w"] += 1
        path = ck.save(r, {"model": model, "clients": store})
        written[r] = sorted({int(k.split("/")[0]) for k in load_file(os.path.join(path, "clients.rank0.safetensors"))})
    return ck, store, expect, written


def _restored(tmp_path, root, offload=False) -> ClientStateStore:
    fresh = ClientStateStore("cpu", str(tmp_path / "store2") if offload else None)
    Checkpointer(root).load_latest_good({"model": TensorDict({"w": torch.zeros(2)}), "clients": fresh})
    return fresh


def _same(store, expect) -> bool:
    return sorted(store.clients()) == sorted(expect) and all(
        store.get(c).keys() == expect[c].keys() and all(torch.equal(store.get(c)[k], v) for k, v in expect[c].items())
        for c in expect)


@pytest.mark.parametrize("offload", [False, True], ids=["memory", "disk"])
def test_a_reference_chain_across_saves_with_pruning(tmp_path, offload):
    ck, store, expect, written = _chain(tmp_path, offload)
    assert written == {1: [0, 1, 2, 3, 4, 5], 2: [0], 3: [1, 2], 4: [0], 5: [3]}  # only what changed
    root = tmp_path / "ck"
    # kept: 4 and 5; clients 4, 5 still live in round 1's file, 1 and 2 in round 3's: both retained, stripped
    assert _names(root) == ["round_000001" + RETAINED, "round_000003" + RETAINED, "round_000004", "round_000005"]
    assert _names(root / ("round_000001" + RETAINED)) == ["clients.rank0.safetensors"]
    assert [os.path.basename(p) for p in list_checkpoints(str(root))] == ["round_000004", "round_000005"]
    assert _same(_restored(tmp_path, str(root), offload), expect)
    # once clients 1, 2, 4, 5 have changed again, nothing refers to rounds 1 and 3 and their folders go
    for c in (1, 2, 4, 5):
        expect[c] = _state(c, 6)
        store.put(c, expect[c])
    ck.save(6, {"model": TensorDict({"w": torch.zeros(2)}), "clients": store})
    ck.save(7, {"model": TensorDict({"w": torch.zeros(2)}), "clients": store})
    # 7 refers to 4 for client 0 and to 5 for client 3
    assert _names(root) == ["round_000004" + RETAINED, "round_000005" + RETAINED, "round_000006", "round_000007"]
    assert _same(_restored(tmp_path, str(root)), expect)


def test_damage_to_a_referenced_file_makes_the_checkpoints_referring_to_it_damaged(tmp_path, caplog):
    _chain(tmp_path, offload=False)
    root = tmp_path / "ck"
    victim = root / ("round_000001" + RETAINED) / "clients.rank0.safetensors"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    objects = {"model": TensorDict({"w": torch.zeros(2)}), "clients": ClientStateStore()}
    for r in (4, 5):
        with pytest.raises(DamagedCheckpoint, match="round_000001/clients.rank0.safetensors is not what was saved"):
            Checkpointer(str(root)).verify(str(root / f"round_00000{r}"), objects)
    with caplog.at_level(logging.WARNING, logger="fl_lightning"), pytest.raises(DamagedCheckpoint, match="every"):
        Checkpointer(str(root)).load_latest_good(objects)
    victim.unlink()
    with pytest.raises(DamagedCheckpoint, match="round_000001/clients.rank0.safetensors, which it refers to, is missing"):
        Checkpointer(str(root)).verify(str(root / "round_000005"), objects)


OV = FAST + ["fl.num_clients=12", "fl.clients_per_round=2", "fl.rounds=6", "fl.eval_every=6", "method.momentum=0.9",
             "method.parts.local_optimizer.state=persistent"]


def test_resume_through_references_with_the_offload_store_is_exact(tmp_path):
    straight = build_loop(OV + [f"store.offload_dir={tmp_path / 'off_a'}"], tmp_path / "a")
    straight.run(progress_enabled=False)
    stopped = build_loop(OV + [f"store.offload_dir={tmp_path / 'off_b'}"], tmp_path / "b")
    stopped.run(stop_after_rounds=4, progress_enabled=False)
    ckpts = tmp_path / "b" / "checkpoints"
    assert any(n.endswith(RETAINED) for n in os.listdir(ckpts)), "the resume should read a retained client file"
    assert len(load_file(str(ckpts / "round_000004" / "clients.rank0.safetensors"))) < len(stopped.store.state_dict())
    resumed = build_loop(OV + [f"store.offload_dir={tmp_path / 'off_c'}"], tmp_path / "b", resume=str(tmp_path / "b"))
    assert resumed.round == 4
    resumed.run(progress_enabled=False)
    for k, v in straight.global_params.items():
        assert torch.equal(resumed.global_params[k], v), k
    for c in straight.store.clients():
        a, b = straight.store.get(c), resumed.store.get(c)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), c


def _written(path) -> list[int]:
    return sorted({int(k.split("/")[0]) for k in load_file(os.path.join(path, "clients.rank0.safetensors"))})


def test_compaction_rewrites_the_clients_left_in_a_sparse_file_so_pruning_drops_it(tmp_path):
    """Round 1 writes clients 0-7; the save at which at most a quarter of them (2 of 8) still refer to that file
    writes those two again, and round 1's folder goes. Without compaction it is retained for them."""
    for compact, expect in ((0.25, {2: [0, 1, 2], 3: [3, 4, 5, 6, 7], 4: []}), (0.0, {2: [0, 1, 2], 3: [3, 4, 5], 4: []})):
        store, ck = ClientStateStore("cpu"), Checkpointer(str(tmp_path / f"ck{compact}"), keep_last=1, compact=compact)
        model = TensorDict({"w": torch.zeros(2)})
        for c in range(8):
            store.put(c, _state(c, 1))
        ck.save(1, {"model": model, "clients": store})
        for r, changed in ((2, [0, 1, 2]), (3, [3, 4, 5]), (4, [])):
            for c in changed:
                store.put(c, _state(c, r))
            path = ck.save(r, {"model": model, "clients": store})
            assert _written(path) == expect[r], (compact, r)
        kept = _names(tmp_path / f"ck{compact}")
        assert ("round_000001" + RETAINED in kept) == (compact == 0), kept
        assert _same(_restored(tmp_path, str(tmp_path / f"ck{compact}")),
                     {c: _state(c, 2 if c < 3 else 3 if c < 6 else 1) for c in range(8)})


def test_compaction_keeps_every_referred_file_dense_and_restores_exactly(tmp_path):
    """10 of 60 clients change per save, 40 saves: with compact=0.25 every earlier file a checkpoint refers to keeps
    more than a quarter of its clients referred to (after a restart too), and the restore is exact."""
    import random

    rnd, store, expect = random.Random(0), ClientStateStore("cpu"), {}
    ck = Checkpointer(str(tmp_path / "ck"), keep_last=2, compact=0.25)
    model = TensorDict({"w": torch.zeros(2)})
    for r in range(1, 41):
        if r == 20:  # a restart: the file sizes come back from the headers
            store = _restored(tmp_path, str(tmp_path / "ck"))
            ck = Checkpointer(str(tmp_path / "ck"), keep_last=2, compact=0.25)
            ck.load_latest_good({"model": model, "clients": store})
        for c in rnd.sample(range(60), 10):
            expect[c] = _state(c, r)
            store.put(c, expect[c])
        ck.save(r, {"model": model, "clients": store})
        where, _, sizes = ck._index["clients"]
        live = {f: sum(1 for g in where.values() if g == f) for f in set(where.values())}
        assert all(live[f] > 0.25 * sizes[f] for f in live if f != f"round_{r:06d}"), (r, live, sizes)
    assert _same(_restored(tmp_path, str(tmp_path / "ck")), expect)
