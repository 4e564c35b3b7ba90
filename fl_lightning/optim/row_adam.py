"""RowAdam: Adam / AdamW over a cohort's stacked parameters (K, ...) with each client's own step count.

A cohort (``trainer.cohort``, fl_lightning/cohort.py) steps K clients' stacked parameters with one optimizer. Adam's
update of a row reads only that row, except its bias corrections 1 − β^t, which read the step count t, one 0-d
tensor per parameter in ``torch.optim.Adam``. Clients that keep their optimizer state across rounds
(``method.parts.local_optimizer.state=persistent``: FedAvg-Adam, SCAFFOLD-Adam) have trained different numbers of
steps, so here ``step`` is a (K,) tensor and the corrections are per row. The arithmetic is
``torch.optim.Adam``'s single-tensor step (Kingma & Ba, "Adam", ICLR 2015, arXiv 1412.6980, Alg. 1; with
``decoupled_weight_decay``, AdamW: Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019,
arXiv 1711.05101, Alg. 2), in its order; the bias corrections are computed in float64 as torch computes them in
Python floats. Not built by users: the local optimizer part builds it from a client's Adam (AMSGrad and
``maximize`` are refused there).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .adapters import _scalar_dtype


class RowAdam(torch.optim.Optimizer):
    cohort_form = "elementwise"
    cohort_counters = ("step",)  # per-parameter entries held per client: (K,) tensors

    def __init__(self, params, defaults: dict):
        super().__init__(params, dict(defaults))

    def _state(self, p: Tensor) -> dict:
        st = self.state[p]
        if not st:
            st["step"] = torch.zeros(p.shape[0], dtype=_scalar_dtype(), device=p.device)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return st

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self._state(p)
                grad, step_t, exp_avg, exp_avg_sq = p.grad, st["step"], st["exp_avg"], st["exp_avg_sq"]
                step_t += 1
                if wd != 0:
                    if group.get("decoupled_weight_decay", False):
                        p.mul_(1 - lr * wd)
                    else:
                        grad = grad.add(p, alpha=wd)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                t = step_t.to(torch.float64)
                rows = (-1,) + (1,) * (p.dim() - 1)
                step_size = (lr / (1 - torch.pow(beta1, t))).to(p.dtype).view(rows)
                bias_correction2_sqrt = (1 - torch.pow(beta2, t)).sqrt().to(p.dtype).view(rows)
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
                p.addcdiv_(exp_avg * step_size, denom, value=-1.0)
        return loss
