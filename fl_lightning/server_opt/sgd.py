"""SGD on the server: ``x <- x - lr * (g + weight_decay * x)`` with the pseudo-gradient ``g = -(mean_i x_i - x)``.

FedAvg with a server learning rate eta_g (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv
2003.00295, Alg. 1 with SERVEROPT = SGD); ``lr=1`` is plain averaging. Bit-identical to ``ModelAverage(server_lr=lr)``
when ``weight_decay = 0`` (the default). With ``lr = γ1``, ``weight_decay = γ2`` and g = −mean(u) it is FedSMU's
server step x ← x + γ1·(mean u − γ2·x) (FedSMU paper, anonymous, under review: Alg. 1 line 16): decoupled weight
decay on the global model.
"""
from __future__ import annotations

from torch import Tensor

from ..config import NonNegative, Positive
from .base import ServerOptimizer


def sgd_update(g: Tensor) -> Tensor:
    """The SGD direction: the pseudo-gradient itself."""
    return g


class SGD(ServerOptimizer):
    def __init__(self, params, lr: Positive = 1.0, weight_decay: NonNegative = 0.0):
        super().__init__(params, lr)
        self.weight_decay = float(weight_decay)
        self._init_state()

    def update(self, g, state, x):
        return sgd_update(g).add(x, alpha=self.weight_decay) if self.weight_decay else sgd_update(g)
