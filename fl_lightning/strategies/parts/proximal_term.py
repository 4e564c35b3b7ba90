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
    reads = ("grads", "weights")  # what its hooks read of the client's training tensors
    writes = ("grads",)  # what its hooks change of the client's training tensors
    step_plan = ()  # its step: multi-tensor ops on the gradients, the weights and the server's x^r (broadcast)

    def __init__(self, mu: NonNegative = 0.01):
        self.mu = float(mu)

    @torch.no_grad()
    def after_backward(self, client: ClientContext) -> None:
        """g ← g + μ (w − x^r), one client's or a cohort's (K, ...) tensors alike."""
        if not self.mu:
            return
        pairs = [(p, client.global_params[n]) for n, p in client.params.items() if p.grad is not None]
        if not pairs:
            return
        params = [p for p, _ in pairs]
        diff = torch._foreach_sub([p.detach() for p in params], [a.to(p.dtype) for p, a in pairs])
        torch._foreach_add_([p.grad for p in params], diff, alpha=self.mu)  # g += μ (w − x^r)
