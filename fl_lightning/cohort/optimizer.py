"""The local optimizer of a cohort whose optimizer has no batched form: one optimizer per client.

A cohort (``trainer.cohort``, fl_lightning/cohort/) steps its clients' stacked parameters with one optimizer when
the optimizer's update of a client's row reads only that row (an elementwise ``torch.optim`` optimizer, Lion,
Sophia, Adam with per-client step counts: RowAdam) or each row's matrix on its own (Muon). SOAP keeps per client
Kronecker factors and eigenbases refreshed at the client's own step counts (Vyas et al., ICLR 2025, arXiv
2409.11321, Alg. 3), and an optimizer that keeps a per-client counter without declaring it (NAdam's ``mu_product``)
cannot share one state. For those, :class:`ClientByClient` keeps each client's own optimizer, a copy of the one its
start built (settings, state, corrections), and steps it on the client's rows: rows copied into the module's
parameters, one step, rows copied back. The forward, backward and parts of the step stay batched; the optimizer's
launches are K times one client's. Each client's step is its sequential step exactly (the same optimizer on the same
numbers).
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor

from ..optim.state import is_fresh, mark_imported


class ClientByClient:
    """K clients' optimizers, each stepped on its client's rows of the stacked parameters (see the module docstring)."""

    cohort_form = "per_client"

    def __init__(self, optimizers: list[torch.optim.Optimizer], params: list[Tensor], stacked: list[Tensor]):
        self.optimizers, self.params, self.stacked = optimizers, params, stacked
        self.state: dict = {}  # no stacked state: each client's is its own optimizer's (a finished one's untouched)
        self.active: list[bool] = [True] * len(optimizers)  # the clients taking this step (host flags)

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizers[0].param_groups

    @torch.no_grad()
    def step(self) -> None:
        grads = [s.grad for s in self.stacked]
        for i, opt in enumerate(self.optimizers):
            if not self.active[i]:
                continue
            torch._foreach_copy_(self.params, [s[i] for s in self.stacked])
            for p, g in zip(self.params, grads):
                p.grad = g[i] if g is not None else None
            opt.step()
            torch._foreach_copy_([s[i] for s in self.stacked], self.params)
        for p in self.params:
            p.grad = None

    def hand_back(self, i: int, optimizer: torch.optim.Optimizer) -> None:
        """Client ``i``'s optimizer state moved into ``optimizer`` (the client's own, over the same parameters, read by
        its ``client_end``): its entries as they are (no cast, no copy; this cohort is done with them)."""
        own = self.optimizers[i]
        optimizer.state.clear()
        for p, st in own.state.items():
            optimizer.state[p] = st
        mark_imported(optimizer)
        if getattr(own, "corrections", None) is not None:
            optimizer.corrections = own.corrections


def copy_of(optimizer: torch.optim.Optimizer, fresh: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``fresh`` (the factory's new optimizer over the same parameters) made a copy of ``optimizer``: its groups'
    settings, its state entry by entry (tensors cloned, numbers as they are: no cast) and its corrections."""
    for g, h in zip(fresh.param_groups, optimizer.param_groups):
        g.update({k: v for k, v in h.items() if k != "params"})
    if not is_fresh(optimizer):
        for p, st in optimizer.state.items():
            if st:
                fresh.state[p] = {k: v.clone() if isinstance(v, Tensor) else copy.deepcopy(v) for k, v in st.items()}
        mark_imported(fresh)
    if getattr(optimizer, "corrections", None):
        fresh.corrections = dict(optimizer.corrections)
    return fresh
