"""LoopServices: what the loop computes for a part on request, and nothing more of the loop.

A part's hooks get a :class:`~fl_lightning.strategies.base.ClientContext` whose ``services`` is this object (the
:class:`~fl_lightning.strategies.base.ClientServices` protocol): gradients at other weights or on another batch,
Hessian-vector products, a client's extra minibatch gradient and generators seeded by (seed, purpose, client,
round). It holds the module, its trainable parameters, Fabric (precision and backward) and the data, never the
loop, so a part cannot reach the loop's rounds, store or checkpoints (docs/design.md).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import seeding
from ..step.grads import hvp, twice_differentiable  # noqa: F401 (twice_differentiable: re-exported)


class LoopServices:
    def __init__(self, fabric, module, params: dict[str, torch.nn.Parameter], data, seed: int):
        self.fabric, self.module, self.params, self.data, self.seed = fabric, module, params, data, seed
        self.device = fabric.device
        self.param_dtype = next(iter(params.values())).dtype

    def cast_floats(self, batch: dict) -> dict:
        """Float inputs in the parameters' dtype (needed under the "-true" precisions; a no-op otherwise)."""
        dtype = self.param_dtype
        return {k: (v.to(dtype) if v.is_floating_point() and v.dtype != dtype else v) for k, v in batch.items()}

    def loss(self, batch: dict, loss_fn=None) -> Tensor:
        with self.fabric.autocast():
            batch = self.cast_floats(batch)
            return loss_fn(self.module, batch) if loss_fn is not None else self.module.training_step(batch, 0)

    def gradient(self, batch: dict, loss_fn=None) -> dict[str, Tensor]:
        """Gradient of the loss on ``batch`` at the module's current weights; leaves ``p.grad`` as it was."""
        saved = {n: p.grad for n, p in self.params.items()}
        was_training = self.module.training
        self.module.train()
        for p in self.params.values():
            p.grad = None
        self.fabric.backward(self.loss(batch, loss_fn))
        grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in self.params.items()}
        for n, p in self.params.items():
            p.grad = saved[n]
        self.module.train(was_training)
        return grads

    def gradient_at(self, weights: dict[str, Tensor] | None, batch: dict, loss_fn=None) -> dict[str, Tensor]:
        """See :meth:`ClientContext.gradient_at`: swap ``weights`` in, take the gradient, swap the current ones back."""
        if not weights:
            return self.gradient(batch, loss_fn)
        current = {n: self.params[n].detach().clone() for n in weights}
        with torch.no_grad():
            for n, w in weights.items():
                self.params[n].copy_(w)
        try:
            return self.gradient(batch, loss_fn)
        finally:
            with torch.no_grad():
                for n, w in current.items():
                    self.params[n].copy_(w)

    def hvp(self, vector: dict[str, Tensor], batch: dict, loss_fn=None) -> dict[str, Tensor]:
        """See :meth:`ClientContext.hvp` (double backward through the loss's graph: :func:`fl_lightning.step.grads.hvp`)."""
        return hvp(lambda: self.loss(batch, loss_fn), self.params, vector)

    def extra_gradient(self, cid: int, r: int) -> dict[str, Tensor]:
        """The gradient at the current weights on a fresh minibatch of client ``cid`` (its (seed, client, round)
        extra stream)."""
        return self.gradient(self.data.extra_batch(cid, r, self.device))

    def eager_under_compile(self) -> None:
        """``trainer.compile``: what a part asks for inside the compiled step runs eagerly, outside the graph: a second
        backward (``gradient``, ``gradient_at``, ``extra_gradient``, ``hvp``; Dynamo fails to resume after one) and a
        seeded generator (numpy's uint64 seed hashing, a new ``torch.Generator``). Done here, for this object, and
        not with decorators: ``torch.compiler.disable`` loads torch._dynamo (~2 s) when it decorates."""
        for name in ("gradient", "hvp", "client_rng"):
            setattr(self, name, torch.compiler.disable(getattr(self, name)))

    def client_rng(self, purpose: str, cid: int, r: int) -> torch.Generator:
        return seeding.generator(self.seed, seeding.CLIENT_PART, seeding.purpose_id(purpose), cid, r, device=self.device)
