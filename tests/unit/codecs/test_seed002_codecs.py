"""The codecs of seed 002's comparison methods (issue 14) against direct formulas: RandK (unbiased, the client's
generator, SCALLION), HeavySign (our hv-sign: heavy values + scaled sign of the rest, fedef_hs), SignSteps (FedLion's
integer Δ at ⌈log₂(2K+1)⌉ bits)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fl_lightning.codecs import HeavySign, RandK, ScaledSign, SignSteps, TopK
from fl_lightning.config.args import checked
from fl_lightning.errors import ConfigError

V = torch.tensor([0.5, -2.0, 0.0, 3.0, -0.25, 1.0, 0.75, -1.5])


def test_randk_is_unbiased_and_reproducible():
    c = RandK(0.25)  # k = 2 of 8, scale 4; bits k (32 + 3)
    a = c.encode(V, rng=torch.Generator().manual_seed(5))
    b = c.encode(V, rng=torch.Generator().manual_seed(5))
    assert torch.equal(a.tensor, b.tensor) and a.nbits == 2 * (32 + 3)
    nz = a.tensor != 0
    assert int(nz.sum()) <= 2 and torch.equal(a.tensor[nz], 4 * V[nz])
    g = torch.Generator().manual_seed(0)
    mean = sum(c.encode(V, rng=g).tensor for _ in range(1000)) / 1000
    torch.testing.assert_close(mean, V, atol=0.6, rtol=0)  # E[C(v)] = v (sd of the 3.0 entry: 0.16; unscaled: 0.75)
    assert c.omega(8) == 3.0
    with pytest.raises(ValueError):
        c.encode(V)  # no generator
    with pytest.raises(ConfigError):
        checked(RandK, 0.0)


def test_heavy_sign_is_neither_topk_nor_scaled_sign():
    m = HeavySign(0.25).encode(V)  # k = 2: 3.0 and -2.0 exactly; the rest: mean |.| = 4.0 / 6 times sign
    want = torch.sign(V) * (4.0 / 6)
    want[3], want[1] = 3.0, -2.0
    torch.testing.assert_close(m.tensor, want)
    assert m.nbits == 2 * (32 + 3) + 6 + 32
    assert not torch.equal(m.tensor, ScaledSign().encode(V).tensor)
    assert not torch.equal(m.tensor, TopK(0.25).encode(V).tensor)


def test_sign_steps_rebuilds_the_integer_grid():
    client = SimpleNamespace(step=3, lr_factor=0.5)  # gamma = 0.2 * 0.5; K = 3: 3 bits per coordinate
    delta = torch.tensor([0.1, -0.3, 0.0, 0.2 + 1e-9, 0.7])
    m = SignSteps(0.2).encode(delta, client=client)
    torch.testing.assert_close(m.tensor, torch.tensor([0.1, -0.3, 0.0, 0.2, 0.3]))  # 0.7 clamps to K = 3 steps
    assert m.nbits == 3 * 5
    assert SignSteps(0.2).encode(delta, client=SimpleNamespace(step=50, lr_factor=1.0)).nbits == 7 * 5  # K = 50
