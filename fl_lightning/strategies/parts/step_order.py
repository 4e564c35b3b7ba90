"""MuonStepOrder: seed 003's Algorithm 1 step order for the Muon parameters.

Seed 003 (Zhang & Gao, "On Provable Benefits of Muon in Federated Learning"), Alg. 1 lines 3–5 and Eqs. (4.1)–(4.2):

    X_{t+1} = X_t − η·Orth(M_t)                         (step with the momentum as it is)
    M_{t+1} = (1 − β) M_t + β ∇f(X_{t+1}; ξ_{t+1})      (then the gradient at the NEW point)

so the momentum averaged at the end of a round already holds every client's gradient at its final local point,
and a round's first step uses Orth(M̄) (derived from Alg. 1). The loop's usual order is
grad → momentum → step; with τ = K local steps this part turns it into Alg. 1's order with the same number of
gradients (τ per round):

    client_start           one step with the momentum as received (M̄, or M_0 in round 0), no gradient absorbed
    last local step        the momentum absorbs the gradient at X_τ but the Muon parameters do not move (lr 0)

Only the Muon (matrix) parameters follow Alg. 1's order; the auxiliary optimizer's parameters (AdamW for biases
and norms, which Alg. 1 does not cover; decision 003/#5 in docs/decisions.md) take their usual step after every
gradient.

``order``: ``alg1`` (default, Alg. 1 as printed: the recommended default) | ``standard`` (grad → momentum → orth → step,
the ablation; this part then does nothing). Needs the fl_lightning Muon optimizer with ``ema``/``ema_beta``
momentum and no Nesterov, after the part that loads the momentum (OptimizerStateAverage) in the parts list.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import ConfigError
from ...optim.capabilities import StepsAlongDirection
from ..base import ClientContext, Part
from ..round_state import RoundState, own


class MuonStepOrder(Part):
    reads = ("weights", "optimizer.settings", "optimizer.state")  # what its hooks read of the client's training tensors
    writes = ("optimizer.settings", "weights")  # what its hooks change of the client's training tensors
    ORDERS = ("alg1", "standard")
    # whether a step is the round's last is planned before it (before_step): the others do nothing here; at the last
    # one the Muon groups' lr is 0 (in a cohort, the clients at their last step keep their Muon rows)
    step_plan = ("last",)

    def __init__(self, order: str = "alg1"):
        if order not in self.ORDERS:
            raise ConfigError("order", f"unknown step order {order!r}", "use alg1 (seed 003 Alg. 1) or standard")
        self.order = order

    def _muon_groups(self, client: ClientContext) -> list[dict]:
        opt = client.optimizer
        if not isinstance(opt, StepsAlongDirection):
            raise self.error("order", "order=alg1 needs the fl_lightning.optim.Muon local optimizer",
                              "use Muon, or set method.order=standard")
        groups = [g for g in opt.param_groups if g["use_muon"]]
        for g in groups:
            if g["momentum_style"] == "heavy_ball" or g["nesterov"]:
                raise self.error("order", "order=alg1 needs EMA momentum without Nesterov (Alg. 1 Eq. 4.1)",
                                  "set the Muon momentum_style to ema and nesterov=false, or method.order=standard")
        return groups

    @dataclass
    class Round(RoundState):
        last: bool = own(False)   # this step is the round's last (alg1: taken with lr 0, decided before the step)
        lrs: list | None = own()  # the Muon groups' lrs while that step runs with lr 0 (after_backward to after_step)
        kept: tuple | None = own()  # a cohort's: (clients at their last step, the Muon weights before the step)

    @torch.no_grad()
    def client_start(self, client: ClientContext) -> None:
        client.start_state(self, self.Round())
        if self.order != "alg1":
            return
        opt = client.optimizer
        for g in self._muon_groups(client):
            for p in g["params"]:
                opt.apply_direction(p, opt.momentum_buffer(p))  # X <- X - lr * Orth(M): Alg. 1 line 4, M as received

    def before_step(self, client: ClientContext) -> None:
        # whether this is the round's last step, decided outside the step: a compiled step reads one flag, not the
        # step count and K (guards that fail at the next step, and for every other K: under local epochs per client)
        st = client.state_of(self)
        if client.batched:  # a cohort: the clients at their own last step
            st.last = [self.order == "alg1" and client.step == c.num_steps - 1 for c in client.clients]
        else:
            st.last = self.order == "alg1" and client.step == client.num_steps - 1
        st.lrs = st.kept = None  # what the step itself sets (the last step's lrs, a cohort's kept rows)

    def after_backward(self, client: ClientContext) -> None:
        st = client.state_of(self)
        if st.last:
            groups = self._muon_groups(client)
            st.lrs = [g["lr"] for g in groups]
            for g in groups:
                g["lr"] = 0.0  # absorb the gradient at X_tau into M (line 5) without another step

    def after_step(self, client: ClientContext) -> None:
        st = client.state_of(self)
        lrs, st.lrs = st.lrs, None
        if lrs is not None:
            for g, lr in zip(self._muon_groups(client), lrs):
                g["lr"] = lr

    @torch.no_grad()
    def cohort_after_backward(self, cohort) -> None:
        st = cohort.state_of(self)
        last = st.last  # planned by before_step (host numbers: no sync)
        st.kept = None
        if not any(last):
            return
        muon = [p for g in cohort.optimizer.param_groups if g["use_muon"] for p in g["params"]]
        mask = cohort.per_client(last, torch.bool)
        st.kept = (mask, [(p, p.clone()) for p in muon])

    @torch.no_grad()
    def cohort_after_step(self, cohort) -> None:
        kept = cohort.state_of(self).kept
        if kept is None:
            return
        mask, saved = kept
        for p, old in saved:  # Alg. 1 line 5: the last step's gradient into M, X_tau unmoved
            p.copy_(torch.where(mask.view(-1, *([1] * (p.dim() - 1))), old, p))
