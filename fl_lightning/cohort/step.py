"""The local step of a cohort: :class:`~fl_lightning.step.local.LocalStep`'s one sequence, with the loss and the
gradients of K clients at once (the model under ``vmap``, one backward over the sum of the K losses: the clients are
independent, so each row's gradient is its own client's) and the row masks that keep a finished client as it was."""
from __future__ import annotations

import torch
from torch import Tensor

from ..step.local import LocalStep
from .context import CohortContext
from .forward import StackedForward


class CohortStep(LocalStep):
    """``step(cohort, batch, k) -> losses (K,)``. On a step that not every client takes (``cohort.all_active`` False: planned on the host), the finished clients' rows of the parameters and
    optimizer state are put back after it, and state the step created is zero in their rows."""

    def __init__(self, forward: StackedForward, strategy):
        super().__init__(strategy, {})
        self.forward = forward

    def loss_and_grads(self, ctx: CohortContext, batch: dict, k: int) -> Tensor:
        loss = self.forward.client_losses(ctx.params, batch, ctx.mask, ctx.count)
        loss.sum().backward()
        return loss

    def __call__(self, ctx: CohortContext, batch: dict, k: int) -> Tensor:
        self.params = ctx.params  # what a capture wrapper reads: the cohort's stacked parameters
        if ctx.all_active:
            return super().__call__(ctx, batch, k)
        optimizer = ctx.optimizer
        frozen = snapshot(ctx.params, optimizer)
        held = {id(v) for st in optimizer.state.values() for v in st.values()}
        loss = super().__call__(ctx, batch, k)
        restore(ctx, frozen)
        fresh_rows(ctx, optimizer, held)
        return loss


def snapshot(stacked: dict[str, Tensor], optimizer) -> list[tuple[Tensor, Tensor]]:
    """The tensors a step changes whose leading dimension is the client's: parameters and optimizer state."""
    out = [(t, t.detach().clone()) for t in stacked.values()]
    K = next(iter(stacked.values())).shape[0]
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == K:
                out.append((v, v.clone()))
    return out


@torch.no_grad()
def fresh_rows(ctx: CohortContext, optimizer, held: set) -> None:
    """Optimizer state the step created (its first: SGD's momentum) is zero in the rows of the clients that did
    not take it (a phantom row's state as a fresh one's, zeros), not their gradient's."""
    K = ctx.active.shape[0]
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, Tensor) and id(v) not in held and v.dim() > 0 and v.shape[0] == K:
                v.copy_(torch.where(ctx.active_like(v), v, torch.zeros_like(v)))


@torch.no_grad()
def restore(ctx: CohortContext, frozen: list[tuple[Tensor, Tensor]]) -> None:
    """A finished client's rows back as they were before the step."""
    for t, old in frozen:
        t.copy_(torch.where(ctx.active_like(t), t, old))
