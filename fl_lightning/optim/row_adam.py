"""RowAdam: Adam / AdamW over a cohort's stacked parameters (K, ...) with each client's own step count.

A cohort (``trainer.cohort``, fl_lightning/cohort/) steps K clients' stacked parameters with one optimizer. Adam's
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
        """One step of every parameter with multi-tensor ops: the bias corrections of all parameters' (K,) counts in
        one stacked computation, each parameter's rows scaled by their own."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            ps = [p for p in group["params"] if p.grad is not None]
            if not ps:
                continue
            sts = [self._state(p) for p in ps]
            grads, ms, vs = [p.grad for p in ps], [st["exp_avg"] for st in sts], [st["exp_avg_sq"] for st in sts]
            torch._foreach_add_([st["step"] for st in sts], 1)
            if wd != 0:
                if group.get("decoupled_weight_decay", False):
                    torch._foreach_mul_(ps, 1 - lr * wd)
                else:
                    grads = torch._foreach_add(grads, ps, alpha=wd)
            torch._foreach_lerp_(ms, grads, 1 - beta1)
            torch._foreach_mul_(vs, beta2)
            torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
            t = torch.stack([st["step"] for st in sts]).to(torch.float64)  # (P, K): every parameter's counts
            step_size = lr / (1 - torch.pow(beta1, t))
            bias_correction2_sqrt = (1 - torch.pow(beta2, t)).sqrt()

            def per_row(c: Tensor) -> list[Tensor]:  # row j of c (K,) shaped to scale parameter j's rows
                return [x.to(p.dtype).view(-1, *([1] * (p.dim() - 1))) for x, p in zip(c.unbind(0), ps)]
            denom = torch._foreach_sqrt(vs)
            torch._foreach_div_(denom, per_row(bias_correction2_sqrt))
            torch._foreach_add_(denom, eps)
            num = torch._foreach_mul(ms, per_row(step_size))
            torch._foreach_addcdiv_(ps, num, denom, value=-1.0)
        return loss
