"""MagnitudeUniformity: seed 002's Magnitude Uniformity index Φ_t (Sec. 3.2, Def. 3.1), logged per round as ``mu``
(and ``mu_frac`` = Φ_t / d_sub).

    Φ_t = Σ_j (Σ_i ĝ_ij)² / (n · Σ_i ĝ_ij²)

over the n **participating** clients (derived: with all clients, FedAvg's values in the paper's Table 18 would be
impossible) and the coordinates j of a block of d_sub entries; ĝ_ij is the magnitude of what client i uploaded in
coordinate j: the reconstruction the aggregation part provides as ``model_update`` (FedAvg: |x_i − x|; FedSMU:
|u_i|, so every summand is 1 and Φ = d_sub exactly), else the model delta. Each summand is Jain's fairness index of the
clients' magnitudes, in [1/n, 1]; coordinates where every ĝ is 0 are skipped (0/0).

The block (decision 002/#27 in docs/decisions.md; the paper's is unstated, its FedSMU value 192.00 points at a
192-unit block):
``block: auto`` is the bias of the last hidden ``nn.Linear`` (the one before the output layer: seed 002's CNN's fc2,
192 units), or a parameter name; ``mode``: ``coords`` (the block's entries), ``rows`` (the L2 norm of each row of
that Linear's weight, or of the named tensor: 192 rows of fc2.weight), ``all`` (every trainable coordinate).

Computed from streaming sums through the metrics channel: every client uploads ĝ and ĝ² in fp64 as diagnostic
messages (``nbits = 0``). ``enabled: false`` uploads nothing and logs nothing.
"""
from __future__ import annotations

import torch
from torch import nn

from ...errors import ConfigError
from ..base import Aggregate, ClientContext, Msg, Part, ServerContext
from ..records import Field, Record

MODES = ("coords", "rows", "all")


class MagnitudeUniformity(Part):
    reads_outputs = ("model_update",)  # the aggregation part's reconstruction, when it comes before this part

    def __init__(self, enabled: bool = True, block: str = "auto", mode: str = "coords"):
        if not isinstance(enabled, bool):
            raise ConfigError("enabled", f"expected true or false, got {enabled!r}", "set enabled: true or false")
        if mode not in MODES:
            raise ConfigError("mode", f"unknown mode {mode!r}", f"use one of {', '.join(MODES)}")
        if not isinstance(block, str) or not block:
            raise ConfigError("block", f"expected auto or a parameter name, got {block!r}", "use auto or e.g. net.fc2.bias")
        self.enabled, self.block, self.mode = enabled, block, mode
        self.param: str | None = None

    def setup(self, server: ServerContext) -> None:
        if not self.enabled or self.mode == "all":
            return
        name = self.block
        if name == "auto":
            linears = [n for n, m in server.module.named_modules() if isinstance(m, nn.Linear)]
            if len(linears) < 2:
                raise self.error("block", f"auto needs at least two nn.Linear layers, the model has {len(linears)}",
                                 "name a parameter (block=<name>) or use mode=all")
            name = f"{linears[-2]}.{'weight' if self.mode == 'rows' else 'bias'}"
        if name not in server.trainable:
            raise self.error("block", f"{name!r} is not a trainable parameter of the model",
                             f"use auto, mode=all or one of {', '.join(server.trainable[:6])}, ...")
        if self.mode == "rows" and server.global_params[name].ndim < 2:
            raise self.error("mode", f"rows needs a matrix, {name!r} has shape {tuple(server.global_params[name].shape)}",
                             "use mode=coords, or name a weight")
        self.param = name

    def _magnitudes(self, client: ClientContext) -> torch.Tensor:
        upd = client.output("model_update")
        if upd is None:
            upd = {n: client.local[n].detach() - x for n, x in client.global_params.items()}
        if self.mode == "all":
            names = [n for n in client.global_params if n in client.params]
            return torch.cat([upd[n].detach().reshape(-1).abs().double() for n in names])
        t = upd[self.param].detach().double()
        return t.reshape(t.shape[0], -1).norm(dim=1) if self.mode == "rows" else t.reshape(-1).abs()

    class Up(Record):  # free side channels (nbits=0): the magnitudes' sum and sum of squares over clients
        S1 = Field("S1")
        S2 = Field("S2")

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        if not self.enabled:
            return {}
        g = self._magnitudes(client)
        out = self.Up(self, {})
        out.S1.set(Msg(g, nbits=0))
        out.S2.set(Msg(g.square(), nbits=0))
        return out.container

    def server_update(self, round_idx: int, agg: Aggregate) -> dict[str, float]:
        up = self.Up(self, agg)
        if not self.enabled or () not in up.S1:
            return {}
        s1, s2, n = up.S1.sum(), up.S2.sum(), agg.weights[up.S2.path()]
        keep = s2 > 0
        phi = float((s1[keep].square() / (n * s2[keep])).sum())
        return {"mu": phi, "mu_frac": phi / s1.numel()}
