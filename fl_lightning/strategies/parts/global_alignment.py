"""GlobalAlignment: local–global alignment with the previous round's global update (seed 004 FedMuon, Eq. (3)).

Seed 004 (Liu, Shang, Zhou, Liu, Liu, Liu, "FedMuon: Accelerating Federated Learning with Matrix Orthogonalization"),
Algorithm 1 / Eq. (3) and the appendix's practical Algorithm 2:

    x_i^{r,k+1} = x_i^{r,k} - η_r [ (1-α)·U Vᵀ + α·Δ_G^r ],      Δ_G^{r+1} = -(1/(S K η_r)) Σ_i (x_i^{r,K} - x^r)

implemented with the paper's Δ_G (our choice; the same steps as the authors' code, ``update_FedMuon``, which stores
avgΔ/η instead):

  * ``client_start``: every param group of the client's optimizer gets its lr multiplied by (1-α) (so the local
    optimizer's step is η_r(1-α)·direction; decoupled weight decay then uses the same scaled lr, as the authors'
    code, decision 004/AMBIG-5 in docs/decisions.md);
  * ``after_step``: for every trainable p, p ← p - η_r·α·Δ_G[p] (applied after the optimizer step, which is the
    bracketed formula; the code does the same);
  * ``broadcast(r)``: Δ_G^r = -(x^r - x^{r-1}) / (K·η_{r-1}) from the previous round's applied global update
    (= avgΔ^{r-1} for the plain mean with server lr 1), zero in round 0 (decision 004/AMBIG-9). Computed lazily from
    a copy of x^{r-1}, so the part's position relative to the aggregation part does not matter.

η_r = ``lr`` × the round's schedule factor. Over the K local steps of round r the alignment term alone re-applies
α·(η_r/η_{r-1})·avgΔ^{r-1}, i.e. exactly α·avgΔ^{r-1} with a constant lr (tested). The base ``lr`` cancels between
Δ_G and the step; it only sets Δ_G's units (the paper's η). K is ``fl.local_steps`` (with ``fl.local_epochs`` it is
the mean step count of last round's clients, which the loop counts: nothing is uploaded).

Options: ``alpha`` (paper default 0.5; 0 = no alignment, the paper's ablation without Δ_G, Table 5),
``scale_optimizer_lr`` (default true: the (1-α) factor on the optimizer; false = the optimizer keeps its own lr:
FedLADA's code adds γ·D/K on top of a full Adam step), ``scale_weight_decay`` (default true: the weight decay rides on
the scaled lr, so it shrinks by (1-α) too, decisions 004/AMBIG-5, 001/#13; false divides the groups' ``weight_decay`` by
(1-α) so the decay stays η·λ·x: FedCM as the released code of seed 001 and seed 004's vision code write it,
x ← x − η((1−γ)g + γD + λx)), ``init`` (Δ_G^0: ``zero``, decision 004/AMBIG-9; ``grad`` = (1/n) Σ_i ∇F_i(x^0; ξ_i),
the mean over ALL clients of one probe minibatch gradient at x^0, taken at setup: Cheng, Huang, Wu & Yuan's FedAvg-M
as we read its g^0, decision 003/#9).

The same part is the global momentum of FedCM (Xu, Wang, Wang & Qi 2021, arXiv 2106.10874: d = α_cm g + (1−α_cm)Δ,
so ``alpha`` = 1 − α_cm) and of FedAvg-M (Cheng et al., ICLR 2024, arXiv 2306.16504, Alg. 1:
g_i = β∇F_i + (1−β)g^r, so ``alpha`` = 1 − β, ``init: grad``).

Downlink: Δ_G (1 model-sized tensor over the trainable params).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...errors import ConfigError
from ...config import Fraction, Positive
from ..base import Aggregate, ClientContext, Msg, Part, ServerContext
from ..round_state import RoundState, shared
from ..records import Field, Record


class GlobalAlignment(Part):
    reads = ("weights", "optimizer.settings")  # what its hooks read of the client's training tensors
    writes = ("optimizer.settings", "weights")  # what its hooks change of the client's training tensors
    INITS = ("zero", "grad")

    def __init__(self, alpha: Fraction = 0.5, lr: Positive = 1.0, scale_optimizer_lr: bool = True, init: str = "zero",
                 scale_weight_decay: bool = True):
        if init not in self.INITS:
            raise ConfigError("init", f"unknown value {init!r}", "use zero (Δ_G^0 = 0) or grad (mean gradient at x^0)")
        self.init = init
        self.alpha, self.lr, self.scale_opt = float(alpha), float(lr), bool(scale_optimizer_lr)
        self.scale_wd = bool(scale_weight_decay)
        self.prev_x: dict[str, Tensor] = {}
        self.prev_factor = 0.0
        self.prev_K = 0.0
        self.DG: dict[str, Tensor] = {}

    # ------------------------------------------------------------------ server side
    # its step reads Δ_G (the server's own tensors, updated in place, broadcast over a cohort's stacked parameters)
    # and −η_r·α from one device tensor kept for the run (filled at each client's start), no host number
    step_plan = ()
    _neg_step: Tensor | None = None
    scratch = ("DG", "_neg_step")  # Δ_G is recomputed in each round's broadcast from the saved prev_x

    def setup(self, server: ServerContext) -> None:
        self.server = server
        self.names = list(server.trainable)
        self.DG = {n: torch.zeros_like(server.global_params[n]) for n in self.names}
        self.G0: dict[str, Tensor] = {}
        if self.init == "grad":
            self.G0 = mean_probe_gradient(self, server, self.names)[0]

    class Down(Record):
        DG = Field("DG/{}")  # Δ_G, the global update direction, per parameter

    def broadcast(self, round_idx: int) -> dict[str, Msg]:
        x = self.server.global_params
        if self.prev_x and self.prev_factor > 0:
            K = float(self.server.local_steps or self.prev_K or 1.0)
            denom = K * self.lr * self.prev_factor
            dg = torch._foreach_div(torch._foreach_sub([self.prev_x[n] for n in self.names],
                                                       [x[n] for n in self.names]), denom)
            # -(x^r - x^{r-1}) / (K η_{r-1}), into the same tensors every round (a replayed step reads them)
            torch._foreach_copy_([self.DG[n] for n in self.names], dg)
        elif self.G0 and not self.prev_x:  # round 0 with init=grad (a resumed run has prev_x and never gets here)
            for n in self.names:
                self.DG[n].copy_(self.G0[n])
        else:
            for t in self.DG.values():
                t.zero_()
        self.prev_x = {n: x[n].detach().clone() for n in self.names}
        self.prev_factor = self.server.round_lr_factor(round_idx)
        down = self.Down(self, {})
        for n in self.names:
            down.DG[n] = Msg(self.DG[n])
        return down.container

    def server_update(self, round_idx: int, agg: Aggregate) -> None:
        if not self.server.local_steps:  # local epochs: the mean K of the round's clients (the loop counts them)
            self.prev_K = agg.mean_steps()

    def state_dict(self) -> dict[str, Tensor]:
        out = {f"prev_x/{n}": t for n, t in self.prev_x.items()}
        out["prev_factor"] = torch.tensor(self.prev_factor, dtype=torch.float64)
        out["prev_K"] = torch.tensor(self.prev_K, dtype=torch.float64)
        return out

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.prev_x = {k[len("prev_x/"):]: state[k].clone() for k in state if k.startswith("prev_x/")}
        self.prev_factor = float(state["prev_factor"])
        self.prev_K = float(state["prev_K"])

    # ------------------------------------------------------------------ client side
    def client_start(self, client: ClientContext) -> None:
        if self.scale_opt:
            for g in client.optimizer.param_groups:
                g["lr"] = g["lr"] * (1.0 - self.alpha)
                if not self.scale_wd and g.get("weight_decay"):
                    g["weight_decay"] = g["weight_decay"] / (1.0 - self.alpha)  # (η(1−α))·(λ/(1−α)) = ηλ
        step = self.lr * client.lr_factor * self.alpha  # η_r·α
        down = self.Down(self, client.received)
        cuda = client.params[self.names[0]].is_cuda
        client.start_state(self, self.Round(deltas={n: down.DG[n] for n in self.names} if step or cuda else {},
                                            step=step))
        # −η_r·α for a traced step (compiled, or replayed as a CUDA graph), a 0-d tensor filled in place: an input of
        # the graph, not a constant of it (under a schedule it changes every round)
        dev = client.params[self.names[0]].device
        if self._neg_step is None or self._neg_step.device != dev:
            self._neg_step = torch.zeros((), dtype=torch.float64, device=dev)
        self._neg_step.fill_(-step)

    @dataclass
    class Round(RoundState):  # the same for every client of a round
        deltas: dict = shared(default_factory=dict)  # Δ_G per parameter ({} when η_r·α = 0 off CUDA: no step)
        step: float = shared(0.0)                    # η_r·α

    def step_tensors(self, client: ClientContext) -> list[Tensor]:
        """What ``after_step`` reads in a replayed step: Δ_G and −η_r·α."""
        return [*client.state_of(self).deltas.values(), *([self._neg_step] if self._neg_step is not None else [])]

    @torch.no_grad()
    def after_step(self, client: ClientContext) -> None:
        """p ← p − η_r α Δ_G: one client's weights or a cohort's (K, ...) alike (Δ_G broadcast over the clients)."""
        st = client.state_of(self)
        if not st.deltas:
            return
        deltas = st.deltas
        params = [client.params[n] for n in deltas]
        d = [dg.to(p.dtype) for p, dg in zip(params, deltas.values())]
        step = client.number(lambda: -st.step, self._neg_step)
        if isinstance(step, Tensor):  # a traced step: −η_r·α an input of the graph (compiled or replayed)
            torch._foreach_add_(params, torch._foreach_mul(d, step))
        else:
            torch._foreach_add_(params, d, alpha=step)  # p ← p - η_r α Δ_G


def mean_probe_gradient(part: Part, server: ServerContext, names: list[str]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(1/n) Σ_i ∇F_i(x^0; ξ_i) and (1/n) Σ_i ∇F_i(x^0; ξ_i)² over ALL n clients, one probe minibatch each, summed
    across processes (``init: grad`` of FedAvg-M's g^0 and FAFED's m^0, v^0)."""
    if server.probe_gradient is None:
        raise part.error("init", "init=grad needs the loop's probe_gradient", "run through FederatedLoop, or set init=zero")
    total = {n: torch.zeros_like(server.global_params[n]) for n in names}
    squares = {n: torch.zeros_like(server.global_params[n]) for n in names}
    for cid in server.owned_clients:
        g = server.probe_gradient(cid)
        for n in names:
            total[n].add_(g[n].to(total[n].dtype))
            squares[n].addcmul_(g[n].to(total[n].dtype), g[n].to(total[n].dtype))
    reduce = server.all_reduce_sum or (lambda t: t)
    return ({n: reduce(t) / server.num_clients for n, t in total.items()},
            {n: reduce(t) / server.num_clients for n, t in squares.items()})

