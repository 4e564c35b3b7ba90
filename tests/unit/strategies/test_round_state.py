"""A part's per-client state of a round as a typed value (fl_lightning/strategies/round_state.py): stacked for a cohort
and handed back row by row, declared once per part, the same step function for one client and for a cohort."""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest
import torch

from fl_lightning.strategies import parts as parts_pkg
from fl_lightning.strategies.base import ClientContext, Part
from fl_lightning.strategies.round_state import RoundState, own, rows, shared


@dataclass
class Example(RoundState):
    acc: dict = rows(default_factory=dict)
    m: list = rows(default_factory=list)
    t0: int = rows(0)
    x: torch.Tensor | None = rows()
    delta: dict = shared(default_factory=dict)
    note: str = own("")


def _state(i: int) -> Example:
    return Example(acc={"w": torch.full((2, 3), float(i))}, m=[torch.full((4,), 10.0 + i)], t0=5 * i,
                   x=torch.tensor(float(i)), delta={"w": torch.ones(2, 3)}, note=f"client {i}")


def test_stacked_rows_shared_and_own():
    states = [_state(i) for i in range(3)]
    st = Example.stacked(states)
    assert st.acc["w"].shape == (3, 2, 3) and torch.equal(st.acc["w"][2], torch.full((2, 3), 2.0))
    assert st.m[0].shape == (3, 4) and torch.equal(st.m[0][:, 0], torch.tensor([10.0, 11.0, 12.0]))
    assert st.t0 == [0, 5, 10] and torch.equal(st.x, torch.tensor([0.0, 1.0, 2.0]))
    assert st.delta is states[0].delta  # the same for every client: the first client's, not stacked
    assert st.note is None  # the client's own: not the cohort's


def test_unstack_hands_each_client_its_rows_as_views():
    states = [_state(i) for i in range(3)]
    st = Example.stacked(states)
    st.acc["w"].add_(100.0)  # a step on the stacked state
    st.m[0].mul_(2.0)
    mine = _state(1)
    st.unstack_into(1, mine)
    assert torch.equal(mine.acc["w"], torch.full((2, 3), 101.0)) and torch.equal(mine.m[0], torch.full((4,), 22.0))
    assert mine.acc["w"].data_ptr() == st.acc["w"][1].data_ptr()  # a view, no copy
    assert mine.t0 == 5 and mine.note == "client 1"  # host numbers and own fields stay the client's


def test_an_undeclared_field_is_refused():
    @dataclass
    class Bad(RoundState):
        y: int = 0

    with pytest.raises(TypeError, match=r"Bad.y: declare it with rows\(\), shared\(\) or own\(\)"):
        Bad.stacked([Bad(), Bad()])


def test_a_part_starts_only_the_state_it_declares():
    class P(Part):
        name = "p"
        Round = Example

    client = ClientContext(id=0, round=0, module=torch.nn.Linear(1, 1), params={}, local={}, global_params={},
                           state={}, num_samples=1, num_steps=1, lr_factor=1.0)
    st = client.start_state(P(), _state(0))
    assert client.state_of(P()) is st
    with pytest.raises(RuntimeError, match="declares Example"):
        client.start_state(P(), object())


def _part_classes():
    return [c for _, c in inspect.getmembers(parts_pkg, inspect.isclass) if issubclass(c, Part) and c is not Part]


def test_every_parts_round_state_is_declared_field_by_field():
    declared = [c for c in _part_classes() if c.Round is not None]
    assert len(declared) >= 10
    for c in declared:
        assert issubclass(c.Round, RoundState), c
        c.Round.kinds()  # every field says how a cohort holds it


# parts whose batched step differs from their one-client step: per-client host numbers decided before the step
# (FAFED's 1 − α and η, Sophia's refresh steps) and Alg. 1's last step taken with lr = 0 (MuonStepOrder)
OWN_BATCHED_FORM = {"MuonStepOrder", "SharedAdaptiveStorm", "SophiaHessian"}


def test_the_step_hooks_are_one_function_for_one_client_and_for_a_cohort():
    """A part with a step plan: its cohort step hooks are its own after_backward / after_step (the default), except the few
    whose batched form must differ."""
    for c in _part_classes():
        if c.step_plan is None:
            continue
        own_form = [h for h in ("cohort_after_backward", "cohort_after_step") if getattr(c, h) is not getattr(Part, h)]
        assert bool(own_form) == (c.__name__ in OWN_BATCHED_FORM), (c.__name__, own_form)
        assert getattr(c, "cohort_start") is Part.cohort_start and getattr(c, "cohort_end") is Part.cohort_end, c
