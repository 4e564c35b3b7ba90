"""EF21Aggregation: EF21 (Richtárik, Sokolov & Fatkhullin, NeurIPS 2021, arXiv 2106.05203, Alg. 1) with local steps
and partial participation (EF21-PP: Fatkhullin, Sokolov, Gorbunov, Li & Richtárik 2021, arXiv 2110.03294, Alg. 6).

The client's "gradient" is its pseudo-gradient ∇̂_i = x − y_{i,K} (the model delta, negated; how seed 002 adapted EF21
to local epochs is not stated: its App. G.4 / Table 15 only name EF21). Client i keeps g_i (zero at the start) and the
server keeps g:

    c_i ← C(∇̂_i − g_i);  g_i ← g_i + c_i;  upload c_i                      (C = ``codec``, TopK 1 % by default)
    g ← g + (1/m)·Σ_{i ∈ S} c_i      (``partial: all``, EF21-PP: g stays the mean of all m clients' g_i)
      | g + (1/|S|)·Σ_{i ∈ S} c_i    (``partial: sampled``, the EF21 update with the round's clients only)
    x ← x − γ·g                      (γ = ``server_lr``)

With full participation and the identity compressor both rules are FedAvg (γ = 1). Float buffers (norm
statistics) travel dense and are averaged. Decision 002/#6 in docs/decisions.md.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ...codecs.base import CodecState
from ...config import Positive
from ...codecs.base import check_codec
from ...errors import ConfigError
from ..base import Aggregate, ClientContext, Msg, Part, ServerContext
from ..records import Field, Record


class EF21Aggregation(Part):
    reads = ("weights",)  # what its hooks read of the client's training tensors
    PARTIAL = ("all", "sampled")

    def __init__(self, codec, server_lr: Positive = 1.0, partial: str = "all"):
        check_codec(codec, example="fl_lightning.codecs.TopK")
        if partial not in self.PARTIAL:
            raise ConfigError("partial", f"unknown value {partial!r}", f"use one of {', '.join(self.PARTIAL)}")
        self.codec, self.gamma, self.partial = codec, float(server_lr), partial
        self.g: dict[str, Tensor] = {}

    def setup(self, server: ServerContext) -> None:
        self.server = server
        self.g = {n: torch.zeros_like(server.global_params[n]) for n in server.trainable}

    class Up(Record):
        c = Field("{}")  # per parameter: the compressed change C(Δ_i − g_i) (the model's own delta where not trained)

    class State(Record):
        g = Field("{}/g")  # each client's running estimate g_i, per parameter

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        out, state = self.Up(self, {}), self.State(self, client.state)
        rng = client.codec_rng()
        for n, x in client.global_params.items():
            delta = x - client.local[n].detach()
            if n not in self.g:
                out.c[n] = Msg(-delta)
                continue
            gi = state.g.get(n, torch.zeros_like(delta))
            c = self.codec.encode(delta - gi, CodecState(client.state, out.c.path(n)), rng=rng)
            state.g[n] = gi + c.tensor
            out.c[n] = Msg(c.tensor, nbits=c.bits())
        return out.container

    @torch.no_grad()
    def server_update(self, round_idx: int, agg: Aggregate) -> None:
        up = self.Up(self, agg)
        for n, x in self.server.global_params.items():
            if n not in self.g:
                x.add_(up.c.mean(n).to(x.dtype))
                continue
            step = up.c.sum(n) / agg.num_clients if self.partial == "all" else up.c.mean(n)
            self.g[n].add_(step.to(self.g[n].dtype))
            x.add_(self.g[n], alpha=-self.gamma)

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.g)

    def load_state_dict(self, state) -> None:
        for n in self.g:
            self.g[n] = state[n].clone()
