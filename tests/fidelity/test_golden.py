"""Behaviour locked: every method yaml, 2 rounds of the default digits run with 1 thread, in this process, must give
the recorded digest (global weights + server state) and metrics bit for bit (tests/fidelity/golden.json, written by
``python -m tests.helpers.golden --write``). A change is a named bug fix: say it in the commit message and in
docs/decisions.md, then re-record that method."""
from __future__ import annotations

import pytest

from tests.helpers import golden

RECORDED = golden.load()


def test_every_method_is_recorded():
    assert sorted(RECORDED) == golden.methods()


@pytest.mark.parametrize("name", golden.methods())
def test_method_is_bit_identical_to_its_golden_record(name):
    if name not in RECORDED:
        pytest.fail(f"{name} has no golden record: python -m tests.helpers.golden --write {name}")
    got = golden.run_method(name)
    want = RECORDED[name]
    assert got["metrics"] == want["metrics"], name
    assert got["digest"] == want["digest"], name
