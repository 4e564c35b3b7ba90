"""ProximalTerm: FedProx's proximal gradient (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020, arXiv 1812.06127, Alg. 2).

Each client approximately minimises h_i(w; x^r) = F_i(w) + (μ/2)‖w − x^r‖² (Alg. 2 line 6), i.e. every local step
gets the gradient of the proximal term added before clipping and the local optimizer (``after_backward``):

    g ← ∇F_i(w; ξ) + μ (w − x^r)

Nothing extra travels (x^r is the received model); the server is ModelAverage. μ = 0 is FedAvg. Li et al. search
μ ∈ {0.001, 0.01, 0.1, 1} (Sec. 5.3); ``mu`` defaults to 0.01. Clipping (``method.grad_clip``) sees the proximal
gradient too, as in a loss-based implementation. Applied with ``torch._foreach_*`` (no host sync).
"""
from __future__ import annotations

import torch

from ...config import NonNegative
from ..base import ClientContext, Part


class ProximalTerm(Part):
    writes = ("grads",)  # what its hooks change of the client's training tensors
    batched = True  # trainer.cohort: the same term on the stacked parameters

    def __init__(self, mu: NonNegative = 0.01):
        self.mu = float(mu)

    def client_start(self, client: ClientContext) -> None:
        names = [n for n, p in client.params.items() if p.requires_grad]
        slot = client.slot(self)
        slot.names, slot.anchors = names, [client.global_params[n] for n in names]

    @torch.no_grad()
    def after_backward(self, client: ClientContext) -> None:
        if not self.mu:
            return
        names, anchors = client.slot(self).names, client.slot(self).anchors
        pairs = [(client.params[n], a) for n, a in zip(names, anchors) if client.params[n].grad is not None]
        if not pairs:
            return
        params = [p for p, _ in pairs]
        diff = torch._foreach_sub([p.detach() for p in params], [a.to(p.dtype) for p, a in pairs])
        torch._foreach_add_([p.grad for p in params], diff, alpha=self.mu)  # g += μ (w − x^r)


    @torch.no_grad()
    def cohort_after_backward(self, cohort) -> None:
        if not self.mu:
            return
        names = [n for n, t in cohort.params.items() if t.grad is not None]
        ws = [cohort.params[n] for n in names]
        diff = torch._foreach_sub([w.detach() for w in ws], [cohort.global_params[n].to(w.dtype) for n, w in zip(names, ws)])
        torch._foreach_add_([w.grad for w in ws], diff, alpha=self.mu)  # g_i += μ (w_i − x^r), x^r broadcast over clients
