"""OptimizerStateAverage: clients upload optimizer state, the server averages it, every client starts the next
round from the average. Seed 003 FedMuon's momentum averaging, seed 004 FedMuon's momentum aggregation m̄; the same
part carries Sophia's h, SOAP's L and R or Adam's v (any entry the optimizer's state adapter exports).

Seed 003 (Zhang & Gao, "On Provable Benefits of Muon in Federated Learning"), Alg. 1 line 7: every τ local steps
X̄ = mean_k X^{(k)} and **M̄ = mean_k M^{(k)}**, both broadcast, and every worker restarts from them (Sec. 4,
Alg. 1 lines 6–7). Seed 004 (Liu et al., "FedMuon: Accelerating Federated Learning with Matrix Orthogonalization"),
Alg. 1: M_i^{r,0} ← M̄^r, M̄^{r+1} = (1/S) Σ_i M_i^{r,K} over the Muon (matrix) parameters (Sec. 5.2).

    client_start  import M̄ (received) through the optimizer's state adapter (fl_lightning/optim/adapters.py: the
                  missing entries are completed, numbers cast to the optimizer's type, derived state refreshed)
                  (round 0: nothing, or with ``init=grad`` the client's own minibatch gradient at X^0 as the
                  momentum: seed 003 Alg. 1 line 1)
    client_end    upload the exported entries (one Msg per param and entry; ``codec`` e.g. a truncated SVD)
    server_update M̄ ← uniform mean of the uploads (over the sampled clients)
    broadcast     M̄ (dense, as in the authors' code; the mean of S low-rank matrices is not low-rank)

Options:
  * ``params``: ``muon`` (params whose adapter kind is ``muon``: the Muon optimizer's matrix groups; seed 004: "M̄
    for every Muon-handled matrix", the AdamW state of 1-D params starts fresh every round) | ``all`` (every
    trainable param that has the state).
  * ``state_keys``: which optimizer-state entries travel, or ``all`` (every entry the adapter lists for the
    param), or ``theta`` (the preconditioner Θ of seed 001 Sec. 3.2 the adapter names: Muon's m, Sophia's h, SOAP's
    L and R; FedPAC's alignment). ``[momentum_buffer]`` (Muon / SGD momentum) by default;
    the recommended default for seed 003 also averages the aux AdamW moments (the paper is silent; decision
    003/#6 in docs/decisions.md): ``[momentum_buffer, exp_avg, exp_avg_sq, step]`` (``step`` travels as a
    0-d tensor so Adam's bias correction continues; the alternative ``[momentum_buffer]`` keeps AdamW per-round).
  * ``init``: ``zero`` (seed 004: M̄^1 = 0, decision 004/AMBIG-9) | ``grad`` (seed 003 Alg. 1 line 1: M_0^{(k)} = the
    worker's own stochastic gradient at X_0, not averaged; taken with ``ServerContext.probe_gradient`` at setup).
  * ``codec``: a codec object (``fl_lightning/codecs/``); null = dense. FedMuon_SVD (seed 004 Sec. 5.2, Table 7) uses
    ``fl_lightning.codecs.LowRankSVD``: matrix momenta travel as (U_r, S_r, V_r), ``Msg.nbits`` = the bits of the
    three factors; rank by ``mode`` ∈ {storage_frac (default, r = int(frac·m·n/(m+n+1))), rank_frac (r =
    int(frac·min(m, n)))} with ``frac`` (default 0.05). 0-d entries (Adam's ``step``) travel as one float64.

The local optimizer should use ``state: reset`` (clients are stateless across rounds in both papers).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ...codecs import Dense
from ...codecs.base import CodecState
from ...codecs.base import check_codec
from ...errors import ConfigError
from ...optim.adapters import adapter_for
from ..base import Aggregate, ClientContext, Msg, Part, ServerContext
from ..round_state import RoundState, own
from ..records import Field, Record


class OptimizerStateAverage(Part):
    reads = ("optimizer.state",)  # what its hooks read of the client's training tensors
    writes = ("optimizer.state",)  # what its hooks change of the client's training tensors
    PARAMS = ("muon", "all")
    INITS = ("zero", "grad")

    def __init__(self, params: str = "muon", state_keys: str | list[str] = ("momentum_buffer",), init: str = "zero",
                 codec=None):
        for key, val, allowed in (("params", params, self.PARAMS), ("init", init, self.INITS)):
            if val not in allowed:
                raise ConfigError(key, f"unknown value {val!r}", f"use one of {', '.join(allowed)}")
        check_codec(codec, example="fl_lightning.codecs.LowRankSVD", null="dense")
        if not isinstance(state_keys, (str, list, tuple)) or isinstance(state_keys, str) and state_keys not in (
                "all", "theta") or not state_keys:
            raise ConfigError("state_keys", f"expected a list of optimizer-state entries, 'all' or 'theta', got "
                              f"{state_keys!r}", "e.g. [momentum_buffer], [exp_avg, exp_avg_sq, step], all or theta")
        self.params, self.init = params, init
        self.state_keys = state_keys if state_keys in ("all", "theta") else tuple(state_keys)
        self.codec = codec if codec is not None else Dense()
        self.Mbar: dict[str, Tensor] = {}

    class Wire(Record):  # up: each client's entries; down: their means M̄ (the server keeps them as they came)
        M = Field("M/{}/{}")  # parameter, optimizer-state entry

    class State(Record):
        M0 = Field("M0/{}")  # init=grad: a client's gradient at X^0, its first momentum (taken at its first round)

    # ------------------------------------------------------------------ server side
    def setup(self, server: ServerContext) -> None:
        self.server = server
        if self.init == "grad":
            if server.probe_gradient is None or server.store is None:
                raise self.error("init", "init=grad needs the loop's probe_gradient and client store",
                                  "run through FederatedLoop, or set init=zero")
            for cid in server.owned_clients:
                g = server.probe_gradient(cid)
                state = self.State(self, server.store.get(cid))
                for n, t in g.items():
                    state.M0[n] = t.detach()
                server.store.put(cid, state.container)

    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        return {k: Msg(v) for k, v in self.Mbar.items()}

    def server_update(self, round_idx: int, agg: Aggregate) -> None:
        for k in self.Wire(self, agg).M.keys():
            self.Mbar[k] = agg.mean(k)

    def state_dict(self) -> dict[str, Tensor]:  # without the part's name
        pre = self.Wire(self, self.Mbar).prefix
        return {k[len(pre):]: v for k, v in self.Mbar.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        pre = self.Wire(self, self.Mbar).prefix
        self.Mbar = {pre + k: v.clone() for k, v in state.items()}

    # ------------------------------------------------------------------ client side
    def _selected(self, client: ClientContext, adapter) -> list[str]:
        if self.params == "all":
            return list(client.params)
        names = [n for n, p in client.params.items() if adapter.param_kind(p) == "muon"]
        if not names:
            raise self.error("params", f"params=muon but {type(client.optimizer).__name__} updates no parameter "
                             "as a Muon matrix", "use the Muon local optimizer or set params=all")
        return names

    def _keys(self, adapter, p: Tensor) -> tuple[str, ...]:
        if self.state_keys == "theta":
            theta = adapter.theta(p)
            if theta is None:
                raise self.error("state_keys", f"{type(adapter.opt).__name__} names no preconditioner state (theta)",
                                 "list the entries to average, e.g. [exp_avg_sq], or use Muon, Sophia or SOAP")
            return tuple(theta)
        if self.state_keys != "all":
            return self.state_keys
        entries = adapter.entries(p)
        return tuple(entries) if entries is not None else tuple(adapter.export_state(p))

    def client_start(self, client: ClientContext) -> None:
        adapter = adapter_for(client.optimizer)
        names = self._selected(client, adapter)
        client.start_state(self, self.Round(names))
        state, down = self.State(self, client.state), self.Wire(self, client.received)
        m0 = {k: client.state.pop(k) for k in list(state.M0.keys())}
        got = False
        for n in names:
            p = client.params[n]
            values = {}
            for sk in self._keys(adapter, p):
                v = down.M.get((n, sk))
                if v is not None:
                    values[sk] = v
            if values:
                got = True
                adapter.import_state(p, values)
        if not got and m0:  # round 0 with init=grad: own gradient at X^0 as the starting momentum
            for n in names:
                p = client.params[n]
                entries = adapter.entries(p)
                if (entries is None or "momentum_buffer" in entries) and state.M0.path(n) in m0:
                    adapter.import_state(p, {"momentum_buffer": m0[state.M0.path(n)]})

    @dataclass
    class Round(RoundState):
        names: list = own(default_factory=list)  # the parameters whose optimizer state this client averages

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        adapter = adapter_for(client.optimizer)
        out = self.Wire(self, {})
        rng = client.codec_rng()
        for n in client.state_of(self).names:
            p = client.params[n]
            exported = adapter.export_state(p)
            for sk in self._keys(adapter, p):
                v = exported.get(sk)
                if v is None:
                    continue
                own = CodecState(client.state, out.M.path((n, sk)))  # the codec's memory for this entry
                out.M[n, sk] = Msg(v, 1.0) if v.ndim == 0 else self.codec.encode(v, own, rng=rng)
        return out.container

