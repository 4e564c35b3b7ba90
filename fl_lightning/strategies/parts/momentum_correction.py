"""MomentumCorrection: the client direction of Cheng et al.'s SCAFFOLD-M / FedAvg-VR / SCAFFOLD-VR and of Yan et al.'s
PAdaMFed / PAdaMFed-VR (baselines that seed 003, Zhang & Gao, names in Sec. 7 without their rules), written as one
equation.

Cheng, Huang, Wu & Yuan, "Momentum Benefits Non-IID Federated Learning Simply and Provably", ICLR 2024, arXiv
2306.16504; Yan, Zhang, Wang & Cao, "Problem-Parameter-Free Federated Learning", ICLR 2025. Every local step replaces
the gradient handed to the local optimizer (plain SGD, lr η) by

    v = a·∇F_i(x_i; ξ) − β c_i + d − [vr] (1−β) ∇F_i(x^{r−1}; ξ),     d = β c + (1−β) g^r  (broadcast as ONE vector)

with a = β (SCAFFOLD-M, PAdaMFed) or a = 1 with ``variance_reduction`` (the STORM-type FedAvg-VR, SCAFFOLD-VR,
PAdaMFed-VR: the second gradient is taken at the previous round's global model on the SAME minibatch ξ, through
``client.gradient_at``). Without ``control`` c = c_i = 0 (FedAvg-VR; FedAvg-M is a = β, no control, no VR).
``normalize`` (PAdaMFed): v ← v / ‖v‖, one L2 norm over all trainable parameters (a zero v stays zero).

Control variates (``control``): c_i^{r+1} = the mean of the round's RAW minibatch gradients ∇F_i(x_i^{r,k}; ξ)
(SCAFFOLD-M's rule as we read Cheng et al.; not in seed 003), uploaded as c_i^{r+1} − c_i^r;
c ← c + (1/n) Σ_{i∈S} (c_i^{r+1} − c_i^r); c = c_i = 0 at the start (SCAFFOLD's; Cheng et al.'s initialisation of c
is not pinned: our choice).

The global direction g^{r+1} (``momentum``):
  * ``direction`` (Cheng et al. Alg. 1–2): the mean local direction (1/(η S K)) Σ_{i∈S} (x^r − x_i^{r,K}), computed
    lazily at the next broadcast from x^{r+1} − x^r (plain averaging, γ = ηK; the model is the ModelAverage part's);
  * ``control`` (PAdaMFed, Yan et al.'s server rule as we read it):
    g^{r+1} = β (c^r + (1/|S|) Σ_{i∈S} Δc_i) + (1−β) g^r.
g^0 (``init``): ``grad`` = (1/n) Σ_i ∇F_i(x^0; ξ_i) over ALL clients (our reading for FedAvg-M, as fedavgm; decision
003/#9 of docs/decisions.md) | ``zero``.

x^{r−1} for the VR methods (``prev_model``): ``downlink`` (default) sends it to the sampled clients with x^r and
charges it (P bytes; round 0 uses x^{−1} = x^0, free); ``client``: every client keeps the x^{r−1} it received last
round, so nothing more travels (the papers' accounting: clients hold x^{r−1}); that needs full participation and is
refused otherwise (x^{r−1} is then held by the server for all clients at once: under full participation it is the same
tensor on every client).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from torch import Tensor

from ...config import Positive, Range
from ...errors import ConfigError
from ..base import Aggregate, ClientContext, Msg, Part, ServerContext
from ..round_state import RoundState, rows, shared
from ..records import Field, Record
from .global_alignment import mean_probe_gradient


class MomentumCorrection(Part):
    reads = ("grads", "weights")  # what its hooks read of the client's training tensors
    writes = ("grads",)  # what its hooks change of the client's training tensors
    # its step: multi-tensor ops on its round state (the direction broadcast, c_i and the gradient sums stacked per
    # client in a cohort), branches on its settings only, the norm on the device; variance_reduction's second
    # gradient is a backward inside the step
    step_plan = ()
    MOMENTA, INITS, PREV = ("direction", "control"), ("grad", "zero"), ("downlink", "client")

    def __init__(self, beta: Annotated[float, Range(0.0, 1.0, open_low=True)] = 0.1, lr: Positive = 1.0,
                 control: bool = False, variance_reduction: bool = False,
                 normalize: bool = False, momentum: str = "direction", init: str = "grad", prev_model: str = "downlink"):
        for arg, value, allowed in (("momentum", momentum, self.MOMENTA), ("init", init, self.INITS),
                                    ("prev_model", prev_model, self.PREV)):
            if value not in allowed:
                raise ConfigError(arg, f"unknown value {value!r}", f"use one of {', '.join(allowed)}")
        if momentum == "control" and not control:
            raise ConfigError("momentum", "momentum=control builds g from the control variates, which are off",
                              "set control=true or momentum=direction")
        self.beta, self.lr, self.control, self.vr = float(beta), float(lr), bool(control), bool(variance_reduction)
        self.normalize, self.momentum, self.init, self.prev_model = bool(normalize), momentum, init, prev_model
        self.prev_x: dict[str, Tensor] = {}
        self.prev_factor = self.prev_K = 0.0

    # ------------------------------------------------------------------ server side
    def setup(self, server: ServerContext) -> None:
        self.server, self.names = server, list(server.trainable)
        if self.vr and self.prev_model == "client" and server.clients_per_round < server.num_clients:
            raise self.error("prev_model", f"clients keep x^(r-1) only under full participation (fl.clients_per_round="
                             f"{server.clients_per_round} < fl.num_clients={server.num_clients})",
                             "use method.prev_model=downlink (x^(r-1) is sent) or fl.clients_per_round=fl.num_clients")
        zeros = lambda: {n: torch.zeros_like(server.global_params[n]) for n in self.names}  # noqa: E731
        self.g = mean_probe_gradient(self, server, self.names)[0] if self.init == "grad" else zeros()
        self.c = zeros() if self.control else {}

    class Down(Record):
        d = Field("d/{}")  # the momentum direction (1−β)·g (+ β·c with control variates), per parameter
        x_prev = Field("x_prev/{}")  # x^{r-1}, for the variance-reduced correction

    class Up(Record):
        dc = Field("dc/{}")  # a client's change of its control variate

    class State(Record):
        c_i = Field("c_i/{}")  # each client's control variate, per parameter

    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        x = self.server.global_params
        before = self.prev_x or {n: x[n] for n in self.names}  # x^{r-1} (x^{-1} = x^0)
        if self.momentum == "direction" and self.prev_x and self.prev_factor > 0:
            denom = float(self.server.local_steps or self.prev_K or 1.0) * self.lr * self.prev_factor
            self.g = {n: (self.prev_x[n] - x[n]) / denom for n in self.names}  # (x^{r-1} - x^r) / (K η_{r-1})
        out = self.Down(self, {})
        for n in self.names:
            d = self.g[n] * (1 - self.beta)
            out.d[n] = Msg(d + self.beta * self.c[n] if self.control else d)
            if self.vr:
                free = self.prev_model == "client" or not self.prev_x
                out.x_prev[n] = Msg(before[n].clone(), nbits=0 if free else None)
        self.prev_x = {n: x[n].detach().clone() for n in self.names}
        self.prev_factor = self.server.round_lr_factor(round_idx)
        return out.container

    def server_update(self, round_idx: int, agg: Aggregate) -> None:
        up = self.Up(self, agg)
        if self.momentum == "direction" and not self.server.local_steps:  # local epochs: the clients' mean K
            self.prev_K = agg.mean_steps()
        for n, c in self.c.items():
            if n not in up.dc:
                continue
            if self.momentum == "control":  # uses c^r: before c moves
                self.g[n] = self.beta * (c + up.dc.mean(n).to(c.dtype)) + (1 - self.beta) * self.g[n]
            c.add_(up.dc.sum(n).to(c.dtype), alpha=1.0 / agg.num_clients)

    def state_dict(self) -> dict[str, Tensor]:
        out = {f"g/{n}": t for n, t in self.g.items()}
        out.update({f"c/{n}": t for n, t in self.c.items()})
        out.update({f"prev_x/{n}": t for n, t in self.prev_x.items()})
        out["prev_factor"] = torch.tensor(self.prev_factor, dtype=torch.float64)
        out["prev_K"] = torch.tensor(self.prev_K, dtype=torch.float64)
        return out

    def load_state_dict(self, state) -> None:
        self.g = {n: state[f"g/{n}"].clone() for n in self.names}
        self.c = {n: state[f"c/{n}"].clone() for n in self.c}
        self.prev_x = {k[len("prev_x/"):]: state[k].clone() for k in state if k.startswith("prev_x/")}
        self.prev_factor, self.prev_K = float(state["prev_factor"]), float(state["prev_K"])

    # ------------------------------------------------------------------ client side
    def client_start(self, client: ClientContext) -> None:
        names = self.names
        down, state = self.Down(self, client.received), self.State(self, client.state)
        s = self.Round(d=[down.d[n].to(client.params[n].dtype) for n in names])
        if self.control:
            stored = [state.c_i.get(n) for n in names]
            s.c_i = [t.to(client.params[n].dtype) if t is not None else torch.zeros_like(client.params[n])
                     for n, t in zip(names, stored)]
            s.acc = [torch.zeros_like(client.params[n]) for n in names]
        if self.vr:
            s.x_prev = {n: down.x_prev[n] for n in names}
        client.start_state(self, s)

    @dataclass
    class Round(RoundState):
        d: list = shared(default_factory=list)       # the received direction d^r, per parameter
        c_i: list = rows(default_factory=list)       # (control) this client's c_i
        acc: list = rows(default_factory=list)       # (control) the round's gradient sum
        x_prev: dict = shared(default_factory=dict)  # (vr) x^{r-1}

    def cohort_rows(self) -> int:
        return 2 if self.control else 0  # c_i and the gradient sum, with control variates

    @torch.no_grad()
    def after_backward(self, client: ClientContext) -> None:
        """One client's tensors or a cohort's (K, ...) alike: d^r and x^{r-1} broadcast over the clients, each
        client's own gradient at x^{r-1} on its own minibatch, each client's direction to unit norm."""
        s = client.state_of(self)
        params = [client.params[n] for n in self.names]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if self.control:  # (a finished client's gradient is zero: its sum stays)
            torch._foreach_add_(s.acc, grads)
        v = torch._foreach_mul(grads, 1.0 if self.vr else self.beta)  # a·∇F_i(x_i; ξ)
        torch._foreach_add_(v, s.d)
        if self.control:
            torch._foreach_add_(v, s.c_i, alpha=-self.beta)
        if self.vr:
            with torch.enable_grad():
                old = client.gradient_at(s.x_prev)  # ∇F_i(x^{r-1}; ξ), the same minibatch
            torch._foreach_add_(v, [old[n] for n in self.names], alpha=-(1 - self.beta))
        if self.normalize:
            norm = client.norm_of(v)
            client.div_rows_(v, norm.clamp_min(torch.finfo(norm.dtype).tiny))
        for p, t in zip(params, v):
            p.grad = t

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        s = client.state_of(self)
        out, state = self.Up(self, {}), self.State(self, client.state)
        if self.control:
            K = max(1, client.step)
            for n, ci, acc in zip(self.names, s.c_i, s.acc):
                new = acc / K
                out.dc[n] = Msg(new - ci)
                state.c_i[n] = new
        return out.container

