"""Lion (Chen, Liang, Huang, Real, Wang, Pham, Dong, Luong, Hsieh, Lu & Le, "Symbolic Discovery of Optimization
Algorithms", NeurIPS 2023, arXiv 2302.06675, Alg. 2), per parameter with gradient g:

    x ← x·(1 − lr·wd)                      decoupled weight decay
    x ← x − lr·sign(β1·m + (1 − β1)·g)     the update: the sign of the interpolated momentum
    m ← β2·m + (1 − β2)·g                  the momentum is updated after, with β2

(the order of lucidrains' ``lion-pytorch``; defaults β = (0.9, 0.99), wd 0). ``torch.sign`` leaves a coordinate
whose interpolation is exactly 0 in place.

Seed 002 (FedSMU, anonymous, under review) reprints Lion as its Alg. 9 (App. H) with two typos (decision 002/#16 in
docs/decisions.md): lines 4–5 use m_t on both sides (read: v_t = β1·m_{t−1} + (1−β1)·g_t, then
m_t = β2·m_{t−1} + (1−β2)·g_t), and line 6 writes x_{t+1} = x_t + γ1·(sign(v_t) − γ2·x_t), an ascent step for a
gradient g; the descent step is x_{t+1} = x_t − γ1·(sign(v_t) + γ2·x_t), implemented here. (FedSMU's own server
step has the + sign because its g is a model delta, a descent direction.) FedSMU with one client and one local step
is this optimizer with lr = γ1, wd = γ2 (FedSMU Sec. 3.3 and App. E.2 state the reduction, the constants are
derived; tests/fidelity/test_fedsmu_identities.py).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from ..config import Betas, LearningRate, NonNegative
from .adapters import StateAdapter
from .scalars import foreach_add_scaled_

__all__ = ["Lion", "LionAdapter", "lion_update"]


def lion_update(g: Tensor, m: Tensor, beta1: float, beta2: float) -> Tensor:
    """One Lion direction (Alg. 2): returns ``sign(beta1*m + (1-beta1)*g)``, then updates ``m`` in place."""
    u = torch.sign(m * beta1 + g * (1 - beta1))
    m.lerp_(g, 1 - beta2)
    return u


class Lion(torch.optim.Optimizer):
    """Lion for a model (see module docstring); state ``exp_avg`` (m) per parameter, zeros at the first step.
    Steps a whole parameter group with ``torch._foreach_*`` (no host syncs)."""

    cohort_form = "elementwise"  # trainer.cohort: an entry's update reads only that entry (fl_lightning/cohort/)

    def __init__(self, params: Iterable, lr: LearningRate = 1e-4, betas: Betas = (0.9, 0.99),
                 weight_decay: NonNegative = 0.0):
        if not lr >= 0:
            raise ValueError(f"Lion lr must be >= 0, got {lr}")
        if not all(0 <= float(b) < 1 for b in betas):
            raise ValueError(f"Lion betas must be in [0, 1), got {betas}")
        if not weight_decay >= 0:
            raise ValueError(f"Lion weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(float(b) for b in betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            if not ps:
                continue
            lr, wd, (b1, b2) = group["lr"], group["weight_decay"], group["betas"]
            grads = [p.grad for p in ps]
            ms = []
            for p in ps:
                st = self.state[p]
                if "exp_avg" not in st:
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                ms.append(st["exp_avg"])
            if wd:
                torch._foreach_mul_(ps, 1 - lr * wd)
            upd = torch._foreach_mul(ms, b1)
            torch._foreach_add_(upd, grads, alpha=1 - b1)
            torch._foreach_sign_(upd)
            foreach_add_scaled_(ps, upd, -lr)
            torch._foreach_lerp_(ms, grads, 1 - b2)
        return loss


class LionAdapter(StateAdapter):
    """Lion's state for federated parts: ``exp_avg`` (m)."""

    zero_is_fresh = True

    def param_kind(self, p: Tensor) -> str:
        return "lion"

    def entries(self, p: Tensor) -> tuple[str, ...]:
        return ("exp_avg",)

    def init_state(self, p: Tensor) -> dict:
        return {"exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format)}


Lion.state_adapter = LionAdapter
