"""Lion on the server (Chen, Liang, Huang, Real, Wang, Pham, Dong, Luong, Hsieh, Lu & Le, "Symbolic Discovery of
Optimization Algorithms", NeurIPS 2023, arXiv 2302.06675, Alg. 2), descent convention ``g = -Delta_t``:

    u <- sign(beta1 * m + (1 - beta1) * g)       (the sign of the interpolated momentum)
    m <- beta2 * m + (1 - beta2) * g             (the momentum is updated after, with beta2)
    x <- x - lr * (u + weight_decay * x)         (decoupled weight decay; 0 by default)

Every coordinate moves by exactly lr (0 where the interpolation is exactly 0) when weight_decay = 0. Defaults are
the paper's beta1 = 0.9, beta2 = 0.99; lr should be ~3-10x smaller than an Adam lr (Chen et al. Sec. 5).
"""
from __future__ import annotations

from ..optim.lion import lion_update  # the pure update, shared with the local optimizer
from ..config import Fraction, NonNegative, Positive
from .base import ServerOptimizer


class Lion(ServerOptimizer):
    state_names = ("m",)

    def __init__(self, params, lr: Positive = 1e-3, beta1: Fraction = 0.9, beta2: Fraction = 0.99,
                 weight_decay: NonNegative = 0.0):
        super().__init__(params, lr)
        self.beta1, self.beta2, self.weight_decay = float(beta1), float(beta2), float(weight_decay)
        self._init_state()

    def update(self, g, state, x):
        u = lion_update(g, state["m"], self.beta1, self.beta2)
        return u.add(x, alpha=self.weight_decay) if self.weight_decay else u
