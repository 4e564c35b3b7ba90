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
from tests.helpers.cover import cases

METHODS = sorted(f[:-5] for f in os.listdir(os.path.join(CONF, "method")) if f.endswith(".yaml"))
CASES = cases(METHODS)  # the fast subset: the methods that cover every part and optimizer (tests/helpers/cover.py)


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


@pytest.mark.parametrize("method", CASES)
def test_a_part_reads_only_what_it_declares(method, tmp_path):
    """What a part's client-side hooks read of the client's training tensors (an op taking one as an input; a
    computation it asks of the loop, a gradient at some weights, reads the weights) is declared (``Part.reads``)."""
    def observe(client, run):
        with ReadWatch(storages(client)) as watch:
            result = run(client)
        return result, watch.read
    assert undeclared(method, tmp_path, "reads", observe) == {}


@pytest.mark.parametrize("method", CASES)
def test_a_part_changes_only_what_it_declares(method, tmp_path):
    def observe(client, run):
        before = snapshot(client)
        result = run(client)
        after = snapshot(client)
        # a changed entry, or one that came into being (the optimizer: its builder wrote all of it)
        return result, {k for k, v in after.items() if k not in before or not same(before[k], v)}
    assert undeclared(method, tmp_path, "writes", observe) == {}


# ----------------------------------------------------------------------------------------------------------------------
# the step plan (Part.step_plan, step/plan.py): a replayed step runs what was captured and a cohort runs the same hooks
# over stacked tensors, so the step hooks of a part that declares its plan may not wait for the device, branch on a
# tensor's value, read a host number outside its plan, rebind a tensor a later step reads, or change the optimizer's
# settings (constants of the graph)

# ops whose result a host needs before it goes on (a device's value read back, an output shaped by the data)
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive",
            "unique_dim", "equal", "is_nonzero", "bincount", "histc"}
SYNC_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__")
STEP_HOOKS = ("after_backward", "after_step")


class SyncWatch(TorchDispatchMode):
    """The ops of a hook that would wait for the device (what ``torch.cuda.set_sync_debug_mode`` reports on CUDA),
    seen on the CPU: the dispatcher's reads of a value and data-shaped ops, and the Tensor methods that copy to the
    host without one (``tolist``, ``cpu``, ``numpy``)."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []
        self._saved = {}

    def __enter__(self):
        for name in SYNC_METHODS:
            orig = getattr(torch.Tensor, name)
            self._saved[name] = orig

            def watched(t, *a, _orig=orig, _name=name, **kw):
                self.syncs.append(f"Tensor.{_name}")
                return _orig(t, *a, **kw)
            setattr(torch.Tensor, name, watched)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, orig in self._saved.items():
            setattr(torch.Tensor, name, orig)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in SYNC_OPS:
            self.syncs.append(f"aten.{func.overloadpacket.__name__}")
        return func(*args, **(kwargs or {}))


def _host_value(v) -> bool:
    """A value a replayed step would hold as a constant: not a tensor, nor a container of tensors, nor a generator."""
    if isinstance(v, (torch.Tensor, torch.Generator)) or v is None:
        return False
    if isinstance(v, dict):
        return any(_host_value(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(_host_value(x) for x in v)
    return True


class StateReads:
    """A part's Round state in a step hook's hands, recording the fields it reads."""

    def __init__(self, state):
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name):
        v = getattr(self._state, name)
        self.read.add((name, _host_value(v)))
        return v

    def __setattr__(self, name, value):
        setattr(self._state, name, value)


def graph_violations(part, client, run, plan_ref) -> list[str]:
    """What ``run(client)`` (a step hook of ``part``, which declares its step plan) does that a replay could not (the module comment)."""
    from fl_lightning.step.graphed import tensors_in

    state = client._states.get(part.name)
    own = lambda: [t.data_ptr() for t in tensors_in(vars(part), []) + (  # noqa: E731
        tensors_in(vars(state), []) if state is not None else [])]
    before, settings = own(), snapshot(client).get("optimizer.settings")
    proxy = StateReads(state) if state is not None else None
    if proxy is not None:
        client._states[part.name] = proxy
    try:
        with SyncWatch() as watch:
            run(client)
    finally:
        if proxy is not None:
            client._states[part.name] = state
    out = [f"syncs to the host ({s})" for s in dict.fromkeys(watch.syncs)]
    if proxy is not None:
        out += [f"reads the host value {name!r} of its round state, not in step_plan"
                for name, host in sorted(proxy.read) if host and name not in (part.step_plan or ())]
    if own() != before:
        out.append("rebinds a tensor of its own or of its round state (a replay reads the old one)")
    if not same(settings, snapshot(client).get("optimizer.settings")):
        out.append("changes the optimizer's settings (constants of a captured step)")
    return out


def graph_safety(loop, rounds: int = 2) -> dict[str, list[str]]:
    """Run ``rounds`` of ``loop`` with its planned parts (``Part.step_plan``)' step hooks run as while captured
    (``client.traced`` true: planned numbers read as their tensors) and watched at every step a replay would take (its planned values, the parts'
    ``step_plan``, those of the client's first step); what each part did that a replay could not."""
    from fl_lightning.step.plan import planned

    found: dict[str, list[str]] = {}
    first: dict[int, tuple] = {}  # id(client) -> the plan of its first step (the captured one)
    for part in loop.strategy.parts:
        if part.step_plan is None:
            continue
        for hook in STEP_HOOKS:
            if getattr(type(part), hook) is getattr(Part, hook):
                continue

            def watched(client, _run=getattr(part, hook), _part=part):
                p = planned(client, loop.strategy)
                if first.setdefault(id(client), p) != p:  # an eager step under graphs
                    return _run(client)
                client.traced = True  # as the capture wrapper sets it while a graph is captured
                try:
                    violations = graph_violations(_part, client, _run, p)
                finally:
                    client.traced = False
                for v in violations:
                    found.setdefault(_part.name, [])
                    if v not in found[_part.name]:
                        found[_part.name].append(v)
            setattr(part, hook, watched)
    for r in range(rounds):
        loop.run_round(r)
    return found


@pytest.mark.parametrize("method", CASES)
def test_a_planned_part_does_only_what_a_replay_can(method, tmp_path):
    """Every method's parts with a step plan (``Part.step_plan``), run as while captured over two rounds: no host sync, no
    undeclared host number, no rebound tensor, no change to the optimizer's settings at a step that would replay."""
    loop = build_loop([f"method={method}", "fl.rounds=2", "fl.num_clients=6", "fl.clients_per_round=2",
                       "fl.local_steps=5"], tmp_path)
    assert graph_safety(loop) == {}


def test_every_part_with_step_hooks_declares_its_step_plan():
    """Every part of the package with per-step hooks declares its step plan (so it runs in a cohort and replays), and the
    watcher above catches each thing a part must not do (a toy part for each)."""
    import fl_lightning.strategies.parts as parts

    hooked = [c for c in vars(parts).values() if isinstance(c, type) and issubclass(c, Part) and any(
        getattr(c, h) is not getattr(Part, h) for h in STEP_HOOKS)]
    assert {c.__name__ for c in hooked} == {"BiClip", "GlobalAlignment", "MomentumCorrection", "MuonStepOrder",
                                            "ProximalTerm", "ScaffoldCorrection", "Scallion", "SharedAdaptiveStorm",
                                            "SophiaHessian"}
    assert [c.__name__ for c in hooked if c.step_plan is None] == []


class _Unsafe(Part):
    """A part that does, in its step hook, each thing a replay cannot (chosen by ``what``)."""

    step_plan = ()

    def __init__(self, what: str):
        self.what, self.buf = what, None

    def client_start(self, client):
        from dataclasses import dataclass

        from fl_lightning.strategies.round_state import RoundState, own

        @dataclass
        class Round(RoundState):
            count: int = own(0)
        type(self).Round = Round
        client.start_state(self, Round(count=client.step))
        self.buf = torch.zeros(())

    def after_backward(self, client):
        g = next(iter(client.params.values())).grad
        if self.what == "item" and float(g.abs().sum()) > 0:
            g.mul_(1.0)
        if self.what == "branch" and g.abs().sum() > 0:
            g.mul_(1.0)
        if self.what == "host":
            g.mul_(1.0 + client.state_of(self).count)
        if self.what == "rebind":
            self.buf = g.sum()
        if self.what == "settings":
            client.optimizer.param_groups[0]["lr"] *= 0.5


@pytest.mark.parametrize("what,expected", [("item", "syncs to the host (Tensor.__float__)"),
                                           ("branch", "syncs to the host (Tensor.__bool__)"),
                                           ("host", "reads the host value 'count' of its round state, not in step_plan"),
                                           ("rebind", "rebinds a tensor"), ("settings", "changes the optimizer's settings")])
def test_the_graph_watcher_sees_what_a_replay_cannot_do(what, expected, tmp_path):
    loop = build_loop(["method=fedavg", "fl.rounds=1", "fl.num_clients=4", "fl.clients_per_round=1",
                       "fl.local_steps=2"], tmp_path)
    part = _Unsafe(what)
    part.name = "unsafe"
    loop.strategy.parts.append(part)
    found = graph_safety(loop, rounds=1)
    assert list(found) == ["unsafe"] and any(v.startswith(expected) for v in found["unsafe"]), found
