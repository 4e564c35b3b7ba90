"""Heavy-ball momentum SGD on the server (FedAvgM: Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification", arXiv 1909.06335, 2019, Sec. 3; Reddi et al., ICLR 2021, arXiv
2003.00295, Sec. 5 "FedAvgM"):

    v <- beta * v + g            x <- x - lr * v            (nesterov: x <- x - lr * (g + beta * v))

with the pseudo-gradient ``g = -(mean_i x_i - x)``; the same recursion as ``torch.optim.SGD(momentum=beta,
dampening=0)``. Hsu et al. reason in the effective rate lr / (1 - beta).
"""
from __future__ import annotations

from torch import Tensor

from ..config import Fraction, Positive
from .base import ServerOptimizer


def momentum_update(g: Tensor, buf: Tensor, beta: float, nesterov: bool = False) -> Tensor:
    """Heavy ball: ``buf <- beta * buf + g`` in place; returns ``buf`` (or ``g + beta * buf`` with Nesterov)."""
    buf.mul_(beta).add_(g)
    return g.add(buf, alpha=beta) if nesterov else buf


class Momentum(ServerOptimizer):
    state_names = ("momentum",)

    def __init__(self, params, lr: Positive = 1.0, momentum: Fraction = 0.9, nesterov: bool = False):
        super().__init__(params, lr)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self._init_state()

    def update(self, g, state, x):
        return momentum_update(g, state["momentum"], self.momentum, self.nesterov)
