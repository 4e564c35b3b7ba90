"""Yogi on the server (FedYogi: Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv 2003.00295,
Alg. 2; Yogi: Zaheer, Reddi, Sachan, Kale & Kumar, NeurIPS 2018), descent convention ``g = -Delta_t``:

    m <- beta1 * m + (1 - beta1) * g
    v <- v - (1 - beta2) * g^2 * sign(v - g^2)          (additive: v moves towards g^2 by at most (1-beta2) g^2)
    x <- x - lr * m / (sqrt(v) + tau)

The squared term is the pseudo-gradient's, not the momentum's (Yogi's definition; an early arXiv version of Alg. 2
printed m_t there, which the authors called a typo, google-research/federated#41). ``bias_correction`` (default
False, as Alg. 2) and ``v0`` (default ``"tau2"``: v_{-1} = tau^2, Alg. 2's floor) as in :mod:`.adam`.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..config import Fraction, Positive
from .adam import V0, AdaptiveServerOptimizer, Tau, adaptive_step


def yogi_update(g: Tensor, m: Tensor, v: Tensor, t: int, beta1: float, beta2: float, tau: float,
                bias_correction: bool | str = False) -> Tensor:
    """One FedYogi step (Reddi et al. Alg. 2): updates ``m``, ``v`` in place and returns the direction (t >= 1)."""
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    g2 = g * g
    v.addcmul_(torch.sign(v - g2), g2, value=-(1 - beta2))
    return adaptive_step(m, v, t, beta1, beta2, tau, bias_correction)


class Yogi(AdaptiveServerOptimizer):
    def __init__(self, params, lr: Positive = 0.01, beta1: Fraction = 0.9, beta2: Fraction = 0.99,
                 tau: Tau = 1e-3,
                 bias_correction: bool | str = False, v0: V0 = "tau2"):
        super().__init__(params, lr, beta1, beta2, tau, bias_correction, v0)
        self._init_state()

    def update(self, g, state, x):
        return yogi_update(g, state["m"], state["v"], self.t, self.beta1, self.beta2, self.tau, self.bias_correction)
