"""One rule for bits, every codec: a value travels at its tensor's width (fp32 32, fp64 64, bf16 16 bits: the
coordinates, a per-tensor scale, SVD factors), an index into d entries costs ⌈log₂ d⌉ bits (0 for d = 1).
Each count below is written out by hand for d = 1, 3, 1000 (k and the index bits as numbers, not from the codec)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fl_lightning.codecs import (Clamp, Dense, ErrorFeedback, HeavySign, LionMomentum, LowRankSVD, Quantize, RandK,
                                 ScaledSign, Sign, SignSteps, TopK)

WIDTH = {torch.float32: 32, torch.float64: 64, torch.bfloat16: 16}
IB = {1: 0, 3: 2, 1000: 10}              # ⌈log₂ d⌉
K_1PCT = {1: 1, 3: 1, 1000: 10}          # max(1, ⌈0.01 d⌉)
K_10PCT = {1: 1, 3: 1, 1000: 100}        # max(1, ⌈0.1 d⌉)
K_HALF = {1: 1, 3: 2, 1000: 500}         # ⌈0.5 d⌉


def hs_bits(d, w):  # HeavySign(0.01): k heavy values + indices, d - k signs and one scale when d - k > 0
    k = K_1PCT[d]
    return k * (w + IB[d]) + ((d - k) + w if d > k else 0)


CASES = {
    "Dense": (lambda: Dense(), lambda d, w: d * w),
    "Sign": (lambda: Sign(), lambda d, w: d),
    "Sign+1": (lambda: Sign(sign_zero="+1"), lambda d, w: d),
    "ScaledSign": (lambda: ScaledSign(), lambda d, w: d + w),
    "TopK": (lambda: TopK(0.01), lambda d, w: K_1PCT[d] * (w + IB[d])),
    "TopK-int32": (lambda: TopK(0.5, index_bits=32), lambda d, w: K_HALF[d] * (w + 32)),
    "TopK-all": (lambda: TopK(1.0), lambda d, w: d * (w + IB[d])),
    "RandK": (lambda: RandK(0.1), lambda d, w: K_10PCT[d] * (w + IB[d])),
    "HeavySign": (lambda: HeavySign(0.01), hs_bits),
    "HeavySign-all": (lambda: HeavySign(1.0), lambda d, w: d * (w + IB[d])),
    "Quantize3": (lambda: Quantize(3, scale="none"), lambda d, w: 3 * d),
    "Quantize8-max": (lambda: Quantize(8, scale="max"), lambda d, w: 8 * d + w),
    "SignSteps-K3": (lambda: SignSteps(0.1), lambda d, w: 3 * d),       # ⌈log₂(2·3 + 1)⌉ = 3 bits
    "LionMomentum": (lambda: LionMomentum(Sign()), lambda d, w: d),
    "EF-TopK": (lambda: ErrorFeedback(TopK(0.01)), lambda d, w: K_1PCT[d] * (w + IB[d])),
    "EF-ScaledSign": (lambda: ErrorFeedback(ScaledSign()), lambda d, w: d + w),
    "LowRankSVD-vector": (lambda: LowRankSVD(), lambda d, w: d * w),    # 1-D tensors travel dense
    "Clamp-LowRankSVD": (lambda: Clamp(LowRankSVD()), lambda d, w: d * w),
}


@pytest.mark.parametrize("dtype", list(WIDTH), ids=["fp32", "fp64", "bf16"])
@pytest.mark.parametrize("d", [1, 3, 1000])
@pytest.mark.parametrize("name", list(CASES))
def test_bits_are_the_hand_count(name, d, dtype):
    make, count = CASES[name]
    v = torch.randn(d, generator=torch.Generator().manual_seed(d), dtype=torch.float64).to(dtype)
    client = SimpleNamespace(step=3, lr_factor=1.0)
    codec = make()
    kw = {"client": client} if getattr(codec, "uses_client", False) else {}
    msg = codec.encode(v, {}, rng=torch.Generator().manual_seed(0), **kw)
    assert msg.bits() == count(d, WIDTH[dtype])
    assert msg.tensor.shape == v.shape


@pytest.mark.parametrize("dtype", list(WIDTH), ids=["fp32", "fp64", "bf16"])
def test_lowrank_factors_travel_at_the_tensor_width(dtype):
    """A 20 × 50 matrix at storage_frac 0.2: r = int(0.2·1000/71) = 2, factors 20·2 + 2 + 2·50 = 142 values."""
    v = torch.randn(20, 50, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    assert LowRankSVD(frac=0.2).encode(v).bits() == 142 * WIDTH[dtype]


def test_heavy_sign_at_frac_one_is_the_tensor():
    """At k = d nothing is left to sign: the tensor itself, TopK(1)'s bits (no scale)."""
    v = torch.tensor([0.5, -2.0, 0.0, 3.0], dtype=torch.float64)
    m, t = HeavySign(1.0).encode(v), TopK(1.0).encode(v)
    assert torch.equal(m.tensor, v) and m.bits() == t.bits() == 4 * (64 + 2)
