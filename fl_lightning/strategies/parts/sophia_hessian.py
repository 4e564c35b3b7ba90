"""SophiaHessian: the Hessian-diagonal estimate ĥ that feeds Sophia's curvature EMA, every ``every`` local steps.

Sophia (Liu et al., ICLR 2024, arXiv 2305.14342) and seed 001 FedPAC (spec 001 §4.3 Alg. 8 / 9): on the step whose
global index rK + k (k = 1..K) is a multiple of f_h (``every``, default 10), an estimate ĥ of diag(∇²f) on the
current minibatch is passed to the optimizer's ``update_hessian`` (h ← β2 h + (1−β2) max(ĥ, 0)). ``estimator``:

* ``hutchinson`` (default; Alg. 8 and Liu et al. Alg. 1): ĥ = u ⊙ (∇²f u) with Rademacher u (``probes`` of them,
  averaged), the Hessian-vector product by double backward through the current minibatch
  (``client.hvp``; the loop never switches ``create_graph`` on). Probes come from ``client.rng("hutchinson")``.
* ``gnb`` (Gauss–Newton–Bartlett, Liu et al. Alg. 2, SophiaG): ĥ = B·ĝ⊙ĝ, ĝ the gradient of the mean loss
  against labels sampled from the model's own softmax (``module.sampled_label_loss``), B the minibatch size.
* ``empirical``: ĥ = g⊙g of the ordinary minibatch gradient, what the released FedPAC code's Local Sophia does
  (``update_hessian()`` after every backward, spec 001 §7.4 [C]); use with ``every: 1`` to match it.

Costs one extra forward and a double backward (hutchinson) or one forward/backward (gnb) per estimate.
"""
from __future__ import annotations

import torch

from ...errors import ConfigError
from ..base import ClientContext, Part


class SophiaHessian(Part):
    ESTIMATORS = ("hutchinson", "gnb", "empirical")

    def __init__(self, estimator: str = "hutchinson", every: int = 10, probes: int = 1):
        if estimator not in self.ESTIMATORS:
            raise ConfigError("estimator", f"unknown estimator {estimator!r}", f"use one of {', '.join(self.ESTIMATORS)}")
        for key, val in (("every", every), ("probes", probes)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ConfigError(key, f"expected a whole number >= 1, got {val!r}", f"set {key} to 1 or more")
        self.estimator, self.every, self.probes = estimator, every, probes

    def client_start(self, client: ClientContext) -> None:
        if not hasattr(client.optimizer, "update_hessian"):
            raise self.error("estimator", f"{type(client.optimizer).__name__} takes no Hessian estimates",
                             "use the Sophia local optimizer (optimizer=sophia) or drop this part")
        if self.estimator == "gnb" and not hasattr(client.module, "sampled_label_loss"):
            raise self.error("estimator", f"estimator=gnb needs a model with sampled_label_loss "
                             f"({type(client.module).__name__} has none)", "use estimator=hutchinson")

    def _generator(self, client: ClientContext) -> torch.Generator:
        key = self.name + "/rng"
        if key not in client.scratch:  # one stream per (client, round), drawn from step to step
            client.scratch[key] = client.rng(self.estimator)
        return client.scratch[key]

    def estimate(self, client: ClientContext) -> dict[str, torch.Tensor]:
        """ĥ per trainable parameter name, on the current minibatch at the current weights."""
        params = client.params
        if self.estimator == "empirical":
            return {n: p.grad.detach().square() for n, p in params.items() if p.grad is not None}
        gen = self._generator(client)
        if self.estimator == "gnb":
            g = client.gradient_at(loss_fn=lambda module, batch: module.sampled_label_loss(batch, gen))
            size = len(next(iter(client.batch.values())))
            return {n: size * t.square() for n, t in g.items()}
        est = {n: torch.zeros_like(p) for n, p in params.items()}
        for _ in range(self.probes):
            u = {n: (torch.randint(0, 2, p.shape, generator=gen, device=p.device) * 2 - 1).to(p.dtype)
                 for n, p in params.items()}
            hv = client.hvp(u)
            for n in est:
                est[n].add_(u[n] * hv[n], alpha=1.0 / self.probes)
        return est

    def after_backward(self, client: ClientContext) -> None:
        k = client.round * client.num_steps + client.step + 1  # Alg. 8: (rK + k) mod f_h = 0, k = 1..K
        if k % self.every:
            return
        est = self.estimate(client)
        client.optimizer.update_hessian({client.params[n]: h for n, h in est.items()})
