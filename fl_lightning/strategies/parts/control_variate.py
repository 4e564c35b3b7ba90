"""ServerControlVariate: the server half shared by SCAFFOLD-style parts (SCAFFOLD, seed 000's FedMuon-BC).

The server keeps one control variate per parameter, broadcasts it every round, and adds the clients' uploaded
changes with the 1/n of all clients (Karimireddy et al. 2020 Alg. 1 line 17; seed 000 Alg. 1 line 17):

    c ← c + (1/n) Σ_{i∈S} Δc_i

Subclasses fill ``self.cv`` at setup; their records (:mod:`fl_lightning.strategies.records`) name the broadcast
variate (``Down.cv``), the uploaded change (``Up.delta``) and each client's own variate (``State.c_i``).
"""
from __future__ import annotations

from torch import Tensor

from ..base import Aggregate, Msg, Part
from ..records import Field, Record


class ServerControlVariate(Part):
    class Down(Record):
        cv = Field("c/{}")  # the server's variate c, broadcast

    class Up(Record):
        delta = Field("dc/{}")  # a client's change Δc_i

    class State(Record):
        c_i = Field("c_i/{}")  # a client's own variate c_i (persistent)

    def __init__(self):
        self.cv: dict[str, Tensor] = {}

    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        down = self.Down(self, {})
        for n, c in self.cv.items():
            down.cv[n] = Msg(c)
        return down.container

    def server_update(self, round_idx: int, agg: Aggregate) -> None:
        up = self.Up(self, agg)
        for n, c in self.cv.items():
            if n in up.delta:
                c.add_(up.delta.sum(n).to(c.dtype), alpha=1.0 / agg.num_clients)

    def state_dict(self) -> dict[str, Tensor]:  # the variate under its broadcast name, without the part's
        return {self.Down.cv.pattern.format(n): c for n, c in self.cv.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for n, c in self.cv.items():
            c.copy_(state[self.Down.cv.pattern.format(n)])
