"""PreconditionerDrift: the preconditioner drift Δ_D of seed 001 (FedPAC), logged per round as ``precond_drift``.

Seed 001 (Liu, Shang, Liu, Liu, An, Liu, "Taming Preconditioner Drift: Unlocking the Potential of Second-Order
Optimizers for Federated Learning on Non-IID Data"), appendix eq. (15), i.e. Def. 1 (Sec. 3.3, eq. (7)) over the
round's clients:

    Θ̄^{r,K} = (1/S) Σ_{i∈S_r} Θ_i^{r,K},        Δ_D^r = (1/S) Σ_{i∈S_r} ‖Θ_i^{r,K} − Θ̄^{r,K}‖²

over the participating clients, with ‖·‖² the squared Frobenius norm summed over every Θ tensor (decision 001/#15
in docs/decisions.md, our choice, as the authors' code's ``preconditioner_drift()``; the per-layer spectral variant
of Fig. 3 is not computed). Θ is what the optimizer's state adapter names (``theta``: SOAP's L, R; Sophia's h; Muon's
m; fl_lightning/optim/adapters.py), read at the end of the round, before any codec: the clients' true states, also
for a light variant and for Local-X (where Θ̄ is never broadcast; our choice).

Computed exactly from streaming sums in fp64 through the metrics channel: every client uploads its Θ_i in fp64 and
the scalar ‖Θ_i‖² (diagnostic messages, ``nbits = 0``: they are not part of the method and cost no bits); the server
returns Δ_D = mean_i ‖Θ_i‖² − ‖mean_i Θ_i‖² (= the definition; uniform weights). It costs an fp64 copy of Θ in the
round's sums. ``enabled: false`` turns it off (nothing uploaded, no metric). Add it to any method with
``+method.parts.drift._target_=fl_lightning.strategies.parts.PreconditionerDrift``; the ``fedpac_*`` methods carry
it switched by ``method.log_drift``.
"""
from __future__ import annotations

import torch

from ...errors import ConfigError
from ...optim.adapters import adapter_for
from ..base import Aggregate, ClientContext, Msg, Part
from ..records import Field, Record


class PreconditionerDrift(Part):
    reads = ("optimizer.state",)  # what its hooks read of the client's training tensors
    def __init__(self, enabled: bool = True, state_keys="theta"):
        if not isinstance(enabled, bool):
            raise ConfigError("enabled", f"expected true or false, got {enabled!r}", "set enabled: true or false")
        if isinstance(state_keys, str) and state_keys != "theta" or not state_keys:
            raise ConfigError("state_keys", f"expected 'theta' or a list of optimizer-state entries, got {state_keys!r}",
                              "use theta (the adapter's preconditioner) or e.g. [exp_avg_sq]")
        self.enabled = enabled
        self.state_keys = state_keys if state_keys == "theta" else tuple(state_keys)

    def _keys(self, adapter, p) -> tuple[str, ...]:
        if self.state_keys != "theta":
            return self.state_keys
        theta = adapter.theta(p)
        if theta is None:
            raise self.error("state_keys", f"{type(adapter.opt).__name__} names no preconditioner state (theta)",
                             "list the entries to measure, e.g. [exp_avg_sq], or use Muon, Sophia or SOAP")
        return tuple(theta)

    class Up(Record):  # free side channels (nbits=0): each preconditioner entry, and their squared norm
        T = Field("T/{}/{}")  # parameter, optimizer-state entry
        sq = Field("sq")

    def client_end(self, client: ClientContext) -> dict[str, Msg]:
        if not self.enabled:
            return {}
        adapter = adapter_for(client.optimizer)
        device = next(iter(client.params.values())).device
        sq = torch.zeros((), dtype=torch.float64, device=device)
        out = self.Up(self, {})
        for n, p in client.params.items():
            exported = adapter.export_state(p)
            for sk in self._keys(adapter, p):
                v = exported.get(sk)
                if v is None or v.ndim == 0:
                    continue
                v64 = v.detach().to(torch.float64)
                out.T[n, sk] = Msg(v64, nbits=0)
                sq += v64.square().sum()
        out.sq.set(Msg(sq, nbits=0))
        return out.container

    def server_update(self, round_idx: int, agg: Aggregate) -> dict[str, float]:
        up = self.Up(self, agg)
        if not self.enabled or () not in up.sq:
            return {}
        bar = sum(float(agg.mean(t).square().sum()) for t in up.T.keys())
        return {"precond_drift": float(up.sq.mean()) - bar}
