"""LMOControlVariates: SCAFFOLD-style control variates *inside* the LMO (seed 000 FedMuon, Sec. 4, Alg. 1).

Seed 000 ("FedMuon: federated learning with bias-corrected LMO-based optimization", anonymous ICLR submission),
Algorithm 1 lines 6–17 and Eqs. (8)–(9). Client i keeps its EMA momentum M_i and a control variate C_i; the
server keeps C. Every local step (line 8–9, with the local optimizer :class:`fl_lightning.optim.Muon` in
``momentum_style="ema"``):

    M_i ← (1-α) M_i + α ∇F_i(X_i; ξ)                       (line 8, the optimizer's momentum_buffer)
    G_i = M_i - C_i + C                                    (Eq. 8: Muon.set_correction({p: C - C_i}))
    X_i ← X_i + η·s(d1,d2)·lmo(G_i)                        (line 9, Eq. 9; s = per-layer scale, Sec. 7.1)

and at the end of the round C_i ← M_i (line 11), upload ΔC_i = C_i^{new} - C_i^{old} (line 12; equivalent to
sending C_i^{new}), server C ← C + (1/n) Σ_{i∈S} ΔC_i (line 17; the paper's "1/N" is a typo for 1/n, decision
000/A7 in docs/decisions.md; the scale s is decision 000/A1).

What this part does (the local optimizer, the model upload and the (n-S)/n rule are other parts):

  * ``client_start``: the client's momentum starts from its stored C_i (the invariant M_i^{(r,0)} = C_i^{(r)},
    Lemma 9), unless the local optimizer already restored a momentum from persistent state (then that is used
    and equals C_i by construction); corrections ``C - C_i`` are handed to the optimizer.
  * ``client_end``: C_i ← M_i in the client state, upload ΔC_i (dense, weight 1: 1 model-sized tensor).
  * ``broadcast``: C (1 model-sized tensor down, on top of the weights).
  * ``server_update``: C ← C + Σ ΔC_i / n.

So the local optimizer may run with ``state: reset``: the momentum persists through C_i (one model-sized tensor
per client in the ClientStateStore instead of two).

Options (points the paper leaves open):
  * ``init`` (decision 000/A6): ``grad`` (default; theory, Thms 2–3: every one of the n clients takes one minibatch
    gradient at X^{(0)} via ``ServerContext.probe_gradient``; M_i = C_i = g_i, C = mean_i g_i; with several
    processes each process probes the clients it owns and C is all-reduced) | ``zero`` (M_i = C_i = C = 0: round 0
    is LocalMuon, Thm 1's setting).
  * ``correct_1d`` (decision 000/A4): ``true`` (default, option A: non-matrix params take
    x ← x - η_sgd·(M - C_i + C), the "single matrix" view of Alg. 1) | ``false`` (option B: plain momentum SGD on
    ndim < 2 params; no C/ΔC for them, their momentum still persists through C_i).
  * The aggregation rule (decision 000/A8) is the ModelAverage part's ``rule`` (``n_minus_s`` default, ``mean``
    alternative).

Removing the LMO (``Muon(lmo="neg_identity", scale_mode="none")``) and α = 1 gives the SCAFFOLD variant the
paper says FedMuon recovers (Sec. 4; decision 000/A20), with c_i = the last local stochastic gradient (tested in
tests/fidelity/test_fedmuon_identities.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...errors import ConfigError
from ...optim.adapters import adapter_for
from ...optim.state import fresh_entry
from ..base import ClientContext, Msg, ServerContext
from ..round_state import RoundState, own
from ..records import Field, Record
from .control_variate import ServerControlVariate


def _acc_dtype(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


class LMOControlVariates(ServerControlVariate):
    reads = ("optimizer.state",)  # what its hooks read of the client's training tensors
    writes = ("optimizer.corrections", "optimizer.state")  # what its hooks change of the client's training tensors
    INITS = ("grad", "zero")

    class Down(Record):
        cv = Field("C/{}")  # the server's variate C, broadcast

    class Up(Record):
        delta = Field("dC/{}")  # a client's change ΔC_i

    class State(Record):
        c_i = Field("C_i/{}")  # a client's own variate C_i (persistent)

    def __init__(self, init: str = "grad", correct_1d: bool = True):
        if init not in self.INITS:
            raise ConfigError("init", f"unknown init {init!r}", "use grad (theory) or zero")
        super().__init__()
        self.init, self.correct_1d = init, bool(correct_1d)

    @property
    def C(self) -> dict[str, Tensor]:  # the paper's name for the server variate
        return self.cv

    # ------------------------------------------------------------------ server side
    def setup(self, server: ServerContext) -> None:
        self.server = server
        params = dict(server.module.named_parameters())
        self.names = list(server.trainable)
        self.corrected = [n for n in self.names if self.correct_1d or params[n].ndim >= 2]
        # server state in fp32 (fp64 stays fp64), whatever the training precision
        self.cv = {n: torch.zeros_like(params[n], dtype=_acc_dtype(params[n])) for n in self.corrected}
        if self.init == "grad":
            if server.probe_gradient is None or server.store is None:
                raise self.error("init", "init=grad needs the loop's probe_gradient and client store",
                                 "run through FederatedLoop, or set init: zero")
            local_sum = {n: torch.zeros_like(t) for n, t in self.C.items()}
            for cid in server.owned_clients:
                g = server.probe_gradient(cid)
                state = self.State(self, server.store.get(cid))
                for n in self.names:
                    state.c_i[n] = g[n].detach()
                server.store.put(cid, state.container)
                for n in self.corrected:
                    local_sum[n].add_(g[n].to(local_sum[n].dtype))
            reduce = server.all_reduce_sum or (lambda t: t)
            for n in self.corrected:
                self.cv[n] = reduce(local_sum[n]) / server.num_clients

    # ------------------------------------------------------------------ client side
    def _adapter(self, client: ClientContext):
        adapter = adapter_for(client.optimizer)
        if not adapter.supports_correction:
            raise ConfigError("method.parts.local_optimizer.optimizer",
                              "fedmuon_bc needs the fl_lightning.optim.Muon optimizer (corrections enter its LMO)",
                              "use a Muon optimizer (optimizer=muon_000)")
        return adapter

    def client_start(self, client: ClientContext) -> None:
        adapter = self._adapter(client)
        old: dict[str, Tensor] = {}
        state, down = self.State(self, client.state), self.Down(self, client.received)
        for n in self.names:
            p = client.params[n]
            if "momentum_buffer" not in (adapter.entries(p) or ()):
                raise ConfigError("method.parts.local_optimizer.optimizer.aux", "fedmuon_bc corrects the momentum of non-matrix params; AdamW has none",
                                  "use the Muon optimizer's aux: sgd (seed 000's momentum SGD)")
            stored = state.c_i.get(n)
            ci = stored.to(p.dtype) if stored is not None else torch.zeros_like(p)
            old[n] = ci
            if fresh_entry(adapter.opt, p, "momentum_buffer"):  # M_i^{(r,0)} = C_i^{(r)} (Lemma 9)
                adapter.import_state(p, {"momentum_buffer": ci})
        corr = {}
        for n in self.corrected:
            c = down.cv[n]
            corr[client.params[n]] = c.to(old[n].dtype) - old[n]
        adapter.set_correction(corr)
        client.start_state(self, self.Round(old))

    @dataclass
    class Round(RoundState):
        old: dict = own(default_factory=dict)  # C_i as the round began, per parameter

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        adapter = adapter_for(client.optimizer)
        old = client.state_of(self).old
        out, state = self.Up(self, {}), self.State(self, client.state)
        for n in self.names:
            m = adapter.export_state(client.params[n])["momentum_buffer"].detach()
            if n in self.C:
                out.delta[n] = Msg(m - old[n], 1.0)
            state.c_i[n] = m.clone()
        adapter.set_correction(None)
        return out.container
