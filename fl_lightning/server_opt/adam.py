"""Adam on the server (FedAdam: Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar & McMahan, "Adaptive Federated
Optimization", ICLR 2021, arXiv 2003.00295, Alg. 2), in the descent convention with ``g = -Delta_t``:

    m <- beta1 * m + (1 - beta1) * g
    v <- beta2 * v + (1 - beta2) * g^2
    x <- x - lr * m / (sqrt(v) + tau)

Alg. 2 has NO bias correction, so ``bias_correction=False`` is the default; ``True`` divides m by (1 - beta1^t) and
v by (1 - beta2^t) (Kingma & Ba, ICLR 2015, Alg. 1); ``"step_size"`` is Kingma & Ba's "more efficient" form (end of
their Sec. 2), the lr times sqrt(1 - beta2^t) / (1 - beta1^t) with tau left uncorrected,
``x <- x - lr_t m / (sqrt(v) + tau)``: Flower's FedAdam (flwr.server.strategy.FedAdam, whose exponent is its round
number + 1, i.e. our t + 1 with its rounds counted from 1; tests/unit/strategies/test_server_opt_flower.py). ``v0``: Alg. 2 initialises ``v_{-1} >= tau^2`` (its analysis
needs the floor); the default ``v0="tau2"`` takes v_{-1} = tau^2, the smallest value it allows. ``v0="zero"`` is the
usual start (torch.optim.Adam, Flower; the authors' TF experiment code, google-research/federated optimization/,
ran Keras Adam, zero-initialised and bias-corrected, and Yogi with initial accumulator 0); a number sets v_{-1}.
``m`` starts at 0. ``tau`` is Reddi et al.'s adaptivity (epsilon outside the square root). With
``bias_correction=True, v0="zero"`` the step is torch.optim.Adam's.
"""
from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor

from ..errors import ConfigError
from ..config import Fraction, Positive, Range, Validate
from .base import ServerOptimizer, state_dtype


BIAS_CORRECTIONS = (False, True, "step_size")


def adaptive_step(m: Tensor, v: Tensor, t: int, beta1: float, beta2: float, tau: float,
                  bias_correction: bool | str = False) -> Tensor:
    """``m / (sqrt(v) + tau)``, with Adam's bias correction ``m/(1-beta1^t)``, ``v/(1-beta2^t)`` when asked
    (``True``), or the step-size form ``sqrt(1-beta2^t)/(1-beta1^t) * m / (sqrt(v) + tau)`` (``"step_size"``)."""
    if bias_correction == "step_size":
        return m / (v.sqrt() + tau) * (math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t))
    if bias_correction:
        return (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + tau)
    return m / (v.sqrt() + tau)


def adam_update(g: Tensor, m: Tensor, v: Tensor, t: int, beta1: float, beta2: float, tau: float,
                bias_correction: bool | str = False) -> Tensor:
    """One FedAdam step (Reddi et al. Alg. 2): updates ``m``, ``v`` in place and returns the direction (step t >= 1)."""
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    return adaptive_step(m, v, t, beta1, beta2, tau, bias_correction)


def initial_v(v0, tau: float) -> float:
    """The value ``v`` starts from: ``"tau2"`` -> tau^2, ``"zero"`` -> 0, a number -> itself."""
    if v0 == "tau2":
        return tau * tau
    if v0 == "zero":
        return 0.0
    return float(v0)


def v_floored(tau, v0) -> bool:
    """``m / (sqrt(v) + tau)`` stays finite: tau > 0, or v starting above 0 (a rule tying two arguments)."""
    return float(tau) > 0 or initial_v(v0, float(tau)) > 0


# the arguments Adam, Yogi and AMSGrad share: tau >= 0 (not 0 with v starting at 0); v_{-1}: tau2 (Alg. 2's
# tau^2), zero, or a number >= 0
Tau = Annotated[float, Range(0.0), Validate(v_floored, "tau = 0 with v starting at 0 divides by zero",
                                            "use tau > 0, e.g. 1e-3")]
V0 = Annotated[float | str, Range(0.0, words=("tau2", "zero"))]


class AdaptiveServerOptimizer(ServerOptimizer):
    """Shared arguments of the Reddi et al. family (Adam, Yogi, AMSGrad): ``m`` and ``v`` per tensor."""

    state_names = ("m", "v")

    def __init__(self, params, lr: Positive, beta1: Fraction, beta2: Fraction, tau: Tau,
                 bias_correction: bool | str, v0: V0):
        super().__init__(params, lr)
        self.beta1, self.beta2, self.tau = float(beta1), float(beta2), float(tau)
        if not (isinstance(bias_correction, bool) or bias_correction == "step_size"):
            raise ConfigError("bias_correction", f"expected true, false or step_size, got {bias_correction!r}",
                              "use false (Alg. 2), true (Kingma & Ba Alg. 1) or step_size (lr_t = lr sqrt(1-beta2^t)"
                              "/(1-beta1^t), Flower's FedAdam)")
        self.bias_correction = bias_correction
        self.v0 = initial_v(v0, self.tau)

    def initial(self, name, x):
        if name.startswith("v"):
            return torch.full(x.shape, self.v0, dtype=state_dtype(x), device=x.device)
        return super().initial(name, x)


class Adam(AdaptiveServerOptimizer):
    def __init__(self, params, lr: Positive = 0.01, beta1: Fraction = 0.9, beta2: Fraction = 0.99,
                 tau: Tau = 1e-3,
                 bias_correction: bool | str = False, v0: V0 = "tau2"):
        super().__init__(params, lr, beta1, beta2, tau, bias_correction, v0)
        self._init_state()

    def update(self, g, state, x):
        return adam_update(g, state["m"], state["v"], self.t, self.beta1, self.beta2, self.tau, self.bias_correction)


__all__ = ["Adam", "AdaptiveServerOptimizer", "BIAS_CORRECTIONS", "Tau", "V0", "adam_update", "adaptive_step",
           "initial_v", "v_floored"]
