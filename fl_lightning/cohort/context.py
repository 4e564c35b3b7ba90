"""CohortContext: what a part's step hooks see of K clients trained in one batched step (``trainer.cohort``): the
stacked parameters, the step's stacked batch and row masks, each client's own context, and the helpers a hook written
once for one client and for a cohort uses (``copy_rows_``, ``norm_of``, ``div_rows_``, ``clip_grad_norm_``,
``gradient_at``), each acting per client. Its ``services`` are the cohort's narrow services
(:class:`~fl_lightning.cohort.forward.CohortServices`), never the loop or the engine."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..strategies.base import ClientContext, Part
from ..strategies.round_state import RoundState
from .rows import flat_rows, scale_rows_

if TYPE_CHECKING:
    from .forward import CohortServices


@dataclass
class CohortContext:
    """K clients' round in one batched step: what a part's cohort hooks see. ``params``: the stacked trainable
    parameters (K, ...) (``.grad`` after backward); ``active``: which clients take this step (a client whose steps
    are done is frozen); ``step``: the steps taken so far; ``clients``: each client's own context (its round states,
    state, received tensors), started by the parts' ``client_start``; :meth:`state_of` a part's round states, stacked.
    The helpers a step hook written for one client uses (``copy_rows_``, ``norm_of``, ``div_rows_``,
    ``gradient_at``) act per client."""

    clients: list[ClientContext]
    params: dict[str, Tensor]
    global_params: dict[str, Tensor]
    active: Tensor
    step: int = 0
    optimizer: torch.optim.Optimizer | None = None  # the local optimizer over ``params``
    batch: dict | None = None  # the step's stacked batch (K, B, ...), its 0/1 row mask and real rows, during the hooks
    mask: Tensor | None = None
    count: Tensor | None = None
    services: "CohortServices | None" = None  # gradients, Hessian-vector products over the stacked batch, nothing more
    all_active: bool = True  # every client takes this step (host flag)
    loss: Tensor | None = None  # the step's losses (K,), detached, during the hooks
    batched = True  # the parts' batched step hooks (Part.cohort_after_backward)
    traced: bool = False  # set by the capture wrapper while the step is traced or captured
    number = ClientContext.number
    _states: dict[str, RoundState] = field(default_factory=dict, repr=False)

    @property
    def round(self) -> int:
        return self.clients[0].round

    def state_of(self, part: Part) -> RoundState:
        """``part``'s Round state of the K clients, stacked (``round_state.RoundState.stacked``)."""
        return self._states[part.name]

    def copy_rows_(self, dst: list[Tensor], src: list[Tensor]) -> None:
        """``dst ← src`` in the rows of the clients taking this step (a finished client's rows stay)."""
        if self.all_active:
            torch._foreach_copy_(dst, src)
            return
        for d, t in zip(dst, src):
            d.copy_(torch.where(self.active_like(t), t, d))

    @staticmethod
    def norm_of(tensors: list[Tensor]) -> Tensor:
        """Each client's 2-norm over all of ``tensors`` (K, ...): (K,)."""
        K = tensors[0].shape[0]
        return torch.linalg.vector_norm(torch.cat([t.reshape(K, -1) for t in tensors], dim=1), dim=1)

    @staticmethod
    def div_rows_(tensors: list[Tensor], x: Tensor) -> None:
        """Each client's rows of ``tensors`` (K, ...) divided by its entry of ``x`` (K,) (a fixed number of kernels:
        ``cohort/rows.py``)."""
        scale_rows_(tensors, x, "div")

    @staticmethod
    def mul_rows_(tensors: list[Tensor], x: Tensor) -> None:
        """Each client's rows of ``tensors`` (K, ...) multiplied by its entry of ``x`` (K,) (``cohort/rows.py``)."""
        scale_rows_(tensors, x, "mul")

    def gradient_at(self, weights: dict[str, Tensor]) -> dict[str, Tensor]:
        """Each client's gradient at ``weights`` on its own minibatch of the step (``CohortServices.gradient_at``), as
        ``ClientContext.gradient_at`` for one client."""
        return self.services.gradient_at(self, weights)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> None:
        """``method.grad_clip`` per client (``clip_grad_norm_`` of each row): each client's gradient norm over all its
        parameters, its rows scaled to ``max_norm`` if above it (one (K, P) buffer: ``cohort/rows.py``)."""
        grads = [t.grad for t in self.params.values() if t.grad is not None]
        K = grads[0].shape[0]
        flat = flat_rows(grads)  # (K, P): the norms' input, scaled there and copied back (cohort/rows.py)
        norms = torch.linalg.vector_norm(flat if flat is not None else torch.cat([g.reshape(K, -1) for g in grads],
                                                                                 dim=1), dim=1)
        coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        scale_rows_(grads, coef, "mul", flat)

    def per_client(self, values: list, dtype=torch.float32) -> Tensor:
        """Host numbers, one per client, as a (K,) tensor on the clients' device, without waiting for the device
        (pinned memory, an asynchronous copy on CUDA): FAFED's 1 − α and η, a mask of the clients at their last step."""
        device = self.active.device
        t = torch.tensor(values, dtype=dtype)
        return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)

    def active_like(self, t: Tensor) -> Tensor:
        """``active`` shaped to broadcast against a stacked tensor ``t`` (K, ...)."""
        return self.active.view(-1, *([1] * (t.dim() - 1)))
