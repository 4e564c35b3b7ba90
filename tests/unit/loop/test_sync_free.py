"""The per-step hot path makes no host-device synchronising call (issue 18, item 2).

On the CPU a synchronising call cannot be observed, so a patched counter records every call that would synchronise
on a GPU when made from fl_lightning's own code: ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool()`` /
``float()`` / ``int()`` of a tensor, and ``.to(...)`` to a device without ``non_blocking=True`` (a blocking copy). A
client trained with K = 2 and K = 6 local steps must make the same number of such calls: none per step (a few per
client are allowed: the round's mean loss, the optimizer state's numbers). torch's own calls (e.g. Adam reading its
CPU ``step`` counter) are not counted. With a GPU, the same local training runs under
``torch.cuda.set_sync_debug_mode("error")``.
"""
from __future__ import annotations

import collections
import os
import sys

import pytest
import torch

from fl_lightning.config import StepBudget
from fl_lightning.data.augment import ImageTransform
from tests.helpers.cli import FAST, build_loop

PKG = os.path.dirname(os.path.abspath(sys.modules["fl_lightning"].__file__))
SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


@pytest.fixture
def sync_calls(monkeypatch):
    """A Counter of (call, file, line) for synchronising calls made from fl_lightning's code."""
    hits: collections.Counter = collections.Counter()

    def counting(name, orig):
        def f(self, *args, **kw):
            if name == "to" and (kw.get("non_blocking") or not _has_device(args, kw)):
                return orig(self, *args, **kw)
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(PKG):
                hits[(name, os.path.relpath(caller, PKG), sys._getframe(1).f_lineno)] += 1
            return orig(self, *args, **kw)
        return f

    for name in SYNCING + ("to",):
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    return hits


def _has_device(args, kw) -> bool:
    return "device" in kw or any(isinstance(a, (str, torch.device)) for a in args)


def _client_calls(tmp_path, method: str, k: int, hits) -> collections.Counter:
    loop = build_loop(FAST + [f"method={method}", f"fl.local_steps={k}"], tmp_path / f"{method}{k}")
    loop.run_round(0)  # the client trained next has state from round 0 when the method keeps one
    received = {key: m.tensor for key, m in loop.strategy.broadcast(1).items()}
    cid = loop.owned[0]
    hits.clear()
    loop.train_client(cid, 1, received, 1.0)
    return collections.Counter(hits)


@pytest.mark.parametrize("method", ["fedavg_adam", "scaffold", "fedmuon", "fedpac_soap", "fed_sophia", "fedlada"])
def test_no_synchronising_call_per_local_step(tmp_path, sync_calls, method):
    few, many = _client_calls(tmp_path, method, 2, sync_calls), _client_calls(tmp_path, method, 6, sync_calls)
    per_step = {site: (few[site], n) for site, n in many.items() if n != few[site]}
    assert not per_step, f"synchronising calls that grow with the local steps (K=2, K=6): {per_step}"


def test_augmentation_moves_its_randomness_in_one_non_blocking_copy(sync_calls):
    t = ImageTransform([0.5, 0.4, 0.3], [0.2, 0.2, 0.2], augment=True)
    batch = {"x": torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8), "y": torch.zeros(8)}
    t(batch, torch.Generator().manual_seed(0))  # moves mean/std to the batch's device once
    sync_calls.clear()
    for s in range(3):
        t(batch, torch.Generator().manual_seed(s))
    assert not sync_calls, dict(sync_calls)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("method", ["fedavg_adam", "scaffold", "fedmuon"])
def test_no_synchronising_call_per_local_step_cuda(tmp_path, method):
    """From the second local step's forward to the last step's hooks, any synchronisation raises."""
    ov = [o for o in FAST if not o.startswith("trainer.accelerator")] + ["trainer.accelerator=cuda",
                                                                         f"method={method}", "fl.local_steps=4",
                                                                         "trainer.cohort=1", "trainer.compile=none"]
    loop = build_loop(ov, tmp_path / method)
    loop.run_round(0)
    received = {key: m.tensor for key, m in loop.strategy.broadcast(1).items()}
    forward, after_step = loop.module.training_step, loop.strategy.after_step

    def step(batch, k):
        if k == 1:
            torch.cuda.set_sync_debug_mode("error")
        return forward(batch, k)

    def after(client):
        after_step(client)
        if client.step + 1 == client.num_steps:  # the mean loss of the round is read after the last step (hooks
            # inside a step see the steps done before it)
            torch.cuda.set_sync_debug_mode(0)

    loop.module.training_step, loop.strategy.after_step = step, after
    try:
        loop.train_client(loop.owned[0], 1, received, 1.0)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_store_round_trip_through_reused_pinned_staging():
    """checkin/checkout through the pinned staging buffers: values, dtypes and shapes kept; the stored states are
    not pinned; the staging buffer is reused (not reallocated) across clients; 0-d tensors stay on the CPU."""
    from fl_lightning.loop.client_store import ClientStateStore

    store = ClientStateStore("cuda")
    g = torch.Generator().manual_seed(0)
    state = {"m": torch.randn(5, 7, generator=g), "t": torch.randn(7, 5, generator=g).mT, "b": torch.rand(9, generator=g) > .5,
             "h": torch.randn(3, generator=g).to(torch.bfloat16), "step": torch.tensor(3.0), "e": torch.zeros(0)}
    for cid in (0, 1):
        store.checkin(cid, {k: v if v.ndim == 0 else v.cuda() for k, v in state.items()})
    buf = store._stage["out"].data_ptr()
    store.checkin(2, {k: v if v.ndim == 0 else v.cuda() for k, v in state.items()})
    assert store._stage["out"].data_ptr() == buf
    for cid in (0, 1, 2):
        assert all(not t.is_pinned() for t in store.get(cid).values())
        out = store.checkout(cid)
        assert out["step"].device.type == "cpu" and out["m"].device.type == "cuda"
        for k, v in state.items():
            assert out[k].dtype == v.dtype and torch.equal(out[k].cpu(), v), k


def _reference_batches(data, client: int, r: int, local_steps=None, local_epochs=None) -> list:
    """The batch recipe drawn lazily, batch by batch (as before issue 18): shuffled passes from the (seed, client,
    round) generator, each batch cropped and flipped with numbers drawn from the same generator right then."""
    from fl_lightning import seeding
    from fl_lightning.data.augment import random_crop_flip

    g = seeding.generator(data.seed, seeding.CLIENT_DATA, client, r + 1)
    idx, x_all = data.client_indices[client], data.train.tensors["x"]
    n, bs, takes = len(idx), min(data.batch_size, len(idx)), []
    if local_steps:
        stream = torch.empty(0, dtype=torch.long)
        for _ in range(local_steps):
            while len(stream) < bs:
                stream = torch.cat([stream, idx[torch.randperm(n, generator=g)]])
            takes.append(stream[:bs])
            stream = stream[bs:]
            takes[-1] = (takes[-1], random_crop_flip(x_all[takes[-1]], g))
    else:
        for _ in range(local_epochs):
            order = idx[torch.randperm(n, generator=g)]
            for s in range(0, n, bs):
                takes.append((order[s:s + bs], random_crop_flip(x_all[order[s:s + bs]], g)))
    return takes


@pytest.mark.parametrize("how", [{"local_steps": 7}, {"local_epochs": 2}])
def test_augmented_batches_drawn_ahead_equal_the_batch_by_batch_recipe(how, sync_calls):
    from fl_lightning.data.federated import FederatedData
    from fl_lightning.data.tensors import TensorSet

    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8, generator=g), torch.randint(0, 3, (40,), generator=g)
    t = ImageTransform([0.5, 0.4, 0.3], [0.2, 0.2, 0.2], augment=True)
    data = FederatedData(TensorSet({"x": x, "y": y}, t), TensorSet({"x": x, "y": y}, t), None,
                         [torch.arange(0, 13).numpy(), torch.arange(13, 40).numpy()], batch_size=5, seed=3)
    list(data.client_batches(0, 0, "cpu", StepBudget(steps=1)))  # moves mean/std to the device once
    sync_calls.clear()
    got = list(data.client_batches(1, 2, "cpu", StepBudget(how.get("local_steps"), how.get("local_epochs"))))
    assert not sync_calls, dict(sync_calls)  # no blocking copy, per batch or otherwise
    ref = _reference_batches(data, 1, 2, **how)
    assert len(got) == len(ref) == (7 if "local_steps" in how else 12)
    for b, (take, crops) in zip(got, ref):
        assert torch.equal(b["y"], y[take])
        assert torch.equal(b["x"], (crops.float() / 255 - t.mean) / t.std)
