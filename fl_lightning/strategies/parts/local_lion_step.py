"""LocalLionStep: Fed-LocalLion's client-side Lion step on top of local SGD (seed 002 App. H, Alg. 6).

After the K local SGD steps, with g = y_K − x (the model delta) and the client's persistent momentum m (zero at its
first participation, frozen while it is not sampled):

    u ← sign(β1·m + (1 − β1)·g);  m ← β2·m + (1 − β2)·g;  y ← y_K + γ1·(u − γ2·y_K)      (Alg. 6 lines 11-13)

and the dense Δ = y − x is uploaded by the ``ModelAverage`` part that follows (list this part before it). The
pseudo-code (no momentum upload, full-precision Δ) is implemented, not App. G.1's wording "server performing model
and momentum aggregation" (decision 002/#18 in docs/decisions.md). m lives in the client's state under
``<part>/<param>/m`` (fp32 at least); ``lion_update`` (fl_lightning/optim/lion.py) is the shared pure function.
"""
from __future__ import annotations

import torch

from ...optim.lion import lion_update
from ...config import Fraction, NonNegative, Positive
from ..base import ClientContext, Part
from ..records import Field, Record


class LocalLionStep(Part):
    reads = ("weights",)  # what its hooks read of the client's training tensors
    writes = ("weights",)  # what its hooks change of the client's training tensors
    def __init__(self, lr: Positive = 0.001, beta1: Fraction = 0.9, beta2: Fraction = 0.99,
                 weight_decay: NonNegative = 0.01):
        self.lr, self.beta1, self.beta2, self.wd = float(lr), float(beta1), float(beta2), float(weight_decay)

    class State(Record):
        m = Field("{}/m")  # each client's own Lion momentum, per parameter

    @torch.no_grad()
    def client_end(self, client: ClientContext):
        state = self.State(self, client.state)
        for n in client.params:
            y = client.local[n]
            g = (y - client.global_params[n]).to(torch.promote_types(y.dtype, torch.float32))
            m = state.m.get(n)
            m = torch.zeros_like(g) if m is None else m.to(g.dtype).clone()
            u = lion_update(g, m, self.beta1, self.beta2)
            state.m[n] = m
            y.add_((u - self.wd * y).to(y.dtype), alpha=self.lr)
        return {}
