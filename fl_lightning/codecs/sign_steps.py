"""SignSteps: the model delta of K local Lion steps of size lr, sent as integers (FedLion, Tang & Chang, ICASSP 2024,
arXiv 2402.09941; as reprinted in the FedSMU paper, anonymous, under review, App. H, Alg. 4 lines 12-13).

K Lion steps of size γ move each coordinate by −γ·Σ_k u_k with u_k ∈ {−1, 0, +1}, so Δ/γ is an integer in [−K, K]
(the paper's "integer-valued model difference"): it travels as **⌈log₂(2K + 1)⌉ bits per coordinate** (derived;
decision 002/#23 in docs/decisions.md). The receiver rebuilds γ·round(Δ/γ) clamped to [−K, K] (exact for a Lion
client; for any other local optimizer it is the quantizer onto that grid). γ = ``lr`` × the round's schedule factor
and K = the client's local steps this round: the codec reads both from the client (``uses_client``; ``ModelAverage``
passes it).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..messages import Msg
from ..config import Positive


def steps_bits(k: int) -> int:
    """Bits per coordinate of an integer in [−K, K]."""
    return max(1, math.ceil(math.log2(2 * k + 1)))


class SignSteps:
    uses_client = True

    def __init__(self, lr: Positive):
        self.lr = float(lr)

    def encode(self, tensor: Tensor, state=None, rng=None, client=None) -> Msg:
        if client is None:
            raise ValueError("SignSteps needs the client (its local steps and lr factor)")
        step, k = self.lr * client.lr_factor, max(1, int(client.step))
        q = torch.round(tensor.detach() / step).clamp_(-k, k)
        return Msg(q * step, nbits=steps_bits(k) * tensor.numel())
