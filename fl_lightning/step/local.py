"""The local step, written once: one step sequence and one K-step loop, run on a client or on a cohort of clients.

    step(ctx, batch, k)   loss and gradients -> after_backward -> clipping -> optimizer -> after_step -> zero grads
    run_steps(...)        K steps with ``before_step`` outside each, the losses summed, the divergence check

``ctx`` is a :class:`~fl_lightning.strategies.base.ClientContext` (one client on the run's one module) or a
:class:`~fl_lightning.cohort.CohortContext` (K clients' parameters stacked along a leading dimension). What differs
between the two is only how the loss and its gradients are computed (the module's ``training_step`` and Fabric's
backward, or the model under ``vmap`` with row masks: :class:`fl_lightning.cohort.step.CohortStep`) and the
arithmetic of the contexts' helpers (``clip_grad_norm_`` per client). The parts' hooks are called through the
strategy, which gives a cohort's context the parts' batched forms. A capture wrapper (:mod:`fl_lightning.step.capture`:
eager, ``torch.compile``, CUDA graphs) wraps any step object, never a copy of it.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
from torch import Tensor

from ..errors import NonFiniteLossError


class LocalStep:
    """``step(ctx, batch, k) -> loss`` (detached, on the device; a cohort's: one per client, (K,)). The caller counts
    the step (``ctx.step``) after it: a Python number changing inside a compiled step is a guard that fails; the hooks
    that run inside see the steps done before. ``strategy`` and ``params`` are what a capture wrapper reads
    (the parts' declarations, the memory the step writes)."""

    def __init__(self, strategy, params: dict[str, Tensor]):
        self.strategy, self.params = strategy, params

    def loss_and_grads(self, ctx, batch: dict, k: int) -> Tensor:
        """The step's loss, with the gradients of ``ctx.params`` in their ``.grad``."""
        raise NotImplementedError

    def __call__(self, ctx, batch: dict, k: int) -> Tensor:
        loss = self.loss_and_grads(ctx, batch, k)
        ctx.batch, ctx.loss = batch, loss.detach()
        strategy = self.strategy
        strategy.after_backward(ctx)
        if strategy.grad_clip:  # method.grad_clip: each client's gradient norm over all its parameters
            ctx.clip_grad_norm_(float(strategy.grad_clip))
        ctx.optimizer.step()
        strategy.after_step(ctx)
        for p in ctx.params.values():  # zero_grad(set_to_none=True), written out: torch.compile skips Optimizer.zero_grad
            p.grad = None
        return ctx.loss


class ClientStep(LocalStep):
    """One client's step on the run's one module: ``module.training_step`` under Fabric's autocast, Fabric's backward."""

    def __init__(self, fabric, module, strategy, params: dict[str, Tensor]):
        super().__init__(strategy, params)
        self.fabric, self.module = fabric, module

    def loss_and_grads(self, ctx, batch: dict, k: int) -> Tensor:
        with self.fabric.autocast():
            loss = self.module.training_step(batch, k)
        self.fabric.backward(loss)
        return loss


def run_steps(ctx, batches: Iterable, step: Callable, before_step: Callable, begin: Callable | None = None,
              rows: tuple = ()) -> tuple[Tensor, Tensor | None, int]:
    """The K-step loop, for a client or a cohort: for each of ``batches``, ``begin(k, item) -> batch`` (the runner's
    per-step set-up: a cohort's active rows; default: the item is the batch), the parts' ``before_step`` outside the
    step, the (captured) ``step``, the step counted. Returns the losses summed over the steps (shape ``rows``: () for
    a client, (K,) for a cohort), the first step's loss (at the model the clients received) and the steps taken."""
    device = next(iter(ctx.params.values())).device
    loss_sum = torch.zeros(rows, device=device)
    first, k = None, -1
    for k, item in enumerate(batches):
        batch = begin(k, item) if begin is not None else item
        before_step(ctx)  # outside the (compiled or replayed) step
        loss = step(ctx, batch, k)
        ctx.step += 1
        if k == 0:
            first = loss
        loss_sum += loss.float()  # a cohort's finished client adds exactly 0 (no rows: 0 / 1)
    return loss_sum, first, k + 1


def mean_losses(loss_sum: Tensor, steps: list[int]) -> list[float]:
    """Each client's mean loss over its ``steps``, as host numbers (one read for the client or the cohort)."""
    return [x / max(1, s) for x, s in zip(loss_sum.reshape(-1).tolist(), steps)]


def check_finite(cid: int, mean_loss: float, first: Tensor | None, i: int,
                 divergence: Callable[[int, float, float], str]) -> None:
    """A client (row ``i`` of a cohort) whose mean loss is not finite stops the run, in one line naming the learning
    rate that grew it (``divergence(cid, mean, first step's loss) -> str``: the loop's message; the first step's loss
    is read from the device only then)."""
    if not math.isfinite(mean_loss):
        first_loss = float(first.reshape(-1)[i]) if first is not None else 0.0
        raise NonFiniteLossError(divergence(cid, mean_loss, first_loss))
