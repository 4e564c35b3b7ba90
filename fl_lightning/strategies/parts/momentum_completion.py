"""MomentumCompletion: FedSMUM's momentum update for the clients that were not sampled (seed 002 Sec. 5.2.5,
App. H Alg. 7 lines 15-18), through the loop's idle-client seam (``uses_idle_clients``).

Every client receives the global model x_t each round (the downlink is charged to ALL clients: this part
broadcasts the model under ``MODEL_KEY`` with ``to="all"``). A client j not sampled in round t does no training and
no upload, and updates the Lion momentum kept by the FedSMU codec (``LionMomentum`` of part ``momentum_of``):

    g_j ← x_t − (1 − γ1·γ2)·y_j          (y_j = y^j_{t−1,K}: its last trained model if it trained in round t − 1,
                                         else x_{t−1}; x_0 before its first round)
    m_j ← β2·m_j + (1 − β2)·s·g_j         (s = γ1, verbatim line 18; ``scale: one`` drops the extra γ1)
    y_j ← x_t

A sampled client stores its trained model y_{t,K} as y_j. The verbatim form's scale (γ1²·Ū instead of a model
delta) is decision 002/#17 in docs/decisions.md. State per client: m_j (the codec's) and y_j (one model each).
"""
from __future__ import annotations

import torch

from ...codecs import LionMomentum
from ...errors import ConfigError
from ...config import Fraction, NonNegative, Positive
from ..base import MODEL_KEY, ClientContext, Msg, Part, ServerContext
from ..records import Field, Record
from .model_average import ModelAverage


def lion_source(part: Part, other: Part):
    """The aggregation part whose Lion codec keeps the momentum ``part`` reads (its ``momentum_of``)."""
    codec = other.codec if isinstance(other, ModelAverage) else None
    while codec is not None and not isinstance(codec, LionMomentum):
        codec = getattr(codec, "inner", None)  # a wrapper (Clamp, ErrorFeedback) around it
    if codec is None:
        raise part.error("momentum_of", f"part {part.momentum_of!r} keeps no Lion momentum (it needs ModelAverage with a "
                         "LionMomentum codec)", "name FedSMU's aggregation part (momentum_of: aggregation)")
    return other


class MomentumCompletion(Part):
    reads = ("weights",)  # what its hooks read of the client's training tensors
    uses_idle_clients = True
    SCALES = ("gamma1", "one")

    def __init__(self, gamma1: Positive, gamma2: NonNegative, beta2: Fraction, scale: str = "gamma1",
                 momentum_of: str = "aggregation"):
        if scale not in self.SCALES:
            raise ConfigError("scale", f"unknown value {scale!r}", f"use one of {', '.join(self.SCALES)}")
        self.g1, self.g2, self.beta2 = float(gamma1), float(gamma2), float(beta2)
        self.s = self.g1 if scale == "gamma1" else 1.0
        self.momentum_of = momentum_of

    def reads_parts(self) -> dict[str, str]:
        return {"momentum_of": self.momentum_of}

    def setup(self, server: ServerContext) -> None:
        self.server = server
        self.model_bits = sum(t.numel() * t.element_size() * 8 for t in server.global_params.values())

    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        dev = self.server.device
        return {MODEL_KEY: Msg(torch.empty(0, device=dev), nbits=self.model_bits, to="all")}

    def link(self, parts) -> None:
        self.source = lion_source(self, parts["momentum_of"])

    class State(Record):
        y = Field("{}/y")  # the model a client last ended a round with (its last known model), per parameter

    def client_end(self, client: ClientContext):
        state = self.State(self, client.state)
        for n in client.params:
            state.y[n] = client.local[n].detach().clone()
        return {}

    @torch.no_grad()
    def client_idle(self, client: ClientContext) -> None:
        state = self.State(self, client.state)
        for n in client.params:
            x = client.global_params[n]
            y = state.y.get(n, x)
            g = (x - (1 - self.g1 * self.g2) * y).to(torch.promote_types(x.dtype, torch.float32))
            own = self.source.codec_state(client.state, n)  # the Lion codec's memory of this parameter
            m = own.get(LionMomentum.MOMENTUM)
            m = torch.zeros_like(g) if m is None else m.to(g.dtype)
            own[LionMomentum.MOMENTUM] = m * self.beta2 + g * ((1 - self.beta2) * self.s)
            state.y[n] = x.detach().clone()
