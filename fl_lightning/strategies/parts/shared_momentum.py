"""SharedMomentum: FedSMUMC's server-held Lion momentum (seed 002 Sec. 5.2.5, App. H Alg. 8).

The server keeps M (zero at the start: M_1 = M_0 = 0, decision 002/#16 in docs/decisions.md) and broadcasts it with
the model; a sampled client puts M into the slot where the FedSMU codec (``LionMomentum`` of part ``momentum_of``)
keeps its momentum, so the codec computes u = sign(β1·M + (1 − β1)·g) and m_i = β2·M + (1 − β2)·g; the client then
uploads m_i (dense) next to u and keeps nothing (list this part after the aggregation part). Server:
M ← (1/n) Σ m_i over the sampled clients. Communication: up d + 32d bits, down 64d (x and M).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ...codecs import LionMomentum
from ..base import Aggregate, ClientContext, Msg, Part, ServerContext
from ..records import Field, Record
from .momentum_completion import lion_source


class SharedMomentum(Part):
    def __init__(self, momentum_of: str = "aggregation"):
        self.momentum_of = momentum_of
        self.M: dict[str, Tensor] = {}

    def reads_parts(self) -> dict[str, str]:
        return {"momentum_of": self.momentum_of}

    def setup(self, server: ServerContext) -> None:
        self.M = {n: torch.zeros(server.global_params[n].shape, device=server.device,
                                 dtype=torch.promote_types(server.global_params[n].dtype, torch.float32))
                  for n in server.trainable}

    def link(self, parts) -> None:
        self.source = lion_source(self, parts["momentum_of"])

    class Wire(Record):  # down: the server's M; up: each sampled client's m_i
        M = Field("{}")

    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        down = self.Wire(self, {})
        for n, m in self.M.items():
            down.M[n] = Msg(m)
        return down.container

    def client_start(self, client: ClientContext) -> None:
        down = self.Wire(self, client.received)
        for n in self.M:
            self.source.codec_state(client.state, n)[LionMomentum.MOMENTUM] = down.M[n].clone()

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        up = self.Wire(self, {})
        for n in self.M:
            up.M[n] = Msg(self.source.codec_state(client.state, n).pop(LionMomentum.MOMENTUM))
        return up.container

    def server_update(self, round_idx: int, agg: Aggregate) -> None:
        up = self.Wire(self, agg)
        for n in self.M:
            self.M[n] = up.M.mean(n).to(self.M[n].dtype)

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.M)

    def load_state_dict(self, state) -> None:
        for n in self.M:
            self.M[n] = state[n].clone()
