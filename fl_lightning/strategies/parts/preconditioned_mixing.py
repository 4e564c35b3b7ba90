"""PreconditionedMixing: the server mixes the client models through their diagonal preconditioners (FedPM).

FedPM (Ishii et al. 2025, arXiv 2511.09100; a baseline of seed 001, Tables 12–13, which only names it: the rule is
the cited original's): instead of the plain mean,

    x^{r+1} = (Σ_i P_i)^{-1} Σ_i P_i x_i^{r,K}

with P_i = diag(h_i), h_i the client's final diagonal curvature (Sophia's Hessian EMA, the entry its state adapter
names as Θ; ``state_keys``), i.e. an element-wise h-weighted average of the client models. Damped as
P_i = diag(h_i + λ) (``damping`` λ > 0; our choice; seed 001 gives none): a coordinate where every client's
h is 0 gets the plain mean, and λ → ∞ is FedAvg. Written on deltas, which is the same mixing:

    x^{r+1} = x^r + Σ_i (h_i + λ) ⊙ (x_i − x^r) / (Σ_i h_i + S·λ)

Uplink per client: (h_i + λ) ⊙ (x_i − x^r) and h_i (2 model sizes); tensors the optimizer keeps no h for (float
buffers such as BN statistics) travel as x_i − x^r and take the plain mean. Use it in place of ModelAverage, with
the local optimizer's ``state: reset`` (the h of the finished round).
"""
from __future__ import annotations

from ...config import Positive
from ...errors import ConfigError
from ...optim.adapters import adapter_for
from ..base import Aggregate, ClientContext, Msg, Part, ServerContext
from ..records import Field, Record


class PreconditionedMixing(Part):
    reads = ("weights", "optimizer.state")  # what its hooks read of the client's training tensors
    def __init__(self, state_keys="theta", damping: Positive = 1e-8):
        if not isinstance(state_keys, (str, list, tuple)) or isinstance(state_keys, str) and state_keys != "theta" or \
                not state_keys:
            raise ConfigError("state_keys", f"expected 'theta' or a one-entry list, got {state_keys!r}",
                              "use theta (Sophia's hessian) or e.g. [exp_avg_sq]")
        if not isinstance(state_keys, str) and len(state_keys) != 1:
            raise ConfigError("state_keys", f"one diagonal preconditioner entry expected, got {list(state_keys)}",
                              "name one entry, e.g. [hessian]")
        self.state_keys, self.damping = state_keys, float(damping)

    def setup(self, server: ServerContext) -> None:
        self.server = server

    def _entry(self, adapter, p) -> str | None:
        if self.state_keys != "theta":
            return self.state_keys[0]
        theta = adapter.theta(p)
        if theta is None or len(theta) > 1:
            raise self.error("state_keys", f"{type(adapter.opt).__name__} names no single diagonal preconditioner "
                             f"(theta = {theta})", "use the Sophia local optimizer or name the entry, e.g. [exp_avg_sq]")
        return theta[0] if theta else None

    class Up(Record):  # per parameter: (h + δ)·Δ and h where a preconditioner h exists, else Δ alone
        hx = Field("hx/{}")
        h = Field("h/{}")
        x = Field("x/{}")

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        adapter = adapter_for(client.optimizer)
        out = self.Up(self, {})
        for n, x in client.global_params.items():
            delta = client.local[n].detach() - x
            p = client.params.get(n)
            entry = self._entry(adapter, p) if p is not None else None
            h = adapter.export_state(p).get(entry) if entry is not None else None
            if h is None or h.shape != delta.shape:
                out.x[n] = Msg(delta)
                continue
            h = h.detach().to(delta.dtype)
            out.hx[n] = Msg((h + self.damping) * delta)
            out.h[n] = Msg(h)
        return out.container

    def server_update(self, round_idx: int, agg: Aggregate) -> None:
        up = self.Up(self, agg)
        for n, x in self.server.global_params.items():
            if n in up.hx:
                s = agg.weights[up.hx.path(n)]  # the number of clients that sent it (weights are 1)
                step = up.hx.sum(n) / (up.h.sum(n) + s * self.damping)
            else:
                step = up.x.mean(n)
            x.add_(step.to(x.dtype))
