"""Scallion: SCALLION (Huang, Li & Li, "Stochastic Controlled Averaging for Federated Learning with Communication
Compression", arXiv 2308.08165, 2023; a baseline seed 002 does not write out): SCAFFOLD rewritten so that one
compressed incremental vector goes up, with an unbiased compressor. Server state x, c; client state c_i (all zero
at the start):

    client:  y ← x; K times  y ← y − η(∇F_i(y, ξ) − c_i + c)       (this part corrects p.grad; plain SGD after it)
             δ_i ← C((x − y)/(K·η) − c)                              (C = ``codec``: RandK from the client's generator)
             c_i ← c_i + α·δ_i;  upload δ_i
    server:  x ← x − η_g·K·η·(c + (1/|S|)·Σ δ_i);   c ← c + α·(1/m)·Σ_{i ∈ S} δ_i

Since the local steps add −c_i + c, (x − y)/(K·η) = ḡ_i − c_i + c (ḡ_i: the mean raw gradient), so the increment
(x − y)/(K·η) − c = ḡ_i − c_i is SCAFFOLD's option-II Δc_i (Karimireddy et al., ICML 2020, arXiv 1910.06378,
Alg. 1 line 12): with the identity compressor and α = 1 this is SCAFFOLD with η_g·K·η·(c + mean δ_i) = −η_g·mean Δy_i
(the paper's premise, "an equivalent formulation" of SCAFFOLD with one uploaded vector; decision 002/#6 in
docs/decisions.md).

η is ``lr`` times the round's schedule factor. K·η is each client's own (local epochs give unequal K): the server
uses their mean over the round's clients, which it knows (the loop counts each client's steps: nothing is sent).
α (``alpha``): ``None`` (default) is the bound 1/(1 + ω) of the compressor, per tensor: for RandK ω = d/k − 1, so
α = k/d with k = max(1, ⌈frac·d⌉) (the codec's ``omega(d)``); a number is used for every tensor. Not specified by
the paper (seed 002 gives neither the compressor nor α; decision 002/#6). Downlink: x and c. Float buffers travel
dense and are averaged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from torch import Tensor

from ...codecs.base import CodecState
from ...codecs.base import UnbiasedCodec, check_codec
from ...errors import ConfigError
from ...config import Positive, Range
from ..base import Aggregate, ClientContext, Msg, Part, ServerContext
from ..round_state import RoundState, own, rows
from ..records import Field, Record


class Scallion(Part):
    reads = ("grads", "weights")  # what its hooks read of the client's training tensors
    writes = ("grads",)  # what its hooks change of the client's training tensors
    def __init__(self, codec, lr: Positive, server_lr: Positive = 1.0,
                 alpha: Annotated[float, Range(0.0, 1.0, open_low=True)] | None = None):
        check_codec(codec, example="fl_lightning.codecs.RandK")
        if alpha is None and not isinstance(codec, UnbiasedCodec):
            raise ConfigError("alpha", f"not set and {type(codec).__name__} declares no variance omega(d)",
                              "set alpha in (0, 1]")
        self.codec, self.lr, self.eta_g = codec, float(lr), float(server_lr)
        self.alpha = None if alpha is None else float(alpha)
        self.c: dict[str, Tensor] = {}

    def alpha_for(self, d: int) -> float:
        """α for a tensor of d entries: the given value, or 1/(1 + ω(d)) of the codec."""
        return self.alpha if self.alpha is not None else 1.0 / (1.0 + self.codec.omega(d))

    def setup(self, server: ServerContext) -> None:
        self.server = server
        self.c = {n: torch.zeros_like(server.global_params[n]) for n in server.trainable}

    class Down(Record):
        c = Field("c/{}")  # the server's control variate, per parameter

    class Up(Record):
        u = Field("{}")  # per parameter: the compressed C(Δ_i/(Kη) − c) (the model's own delta where not trained)

    class State(Record):
        ci = Field("{}/ci")  # each client's control variate c_i, per parameter

    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        down = self.Down(self, {})
        for n, c in self.c.items():
            down.c[n] = Msg(c)
        return down.container

    def client_start(self, client: ClientContext) -> None:
        state, down = self.State(self, client.state), self.Down(self, client.received)
        ci = {n: state.ci.get(n, torch.zeros_like(c)) for n, c in self.c.items()}
        client.start_state(self, self.Round(ci=ci, corr={n: down.c[n] - ci[n] for n in self.c}))

    @dataclass
    class Round(RoundState):
        corr: dict = rows(default_factory=dict)  # c − c_i per parameter: what each step adds to the gradient
        ci: dict = own(default_factory=dict)     # c_i as the round began

    step_plan = ()  # its step: one multi-tensor add of its round state's correction c − c_i

    @torch.no_grad()
    def after_backward(self, client: ClientContext) -> None:
        """g ← g + (c − c_i), one client's or a cohort's (K, ...) tensors alike."""
        corr = client.state_of(self).corr
        names = [n for n, p in client.params.items() if n in corr and p.grad is not None]
        torch._foreach_add_([client.params[n].grad for n in names], [corr[n] for n in names])

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        k_eta = max(1, client.step) * self.lr * client.lr_factor
        ci = client.state_of(self).ci
        rng = client.codec_rng()
        out, state, down = self.Up(self, {}), self.State(self, client.state), self.Down(self, client.received)
        for n, x in client.global_params.items():
            delta = x - client.local[n].detach()
            if n not in self.c:
                out.u[n] = Msg(-delta)
                continue
            msg = self.codec.encode(delta / k_eta - down.c[n], CodecState(client.state, out.u.path(n)), rng=rng)
            state.ci[n] = ci[n] + self.alpha_for(x.numel()) * msg.tensor
            out.u[n] = Msg(msg.tensor, nbits=msg.bits())
        return out.container

    @torch.no_grad()
    def server_update(self, round_idx: int, agg: Aggregate) -> None:
        up = self.Up(self, agg)
        k_eta = agg.mean_steps() * self.lr * self.server.round_lr_factor(round_idx)  # the clients' mean K·η, known here
        for n, x in self.server.global_params.items():
            if n not in self.c:
                x.add_(up.u.mean(n).to(x.dtype))
                continue
            x.add_((self.c[n] + up.u.mean(n)).to(x.dtype), alpha=-self.eta_g * k_eta)
            self.c[n].add_((up.u.sum(n) / agg.num_clients).to(self.c[n].dtype), alpha=self.alpha_for(x.numel()))

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.c)

    def load_state_dict(self, state) -> None:
        for n in self.c:
            self.c[n] = state[n].clone()
