"""AMSGrad on the server (FedAMS: Wang, Lin & Chen, "Communication-Efficient Adaptive Federated Learning", ICML 2022,
arXiv 2205.02719, Alg. 1; AMSGrad: Reddi, Kale & Kumar, ICLR 2018), descent convention ``g = -Delta_t``:

    m <- beta1 * m + (1 - beta1) * g
    v <- beta2 * v + (1 - beta2) * g^2
    v_hat <- max(v_hat, v, tau)       x <- x - lr * m / sqrt(v_hat)           (tau_mode="max": FedAMS, the default)
    v_hat <- max(v_hat, v)            x <- x - lr * m / (sqrt(v_hat) + tau)   (tau_mode="add": "FedAMSGrad", the
                                                                              Reddi et al. 2021 form with tau)

v_hat never decreases (the max-stabilised denominator of the FedAMS/FedCAMS baselines of seed 002, FedSMU App. G.5;
decision 002/#6 in docs/decisions.md). With ``max`` tau is a floor on v_hat (a squared quantity: tau=1e-6 floors
sqrt(v_hat) at 1e-3). ``bias_correction`` (default False) divides m by (1 - beta1^t) and v_hat by (1 - beta2^t)
(torch.optim.Adam(amsgrad=True) with ``tau_mode="add"``, ``v0="zero"``; ``"step_size"``: lr sqrt(1 - beta2^t) /
(1 - beta1^t), as adam.py); ``v0`` is the start of v and v_hat (default ``"zero"``, FedAMS; ``"tau2"`` as Reddi et
al. Alg. 2).
"""
from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor

from ..config import Fraction, OneOf, Positive
from .adam import V0, AdaptiveServerOptimizer, Tau

TAU_MODES = ("max", "add")


def amsgrad_update(g: Tensor, m: Tensor, v: Tensor, v_hat: Tensor, t: int, beta1: float, beta2: float, tau: float,
                   bias_correction: bool | str = False, tau_mode: str = "max") -> Tensor:
    """One FedAMS step (Wang et al. Alg. 1): updates ``m``, ``v``, ``v_hat`` in place; returns the direction."""
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    torch.maximum(v_hat, v, out=v_hat)
    if tau_mode == "max":
        v_hat.clamp_(min=tau)
    mm, vv = m, v_hat
    if bias_correction == "step_size":  # Kingma & Ba's lr_t form (see adam.py)
        mm = m * (math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t))
    elif bias_correction:
        mm, vv = m / (1 - beta1 ** t), v_hat / (1 - beta2 ** t)
    return mm / vv.sqrt() if tau_mode == "max" else mm / (vv.sqrt() + tau)


class AMSGrad(AdaptiveServerOptimizer):
    state_names = ("m", "v", "v_hat")

    def __init__(self, params, lr: Positive = 0.01, beta1: Fraction = 0.9, beta2: Fraction = 0.99,
                 tau: Tau = 1e-6, bias_correction: bool | str = False, v0: V0 = "zero",
                 tau_mode: Annotated[str, OneOf(*TAU_MODES)] = "max"):
        self.tau_mode = tau_mode
        super().__init__(params, lr, beta1, beta2, tau, bias_correction, v0)
        self._init_state()

    def update(self, g, state, x):
        return amsgrad_update(g, state["m"], state["v"], state["v_hat"], self.t, self.beta1, self.beta2, self.tau,
                              self.bias_correction, self.tau_mode)
