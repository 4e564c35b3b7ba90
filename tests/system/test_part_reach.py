"""What a part's client-side hooks can reach: for every method, the objects reachable from what the step hooks are
handed (a client's context with its services, and a cohort's narrow services and optimizer) hold no loop, client
store, checkpointer, recorder or cohort engine (docs/design.md, "The local step"). The walk follows attributes,
dicts, lists, tuples and bound methods, as a part's code could."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.cli import build_loop
from tests.helpers.golden import methods

SETTING = ["fl.rounds=1", "fl.num_clients=4", "fl.clients_per_round=2", "fl.local_steps=1", "trainer.progress=false",
           "trainer.threads=1"]


def _forbidden() -> tuple[type, ...]:
    from fl_lightning.checkpoint import Checkpointer
    from fl_lightning.loop.client_store import ClientStateStore
    from fl_lightning.cohort.engine import Cohort
    from fl_lightning.loop import FederatedLoop
    from fl_lightning.recorder import RunRecorder

    return FederatedLoop, ClientStateStore, Checkpointer, RunRecorder, Cohort


def reachable(roots: list, forbidden: tuple[type, ...], limit: int = 200_000) -> list[str]:
    """Paths from ``roots`` to an instance of ``forbidden`` (tensors, modules' parameters and classes are leaves)."""
    seen, found = set(), []
    stack = [(r, name) for name, r in roots]
    while stack and len(seen) < limit:
        obj, path = stack.pop()
        if id(obj) in seen or isinstance(obj, (torch.Tensor, type, str, bytes, int, float, bool)) or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, forbidden):
            found.append(f"{path}: {type(obj).__name__}")
            continue
        if isinstance(obj, dict):
            children = [(v, f"{path}[{k!r}]") for k, v in obj.items()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(obj)]
        elif hasattr(obj, "__self__") and hasattr(obj, "__func__"):  # a bound method: its object
            children = [(obj.__self__, f"{path}.__self__")]
        elif hasattr(obj, "__dict__"):
            children = [(v, f"{path}.{k}") for k, v in vars(obj).items()]
        else:
            children = []
        if callable(obj) and getattr(obj, "__closure__", None):  # a closure's cells (a lambda handed to a part)
            children += [(c.cell_contents, f"{path}.<closure>") for c in obj.__closure__ if c.cell_contents is not None]
        stack.extend(children)
    return found


@pytest.mark.slow
def test_no_part_can_reach_the_loop_the_store_the_checkpointer_or_the_recorder(tmp_path):
    """Every method, sequential and as a cohort of 2: a started client's context (what its hooks get: module, optimizer,
    state, round states, services) and the cohort's services reach none of the run's components."""
    forbidden, bad = _forbidden(), {}
    for i, name in enumerate(methods()):
        loop = build_loop([f"method={name}", *SETTING, "trainer.cohort=2"], tmp_path / str(i))
        received = {k: m.tensor for k, m in loop.strategy.broadcast(0).items()}
        client = loop.start_client(0, 0, received, 1.0)
        found = reachable([("client", client), ("cohort.services", loop.cohort.services),
                           ("cohort.step.forward", loop.cohort.step.forward)], forbidden)
        if found:
            bad[name] = found[:3]
    assert not bad, bad


def test_the_walk_finds_a_loop_behind_a_bound_method_or_a_closure(tmp_path):
    """The walk itself: a services object holding a loop's bound method, or a closure over the loop, is caught."""
    from types import SimpleNamespace

    class Loop:
        def go(self):
            return self

    loop = Loop()
    assert reachable([("s", SimpleNamespace(f=loop.go))], (Loop,)) == ["s.f.__self__: Loop"]
    assert reachable([("s", SimpleNamespace(f=lambda: loop))], (Loop,)) == ["s.f.<closure>: Loop"]
    assert reachable([("s", SimpleNamespace(f=len))], (Loop,)) == []
