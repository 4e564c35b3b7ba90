"""SharedAdaptiveStorm: FAFED's local STORM momentum with an adaptive matrix shared by all clients (Wu, Huang, Hu &
Huang, "Faster Adaptive Federated Learning", AAAI 2023, arXiv 2212.00974, Alg. 1; one of the baselines seed 003
(Zhang & Gao) names in Sec. 7).

A round is one period of q = K local steps between two synchronisations, in the paper's order (step, then the
gradient at the new point; the cited original's form, not in seed 003):

    x_{t+1} = x_t − γ η_t m_t / H,      H = √v̄ + ρ   (v̄: the average received at the last sync; fixed in between)
    m_{t+1} = ∇F_i(x_{t+1}; ξ) + (1 − α_{t+1}) (m_t − ∇F_i(x_t; ξ))      # the SAME minibatch ξ at both points
    v_{t+1} = ϱ v_t + (1 − ϱ) ∇F_i(x_{t+1}; ξ)²
    η_t = k / (ω + t)^{1/3},   α_{t+1} = min(1, c η_t²),   t = the global step count (round · K + step)

so the round's first step (at ``client_start``, from the received x̄ with the received m̄) needs no gradient, each
minibatch's gradient updates m and v, and the last one is absorbed into m and v with no step (K gradients and K
steps per round; the local optimizer is plain SGD with lr γ, fed γ-free directions η_t m / H through ``p.grad``).
At the sync the server averages x (the ModelAverage part), m and v; the clients start from x̄, m̄ and H = √v̄ + ρ.
Init (``init``): ``grad`` m̄⁰ = (1/n) Σ_i ∇F_i(x⁰; ξ_i), v̄⁰ = (1/n) Σ_i ∇F_i(x⁰; ξ_i)², one probe minibatch per
client over ALL clients (a third-party implementation's start) | ``zero``.

What is open (our form has low-to-medium confidence: it is not checked against the paper's Alg. 1): the placement
of v. Here each client keeps its own EMA v every step and the server averages it at the sync, H refreshed only
then (as a third-party implementation does); v travels both ways (uplink x, m, v; downlink
x̄, m̄, v̄: 3 model-sized tensors each). The clamp α ≤ 1 is ours (c η_t² may exceed 1 early).
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import Annotated

import torch
from torch import Tensor

from ...config import Fraction, NonNegative, OneOf, Positive
from ..base import Aggregate, ClientContext, Msg, Part, ServerContext
from ..round_state import RoundState, own, rows
from ..records import Field, Record
from .global_alignment import mean_probe_gradient


class SharedAdaptiveStorm(Part):
    reads = ("grads", "weights", "optimizer.settings")  # what its hooks read of the client's training tensors
    writes = ("grads", "weights")  # what its hooks change of the client's training tensors
    # its step: m, v, H and the previous point (stacked per client in a cohort); 1 − α and η planned before it
    # (before_step) and read as 0-d tensors filled in place when traced; x_t kept in place; a second backward
    step_plan = ()
    def __init__(self, k: Positive = 2.0, omega: NonNegative = 8.0, c: NonNegative = 1.0, rho: Positive = 1e-2,
                 v_decay: Fraction = 0.99, init: Annotated[str, OneOf("grad", "zero")] = "grad"):
        self.k, self.omega, self.c, self.rho, self.decay = float(k), float(omega), float(c), float(rho), float(v_decay)
        self.init = init

    def eta(self, t: int) -> float:
        return self.k / (self.omega + t) ** (1.0 / 3.0)

    # ------------------------------------------------------------------ server side
    def setup(self, server: ServerContext) -> None:
        self.server, self.names = server, list(server.trainable)
        if self.init == "grad":
            self.m, self.v = mean_probe_gradient(self, server, self.names)
        else:
            self.m = {n: torch.zeros_like(server.global_params[n]) for n in self.names}
            self.v = {n: torch.zeros_like(server.global_params[n]) for n in self.names}

    class Wire(Record):  # down: the server's m̄, v̄; up: each client's m_i, v_i (per parameter)
        m = Field("m/{}")
        v = Field("v/{}")

    def _send(self, m: dict[str, Tensor], v: dict[str, Tensor]) -> dict[str, Msg]:
        out = self.Wire(self, {})
        for n, t in m.items():
            out.m[n] = Msg(t)
        for n, t in v.items():
            out.v[n] = Msg(t)
        return out.container

    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        return self._send(self.m, self.v)

    def server_update(self, round_idx: int, agg: Aggregate) -> None:
        up = self.Wire(self, agg)
        for state, field in ((self.m, up.m), (self.v, up.v)):
            for n, t in state.items():
                if n in field:
                    t.copy_(field.mean(n).to(t.dtype))

    def state_dict(self) -> dict[str, Tensor]:
        return {**{f"m/{n}": t for n, t in self.m.items()}, **{f"v/{n}": t for n, t in self.v.items()}}

    def load_state_dict(self, state) -> None:
        self.m = {n: state[f"m/{n}"].clone() for n in self.names}
        self.v = {n: state[f"v/{n}"].clone() for n in self.names}

    # ------------------------------------------------------------------ client side
    @torch.no_grad()
    def client_start(self, client: ClientContext) -> None:
        params = [client.params[n] for n in self.names]
        down = self.Wire(self, client.received)
        recv = lambda field: [field[n].to(p.dtype).clone() for n, p in zip(self.names, params)]  # noqa: E731
        m, v = recv(down.m), recv(down.v)
        H = torch._foreach_add(torch._foreach_sqrt(v), self.rho)
        t0 = client.round * client.num_steps
        client.start_state(self, self.Round(
            m=m, v=v, H=H, t0=t0, prev={n: p.detach().clone() for n, p in zip(self.names, params)},
            keep_t=torch.zeros((), dtype=torch.float64, device=params[0].device),
            scale_t=torch.zeros((), dtype=torch.float64, device=params[0].device)))
        lrs = {id(p): g["lr"] for g in client.optimizer.param_groups for p in g["params"]}
        for p, mi, h in zip(params, m, H):  # the round's first step: x̄ − γ η_t m̄ / H
            p.addcdiv_(mi, h, value=-lrs[id(p)] * self.eta(t0))

    @dataclass
    class Round(RoundState):
        m: list = rows(default_factory=list)     # the STORM momentum m_t, per parameter
        v: list = rows(default_factory=list)     # the second moment v_t
        H: list = rows(default_factory=list)     # √v̄ + ρ of the round's start (the shared preconditioner)
        t0: int = rows(0)                        # the global step count at the round's start
        prev: dict = rows(default_factory=dict)  # x_t, where the last gradient was taken
        # the step's 1 − α and η (before_step) as host numbers, and for a compiled step as 0-d tensors filled in
        # place, inputs of the graph (a float is a constant of it, recompiled for every new value: every step)
        keep: float = own(1.0)
        scale: float = own(0.0)
        keep_t: Tensor | None = own()
        scale_t: Tensor | None = own()
        decay_t: Tensor | None = own()  # a cohort's: each client's v decay (1 once it is done)

    def before_step(self, client: ClientContext) -> None:
        """The step's two numbers, from the step count, outside the step (a compiled step then reads no count):
        1 − α_{t+1} and the step size η_{t+1} of the direction, 0 after the round's last gradient (absorbed, no step).
        For a cohort, each client's from its own count, as (K,) tensors filled in place (a finished client's m and v
        stay as they are: 1 − α = 1, decay 1)."""
        s = client.state_of(self)
        if client.batched:
            keep, scale, decay = [], [], []
            for c, t0 in zip(client.clients, s.t0):
                t, done = t0 + client.step, client.step >= c.num_steps
                keep.append(1.0 if done else 1.0 - min(1.0, self.c * self.eta(t) ** 2))
                scale.append(0.0 if client.step + 1 >= c.num_steps else self.eta(t + 1))
                decay.append(1.0 if done else self.decay)
            dt = client.params[self.names[0]].dtype
            for name, values in (("keep_t", keep), ("scale_t", scale), ("decay_t", decay)):
                t, held = client.per_client(values, dt), getattr(s, name)
                if held is None or held.shape != t.shape:
                    setattr(s, name, t)
                else:
                    held.copy_(t)
            return
        t = s.t0 + client.step  # the step that produced the current point
        alpha = min(1.0, self.c * self.eta(t) ** 2)
        last = client.step + 1 >= client.num_steps
        s.keep, s.scale = 1.0 - alpha, 0.0 if last else self.eta(t + 1)
        s.keep_t.fill_(s.keep)
        s.scale_t.fill_(s.scale)

    @torch.no_grad()
    def after_backward(self, client: ClientContext) -> None:
        s = client.state_of(self)
        params = [client.params[n] for n in self.names]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        with torch.enable_grad():
            old = client.gradient_at(s.prev)  # ∇F_i(x_t; ξ), the same minibatch
        m = s.m
        torch._foreach_sub_(m, [old[n] for n in self.names])
        torch._foreach_mul_(m, client.number(lambda: s.keep, s.keep_t))  # a traced step reads the tensor (an input)
        torch._foreach_add_(m, grads)                         # m ← ∇F(x_{t+1}) + (1 − α)(m − ∇F(x_t))
        torch._foreach_mul_(s.v, self.decay)
        torch._foreach_addcmul_(s.v, grads, grads, value=1.0 - self.decay)
        torch._foreach_copy_([s.prev[n] for n in self.names], [p.detach() for p in params])  # in place: a replay
        direction = torch._foreach_div(m, s.H)                                               # reads it there
        torch._foreach_mul_(direction, client.number(lambda: s.scale, s.scale_t))  # the last gradient: no step
        for p, d in zip(params, direction):
            p.grad = d

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        s = client.state_of(self)
        return self._send(dict(zip(self.names, s.m)), dict(zip(self.names, s.v)))

    # ------------------------------------------------------------------ a cohort (trainer.cohort)
    @torch.no_grad()
    def cohort_after_backward(self, cohort) -> None:
        st = cohort.state_of(self)
        params = [cohort.params[n] for n in self.names]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        keep_t, scale_t, decay_t = st.keep_t, st.scale_t, st.decay_t  # planned by before_step
        old = cohort.gradient_at(st.prev)  # each client at its previous point, its own minibatch
        m = st.m
        torch._foreach_sub_(m, [old[n] for n in self.names])
        cohort.mul_rows_(m, keep_t)  # per-client factors: a fixed number of kernels (cohort/rows.py)
        torch._foreach_add_(m, grads)
        cohort.mul_rows_(st.v, decay_t)
        torch._foreach_addcmul_(st.v, grads, grads, value=1.0 - self.decay)  # a finished client's gradient is 0
        cohort.copy_rows_([st.prev[n] for n in self.names], [p.detach() for p in params])  # a done client's stays
        direction = torch._foreach_div(m, st.H)
        cohort.mul_rows_(direction, scale_t)
        for p, d in zip(params, direction):
            p.grad = d

