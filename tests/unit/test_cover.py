"""The fast subset's methods (tests/helpers/cover.py) still hold everything the methods run: every part class, every
local optimizer class and every pairing of the two (composed from conf/method/)."""
from __future__ import annotations

import os

import pytest

from tests.helpers.cli import CONF, make_cfg
from tests.helpers.cover import FAST, signature

pytestmark = pytest.mark.slow  # composes every method (~15 s)


def test_the_fast_methods_cover_every_part_optimizer_and_pairing():
    methods = sorted(f[:-5] for f in os.listdir(os.path.join(CONF, "method")) if f.endswith(".yaml"))
    assert FAST <= set(methods), FAST - set(methods)
    sig = {m: signature(make_cfg([f"method={m}"], "unused")) for m in methods}
    everything = set().union(*sig.values())
    covered = set().union(*(sig[m] for m in FAST))
    assert everything - covered == set(), sorted(everything - covered)
