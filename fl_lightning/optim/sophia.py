"""Sophia: a clipped, diagonally preconditioned momentum step (Liu, Li, Hall, Liang, Ma, "Sophia: A Scalable
Stochastic Second-order Optimizer for Language Model Pre-training", ICLR 2024, arXiv 2305.14342, Alg. 3; seed 001
FedPAC, Liu et al., "Taming Preconditioner Drift", ICML submission: Alg. 8 "Local Sophia").

Per parameter θ with gradient g, momentum m and Hessian-diagonal EMA h:

    m ← β1 m + (1−β1) g
    h ← β2 h + (1−β2) max(ĥ, 0)           only when an estimate ĥ arrives (``update_hessian``; Alg. 8's
                                          positive part; every f_h steps, from :class:`~fl_lightning.strategies.parts.
                                          SophiaHessian`: Hutchinson, Gauss–Newton–Bartlett or g⊙g)
    D = clip(m / max(γ·h, ε), −ρ, ρ)      ``denominator="max"`` (Alg. 3 and Alg. 8) | ``"add"``: m / (γ·h + ε)
                                          (FedPAC's main text, and SophiaG's released code with γ = ρ_code·bs)
    θ ← θ·(1 − η·λ) − η·D                 decoupled weight decay on the old θ (Alg. 8: θ − η(D + λθ))

Liu et al.'s Alg. 3 is γ = their γ, ρ = 1; FedPAC's Alg. 8 is γ = 1, ρ = their ρ; the two are the same family
(clip(m/max(γh, ε), 1) = clip(m/max(h, ε/γ), γ)/γ). Defaults: seed 001 Table 8 (lr 3e-4, betas (0.9, 0.99),
λ = 0.01 as the paper states; the released code hard-codes 0.1: set ``weight_decay=0.1``), γ = 1, ε = 1e-12 and
ρ = 1 (the paper gives no ρ, ε; tuned once on Local Sophia, decision 001/#12 in docs/decisions.md). State per
parameter: ``step`` (int), ``exp_avg`` (m), ``hessian`` (h); Θ = {h} (FedPAC paper, Sec. 3.2) is what FedPAC aligns.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated

import torch
from torch import Tensor

from ..config import Betas, LearningRate, NonNegative, OneOf, Positive
from .adapters import StateAdapter
from .scalars import foreach_add_scaled_

__all__ = ["Sophia", "SophiaAdapter"]

DENOMINATORS = ("max", "add")


class Sophia(torch.optim.Optimizer):
    """Sophia (see the module docstring). Feed curvature with ``update_hessian({param: ĥ})``."""

    cohort_form = "elementwise"  # trainer.cohort: an entry's update reads only that entry (fl_lightning/cohort/)
    cohort_counters = ("step",)  # a cohort of clients with their own counts holds it per client, (K,)

    def __init__(self, params: Iterable, lr: LearningRate = 3e-4, betas: Betas = (0.9, 0.99),
                 rho: Positive = 1.0, gamma: Positive = 1.0, eps: NonNegative = 1e-12, weight_decay: NonNegative = 0.01,
                 denominator: Annotated[str, OneOf(*DENOMINATORS)] = "max"):
        betas = tuple(betas)
        if lr < 0 or weight_decay < 0 or eps < 0:
            raise ValueError("lr, eps and weight_decay must be >= 0")
        if rho <= 0 or gamma <= 0:
            raise ValueError(f"rho and gamma must be > 0, got rho={rho}, gamma={gamma}")
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas}")
        if denominator not in DENOMINATORS:
            raise ValueError(f"denominator must be one of {DENOMINATORS}, got {denominator!r}")
        super().__init__(params, dict(lr=lr, betas=betas, rho=rho, gamma=gamma, eps=eps, weight_decay=weight_decay,
                                      denominator=denominator))

    def _state(self, p: Tensor) -> dict:
        st = self.state[p]
        if "exp_avg" not in st:
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["hessian"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return st

    @torch.no_grad()
    def update_hessian(self, estimates: Mapping[Tensor, Tensor]) -> None:
        """h ← β2 h + (1−β2) max(ĥ, 0) for each param given (Alg. 8, the Hessian line), all at once."""
        for group in self.param_groups:
            beta2 = group["betas"][1]
            ps = [p for p in group["params"] if estimates.get(p) is not None]
            if not ps:
                continue
            hs = [self._state(p)["hessian"] for p in ps]
            ests = torch._foreach_clamp_min([estimates[p] for p in ps], 0)
            ests = [e.to(p.dtype) for e, p in zip(ests, ps)]
            torch._foreach_mul_(hs, beta2)
            torch._foreach_add_(hs, ests, alpha=1 - beta2)

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every param with multi-tensor ops (``torch._foreach_*``): the same arithmetic in the same order
        as one tensor at a time (equal bits), one launch per op for the group on a GPU."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1 = group["betas"][0]
            lr, wd, rho, gamma, eps = group["lr"], group["weight_decay"], group["rho"], group["gamma"], group["eps"]
            ps = [p for p in group["params"] if p.grad is not None]
            if not ps:
                continue
            if any(p.grad.is_sparse for p in ps):
                raise RuntimeError("Sophia does not support sparse gradients")
            states = [self._state(p) for p in ps]
            for st in states:
                st["step"] += 1
            ms, hs = [st["exp_avg"] for st in states], [st["hessian"] for st in states]
            torch._foreach_lerp_(ms, [p.grad for p in ps], 1 - beta1)  # m ← β1 m + (1−β1) g
            denom = torch._foreach_mul(hs, gamma)
            if group["denominator"] == "max":
                torch._foreach_clamp_min_(denom, eps)  # max(γ·h, ε)
            else:
                torch._foreach_add_(denom, eps)  # γ·h + ε
            d = torch._foreach_div(ms, denom)
            torch._foreach_clamp_min_(d, -rho)
            torch._foreach_clamp_max_(d, rho)  # clip(m / denom, −ρ, ρ)
            if wd > 0:
                torch._foreach_mul_(ps, 1 - lr * wd)
            foreach_add_scaled_(ps, d, -lr)
        return loss


class SophiaAdapter(StateAdapter):
    """Sophia's state for federated parts: ``step`` (int), ``exp_avg`` (m), ``hessian`` (h); Θ = {h}."""

    zero_is_fresh = True
    device_steps = True  # the count enters no arithmetic

    def param_kind(self, p: Tensor) -> str:
        return "sophia"

    def entries(self, p: Tensor) -> tuple[str, ...]:
        return ("step", "exp_avg", "hessian")

    def theta(self, p: Tensor) -> tuple[str, ...]:
        return ("hessian",)

    def init_state(self, p: Tensor) -> dict:
        zeros = lambda: torch.zeros_like(p, memory_format=torch.preserve_format)  # noqa: E731
        return {"step": 0, "exp_avg": zeros(), "hessian": zeros()}


Sophia.state_adapter = SophiaAdapter
