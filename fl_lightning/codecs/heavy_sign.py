"""HeavySign: the k largest-magnitude coordinates exactly, the sign of the others with one scale (our reading).

Seed 002 (FedSMU, anonymous, under review) runs "FedEF-HS = FedEF-SGD-hv-sign" (its Sec. 5.1) and does not define
the hv-sign compressor, and we could not pin it to the Fed-EF paper (Li & Li, ICML 2023, arXiv 2211.14292); this is
our stated form (decision 002/#7 in docs/decisions.md), not the paper's: "heavy values + sign". With
k = max(1, ⌈frac·d⌉) per tensor (TopK's rule; ``frac`` default 1 %), the receiver rebuilds v_j on the top-k
coordinates and (‖v_rest‖₁/(d − k))·sign(v_j) on the other d − k (the scaled sign of EF-SignSGD on the rest). Bits
(one rule for every codec, ``codecs/base.py``): k·(w + ⌈log₂ d⌉) for the heavy part (TopK's count), d − k sign bits
and one scale of w bits when d − k > 0, with w the tensor's value width. At ``frac = 1`` nothing is left to sign: it
is TopK(1), the identity. It is a δ-compressor (it keeps at least TopK's energy), so it fits under ``ErrorFeedback``.
"""
from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor

from ..messages import Msg
from ..config import Range
from .base import index_bits, value_bits


class HeavySign:
    def __init__(self, frac: Annotated[float, Range(0.0, 1.0, open_low=True)] = 0.01):
        self.frac = float(frac)

    def k(self, d: int) -> int:
        return max(1, min(d, math.ceil(self.frac * d)))

    def encode(self, tensor: Tensor, state=None, rng=None) -> Msg:
        v = tensor.detach()
        flat = v.reshape(-1)
        d = flat.numel()
        k = self.k(d)
        w = value_bits(v)
        heavy = torch.zeros_like(flat, dtype=torch.bool)
        heavy[flat.abs().topk(k, sorted=False).indices] = True
        rest = d - k
        if rest == 0:
            return Msg(flat.clone().view_as(v), nbits=k * (w + index_bits(d)))
        scale = torch.where(heavy, torch.zeros_like(flat), flat).abs().sum() / rest
        out = torch.where(heavy, flat, torch.sign(flat) * scale)
        return Msg(out.view_as(v), nbits=k * (w + index_bits(d)) + rest + w)
