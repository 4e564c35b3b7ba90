"""LionMomentum: FedSMU's client-side Lion compressor (the FedSMU paper's Alg. 1 lines 11–12), a codec with memory.

For the client's model delta g (a descent direction, ≈ −η·Σ∇F), with the client's persistent momentum m (zero at
its first participation, frozen while it is not sampled: only an upload touches it):

    v ← β1·m + (1 − β1)·g          (Lion's interpolation; v^i_t in the paper's App. D)
    u ← inner(v)                   (``Sign()`` by default: 1 bit per coordinate; ``Quantize(b)`` for the α-bit variants)
    m ← β2·m + (1 − β2)·g          (the OLD m enters v, the new m is stored)

Anonymous, "FedSMU: Communication-Efficient and Generalization-Enhanced Federated Learning through Symbolic Model
Updates" (under review), Alg. 1; Lion: Chen et al., NeurIPS 2023, arXiv 2302.06675, Alg. 2. What travels and its
bits are the inner codec's (u); m is the codec's own state ``"lion_m"`` (the client's ``"<key>/lion_m"``; fp32 at
least), is checkpointed with the client and never travels. One vector per client (as Alg. 1; decision 002/#22 in
docs/decisions.md).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import check_codec
from ..messages import Msg
from ..config import Fraction
from .sign import Sign


class LionMomentum:
    def __init__(self, inner=None, beta1: Fraction = 0.9, beta2: Fraction = 0.9):
        check_codec(inner, "inner", "fl_lightning.codecs.Sign", null="Sign()")
        self.inner = inner if inner is not None else Sign()
        self.beta1, self.beta2 = float(beta1), float(beta2)

    MOMENTUM = "lion_m"  # its entry in the codec's state (FedSMUM's and FedSMUMC's parts read and write it too)

    def encode(self, tensor: Tensor, state=None, rng=None) -> Msg:
        if state is None:
            raise ValueError("LionMomentum needs the client's state to keep its momentum")
        g = tensor.detach().to(torch.promote_types(tensor.dtype, torch.float32))
        m = state.get(self.MOMENTUM)
        m = torch.zeros_like(g) if m is None else m.to(g.dtype)
        v = m * self.beta1 + g * (1 - self.beta1)
        msg = self.inner.encode(v.to(tensor.dtype), state, rng=rng)
        state[self.MOMENTUM] = m * self.beta2 + g * (1 - self.beta2)
        return msg
