"""Server optimizers: what the server does with the round's pseudo-gradient ``g = -(mean_i x_i - x)``.

Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv 2003.00295, Alg. 1 (FedOpt): the server treats
``-Delta_t`` as a gradient and takes one SERVEROPT step per round. :class:`~fl_lightning.strategies.parts.ModelAverage`
takes one as ``server_opt`` (a factory ``params -> optimizer``: a Hydra ``_partial_: true`` node, conf/server_opt/);
without one it averages as before. One file per optimizer, each a pure update function (state updated in place,
returns the direction ``u``; ``x <- x - lr * u``) and a thin stateful class (:class:`ServerOptimizer`):

    SGD       sgd.py       u = g                                                 FedAvg with server lr eta_g
    Momentum  momentum.py  v = beta v + g; u = v                                 Hsu et al. 2019 (fedavg_server_momentum)
    Adam      adam.py      m, v EMAs; u = m / (sqrt(v) + tau)                    FedAdam (Reddi et al. Alg. 2)
    Yogi      yogi.py      v -= (1-beta2) g^2 sign(v - g^2); u as Adam           FedYogi (Reddi et al. Alg. 2)
    AMSGrad   amsgrad.py   v_hat = max(v_hat, v, tau); u = m / sqrt(v_hat)       FedAMS (Wang et al., ICML 2022)
    Lion      lion.py      u = sign(beta1 m + (1-beta1) g); m EMA with beta2     Lion (Chen et al., NeurIPS 2023)

Adam, Yogi and AMSGrad follow Alg. 2: no bias correction by default (``bias_correction=true`` adds it,
``step_size`` scales the lr by sqrt(1-beta2^t)/(1-beta1^t) as Flower's FedAdam), v starts at
tau^2 for Adam / Yogi (``v0``; Alg. 2 asks v_{-1} >= tau^2), at 0 for AMSGrad (FedAMS).
"""
from .adam import Adam, adam_update, adaptive_step
from .amsgrad import AMSGrad, amsgrad_update
from .base import ServerOptimizer
from .lion import Lion, lion_update
from .momentum import Momentum, momentum_update
from .sgd import SGD, sgd_update
from .yogi import Yogi, yogi_update

__all__ = ["AMSGrad", "Adam", "Lion", "Momentum", "SGD", "ServerOptimizer", "Yogi", "adam_update", "adaptive_step",
           "amsgrad_update", "lion_update", "momentum_update", "sgd_update", "yogi_update"]
