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

from ..ranges import Betas, LearningRate, NonNegative, OneOf, Positive
from .adapters import StateAdapter
from .scalars import add_scaled_

__all__ = ["Sophia", "SophiaAdapter"]

DENOMINATORS = ("max", "add")


class Sophia(torch.optim.Optimizer):
    """Sophia (see the module docstring). Feed curvature with ``update_hessian({param: ĥ})``."""

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
        """h ← β2 h + (1−β2) max(ĥ, 0) for each param given (Alg. 8, the Hessian line)."""
        for group in self.param_groups:
            beta2 = group["betas"][1]
            for p in group["params"]:
                est = estimates.get(p)
                if est is not None:
                    self._state(p)["hessian"].mul_(beta2).add_(est.clamp(min=0).to(p.dtype), alpha=1 - beta2)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1 = group["betas"][0]
            lr, wd, rho, gamma, eps = group["lr"], group["weight_decay"], group["rho"], group["gamma"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Sophia does not support sparse gradients")
                st = self._state(p)
                st["step"] += 1
                m, h = st["exp_avg"], st["hessian"]
                m.lerp_(p.grad, 1 - beta1)
                if group["denominator"] == "max":
                    denom = (h * gamma).clamp_(min=eps)
                else:
                    denom = (h * gamma).add_(eps)
                d = (m / denom).clamp_(-rho, rho)
                if wd > 0:
                    p.mul_(1 - lr * wd)
                add_scaled_(p, d, -lr)
        return loss


class SophiaAdapter(StateAdapter):
    """Sophia's state for federated parts: ``step`` (int), ``exp_avg`` (m), ``hessian`` (h); Θ = {h}."""

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
