"""Every part declares what its client-side hooks read and change of the client's training tensors (``Part.reads``,
``Part.writes``, from ``strategies.base.CLIENT_TENSORS``): here every method runs two rounds with each part's hooks
watched; what a hook read (an op taking a weight, a gradient, an optimizer state or correction tensor as an input)
and what it changed (those, and the optimizer's group settings) must be declared."""
from __future__ import annotations

import os

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from fl_lightning.strategies.base import CLIENT_TENSORS, Part
from tests.helpers.cli import CONF, build_loop

METHODS = sorted(f[:-5] for f in os.listdir(os.path.join(CONF, "method")) if f.endswith(".yaml"))
HOOKS = ("client_start", "before_step", "after_backward", "after_step", "client_end", "client_idle")


def _copy(v):
    return v.detach().clone() if isinstance(v, torch.Tensor) else v


def snapshot(client) -> dict:
    """The client's training tensors, copied, under the names of CLIENT_TENSORS."""
    params = list(client.params.values())
    out = {"weights": [p.detach().clone() for p in params],
           "grads": [None if p.grad is None else p.grad.detach().clone() for p in params]}
    opt = client.optimizer
    if opt is not None:
        out["optimizer.settings"] = [{k: _copy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
        out["optimizer.state"] = {id(p): {k: _copy(v) for k, v in st.items()} for p, st in opt.state.items()}
        out["optimizer.corrections"] = {id(p): _copy(v) for p, v in (getattr(opt, "corrections", None) or {}).items()}
    return out


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(
            torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


# ops that read a tensor's metadata only (its shape, dtype, device), or make a view of it (its data read later, by
# the op that takes the view)
METADATA = {"empty_like", "zeros_like", "ones_like", "full_like", "new_empty", "new_zeros", "new_ones", "new_full",
            "empty_strided", "detach", "alias", "view", "_unsafe_view", "expand", "select", "slice", "t", "transpose",
            "permute", "unsqueeze", "squeeze", "reshape", "as_strided", "unbind", "split", "chunk", "view_as_real"}


class ReadWatch(TorchDispatchMode):
    """Which of the client's training tensors (by storage) the ops of a hook take as inputs."""

    def __init__(self, storages: dict[int, str]):
        super().__init__()
        self.storages, self.read = storages, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in METADATA:
            for t in pytree.tree_leaves((args, kwargs or {})):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    kind = self.storages.get(t.untyped_storage().data_ptr())
                    if kind is not None:
                        self.read.add(kind)
        return func(*args, **(kwargs or {}))


def storages(client) -> dict[int, str]:
    """The client's training tensors' storages, by the names of CLIENT_TENSORS (weights and grads first: an optimizer
    state entry sharing a weight's storage counts as the weight)."""
    out: dict[int, str] = {}
    opt = client.optimizer
    if opt is not None:
        for v in (getattr(opt, "corrections", None) or {}).values():
            if isinstance(v, torch.Tensor):
                out[v.untyped_storage().data_ptr()] = "optimizer.corrections"
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.numel():
                    out[v.untyped_storage().data_ptr()] = "optimizer.state"
    for p in client.params.values():
        if p.grad is not None:
            out[p.grad.untyped_storage().data_ptr()] = "grads"
        out[p.untyped_storage().data_ptr()] = "weights"
    return out


def undeclared(method: str, tmp_path, declared: str, observe) -> dict[str, list[str]]:
    """Run ``method`` two rounds with each part's client-side hooks wrapped by ``observe(client, run) -> (result,
    kinds)``; what each part did (``kinds``, from CLIENT_TENSORS) beyond its declaration ``declared`` (reads or
    writes)."""
    loop = build_loop([f"method={method}", "fl.rounds=2", "fl.num_clients=6", "fl.clients_per_round=2",
                       "fl.local_steps=5"], tmp_path)
    seen: dict[str, set] = {}
    for part in loop.strategy.parts:
        assert set(getattr(part, declared)) <= set(CLIENT_TENSORS)
        for hook in HOOKS:
            if getattr(type(part), hook) is getattr(Part, hook):
                continue

            def watched(client, _run=getattr(part, hook), _name=part.name):
                result, kinds = observe(client, _run)
                seen.setdefault(_name, set()).update(kinds)
                return result
            setattr(part, hook, watched)
    for r in range(2):
        loop.run_round(r)
    parts = {p.name: p for p in loop.strategy.parts}
    out = {n: sorted(ks - set(getattr(parts[n], declared))) for n, ks in seen.items()}
    return {n: ks for n, ks in out.items() if ks}


@pytest.mark.parametrize("method", METHODS)
def test_a_part_reads_only_what_it_declares(method, tmp_path):
    """What a part's client-side hooks read of the client's training tensors (an op taking one as an input; a
    computation it asks of the loop, a gradient at some weights, reads the weights) is declared (``Part.reads``)."""
    def observe(client, run):
        with ReadWatch(storages(client)) as watch:
            result = run(client)
        return result, watch.read
    assert undeclared(method, tmp_path, "reads", observe) == {}


@pytest.mark.parametrize("method", METHODS)
def test_a_part_changes_only_what_it_declares(method, tmp_path):
    def observe(client, run):
        before = snapshot(client)
        result = run(client)
        after = snapshot(client)
        # a changed entry, or one that came into being (the optimizer: its builder wrote all of it)
        return result, {k for k, v in after.items() if k not in before or not same(before[k], v)}
    assert undeclared(method, tmp_path, "writes", observe) == {}
