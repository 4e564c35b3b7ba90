"""FedNova as a strategy part kept outside the package (docs/extending.md, "Your own strategy part").

FedNova (Wang, Liu, Liang, Joshi & Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020, arXiv 2007.07481): clients that run different numbers of local steps tau_i pull plain
averaging towards the objectives of the clients that ran more. FedNova normalizes each update by its local work
before averaging and rescales the average by an effective step count:

    d_i      = (x - x_i) / a_i                            normalized update of client i
    tau_eff  = sum_i p_i a_i                              with p_i = w_i / sum_j w_j over the sampled clients
    x       <- x - tau_eff * sum_i p_i d_i

with a_i = ||a_i||_1, the total weight local SGD puts on the client's gradients: a_i = tau_i for plain SGD, and for
heavy-ball momentum rho (PyTorch's SGD, buffer started at 0 every round)
a_i = (tau_i - rho (1 - rho^tau_i) / (1 - rho)) / (1 - rho). w_i is the client's data size (``weighting:
num_samples``) or 1 (``uniform``), as in ModelAverage. With equal tau_i this is FedAvg's weighted average exactly
(x - tau * sum p_i (x - x_i) / tau = sum p_i x_i); tests/system/test_extension_example.py checks both that and
unequal tau_i (``fl.local_epochs`` with unequal client sizes). Float buffers (norm statistics) are averaged as
FedAvg does. Not covered: FedProx's proximal term in the local steps (it changes a_i), Nesterov, dampening,
per-client optimizer state carried across rounds (the momentum buffer must start at 0), and server momentum
(FedNova's ``gmf``).

Uplink per client: the model-sized d_i plus a_i as one fp32 number; nothing extra goes down; no state on the
server, so nothing to checkpoint (a part with state returns it from ``state_dict``: see docs/extending.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fl_lightning.errors import ConfigError
from fl_lightning.strategies.base import Aggregate, ClientContext, Msg, Part, ServerContext
from fl_lightning.strategies.records import Field, Record
from fl_lightning.strategies.round_state import RoundState, own


def local_work(tau: int, rho: float = 0.0) -> float:
    """||a_i||_1 for ``tau`` local steps of SGD with heavy-ball momentum ``rho`` (tau for plain SGD)."""
    if rho == 0.0:
        return float(tau)
    return (tau - rho * (1.0 - rho ** tau) / (1.0 - rho)) / (1.0 - rho)


class FedNova(Part):
    """Normalized averaging: the method's aggregation part, in place of ModelAverage."""

    reads = ("weights", "optimizer.settings")  # of the client's training tensors: x_i at its end, the momentum rho

    def __init__(self, weighting: str = "num_samples"):
        if weighting not in ("num_samples", "uniform"):  # reported as method.parts.<name>.weighting
            raise ConfigError("weighting", f"unknown weighting {weighting!r}", "use num_samples or uniform")
        self.weighting = weighting

    def setup(self, server: ServerContext) -> None:
        self.server = server  # global_params (changed in place at server_update) and the trainable names

    def _momentum(self, client: ClientContext) -> float:
        opt = client.optimizer
        if type(opt) is not torch.optim.SGD:
            raise ConfigError("optimizer", f"FedNova's a_i is derived for SGD local steps, the clients run "
                              f"{type(opt).__name__}", "use optimizer=sgd (plain or with method.momentum)")
        rhos = {float(g.get("momentum", 0.0)) for g in opt.param_groups}
        if len(rhos) != 1 or any(g.get("nesterov") or g.get("dampening") for g in opt.param_groups):
            raise ConfigError("optimizer", "FedNova needs one heavy-ball momentum for all parameters, without "
                              "nesterov or dampening", "use optimizer=sgd with one method.momentum")
        return rhos.pop()

    def client_start(self, client: ClientContext) -> None:
        rho = self._momentum(client)
        if rho and any("momentum_buffer" in s for s in client.optimizer.state.values()):
            raise ConfigError("method.parts.local_optimizer.state", "FedNova's a_i assumes the momentum buffer starts "
                              "at 0 every round, but the clients' optimizer state persists", "set it to reset")
        client.start_state(self, self.Round(rho))

    @dataclass
    class Round(RoundState):  # its state of one client's round (fl_lightning/strategies/round_state.py)
        rho: float = own(0.0)  # the clients' heavy-ball momentum

    class Up(Record):  # what a client uploads, each with its weight w_i
        a = Field("a")  # a_i, its local work
        d = Field("d/{}")  # (x - x_i) / a_i, per trainable parameter
        buffer = Field("buffer/{}")  # x - x_i of a float buffer (averaged as FedAvg does)

    @torch.no_grad()
    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        a = local_work(client.step, client.state_of(self).rho)  # client.step: the local steps done (= client.num_steps)
        w = float(client.num_samples) if self.weighting == "num_samples" else 1.0
        device = next(iter(client.local.values())).device
        out = self.Up(self, {})
        out.a.set(Msg(torch.tensor(a, dtype=torch.float32, device=device), w))
        for n, x in client.global_params.items():
            delta = x - client.local[n].detach()  # x - x_i
            if n in client.params:
                out.d[n] = Msg(delta / a, w)
            else:  # a float buffer: averaged as FedAvg does
                out.buffer[n] = Msg(delta, w)
        return out.container

    @torch.no_grad()
    def server_update(self, round_idx: int, agg: Aggregate) -> dict[str, float]:
        up = self.Up(self, agg)
        tau_eff = up.a.mean()  # sum_i p_i a_i (a 0-dim tensor: no host sync in the loop below)
        for n, x in self.server.global_params.items():
            if n in self.server.trainable:
                x.sub_((tau_eff * up.d.mean(n)).to(x.dtype))
            else:
                x.sub_(up.buffer.mean(n).to(x.dtype))
        return {"tau_eff": float(tau_eff)}
