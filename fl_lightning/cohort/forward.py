"""The batched forward of a cohort (``StackedForward``: K clients' losses and outputs at their rows of the stacked
parameters, under ``vmap``) and the narrow services a cohort's parts may ask for (``CohortServices``: a gradient
at other weights, a Hessian-vector product, a gradient against sampled labels), as ``LoopServices`` gives one client.
Neither holds the loop, the store, the checkpointer or the recorder."""
from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn

from ..step.grads import hvp


class _Losses(nn.Module):
    """``module.sample_outputs`` (or, for a model without it, ``module.sample_losses``) as a forward, for
    ``functional_call``."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.m = module
        self.split = callable(getattr(module, "sample_outputs", None))

    def forward(self, batch: dict) -> Tensor:
        return self.m.sample_outputs(batch) if self.split else self.m.sample_losses(batch)


class StackedForward:
    """Each client's loss and outputs at its rows of stacked parameters (K, ...) on its rows of a stacked batch
    (K, B, ...): the run's one module under ``vmap`` (``functional_call``), Fabric's autocast, each client's dropout
    masks from its own stream (``dropout``). ``rows``: each client's real rows in the current step (host numbers,
    set by the engine before each step)."""

    def __init__(self, fabric, module: nn.Module, names: list[str], dropout):
        self.fabric, self.module, self.names, self.dropout = fabric, module, names, dropout
        self.losses = _Losses(module)
        self.rows: list[int] = []

    def client_losses(self, params: dict[str, Tensor], batch: dict, mask: Tensor, count: Tensor,
                      only: list[bool] | None = None) -> Tensor:
        """Each client's loss at its rows of ``params`` (K, ...): the mean over its real rows of the batch (K, B, ...),
        as its sequential step's loss. The model under ``vmap``; its per-example loss on all K*B rows at once when it
        splits them (``sample_outputs`` / ``sample_losses_of``: a vmapped cross-entropy takes twice the kernels).
        ``only``: the clients whose sequential step runs this forward (the others' losses are not used, and their
        dropout streams do not draw); default: the step's active clients."""
        with self.fabric.autocast():
            out = self.client_outputs(params, batch, only)
            if self.losses.split:
                out = self.sample_losses(out, batch)
            return (out * mask).sum(1) / count

    def client_outputs(self, params: dict[str, Tensor], batch: dict, only: list[bool] | None = None) -> Tensor:
        """The model's outputs (``sample_outputs``, or the per-example losses of a model without it) of each client at
        its rows of ``params``, on its rows of ``batch``: (K, B, ...), under ``vmap`` (``only``: :meth:`client_losses`)."""
        def outputs(ps, b, masks=()):
            with self.dropout.apply(masks) if masks else contextlib.nullcontext():
                return torch.func.functional_call(self.losses, {f"m.{n}": t for n, t in ps.items()}, (b,),
                                                  strict=False)

        def one_client():  # the dropout calls' shapes: one client's forward
            outputs({n: t[0] for n, t in params.items()}, {k: v[0] for k, v in batch.items()})

        if self.dropout and self.module.training:
            rows = self.rows if only is None else [n if o else 0 for n, o in zip(self.rows, only)]
            with self.dropout.forward(one_client, batch, rows, len(next(iter(batch.values()))[0])) as masks:
                return torch.vmap(outputs)(params, batch, masks)
        return torch.vmap(outputs)(params, batch)

    def sample_losses(self, out: Tensor, batch: dict) -> Tensor:
        """The per-example losses (K, B) of the outputs (K, B, ...), on all K·B rows at once."""
        K, B = out.shape[:2]
        flat = {k: v.reshape(K * B, *v.shape[2:]) for k, v in batch.items()}
        return self.module.sample_losses_of(out.reshape(K * B, *out.shape[2:]), flat).view(K, B)


class CohortServices:
    """What a cohort's parts may ask for (:attr:`CohortContext.services`), and nothing else: each client's gradient
    at other weights, its Hessian-vector product and its gradient against labels sampled from its own softmax, all
    on the step's stacked batch."""

    def __init__(self, forward: StackedForward):
        self._forward = forward

    def gradient_at(self, cohort: "CohortContext", weights: dict[str, Tensor],
                    only: list[bool] | None = None) -> dict[str, Tensor]:
        """Each client's gradient on the step's batch at ``weights`` (stacked (K, ...), or one tensor every client
        shares), the other trainable parameters at the clients' own rows; ``.grad`` untouched. ``only``: the clients
        that take it (:meth:`StackedForward.client_losses`)."""
        f = self._forward
        K = len(cohort.clients)
        params = {n: (weights[n].expand(K, *cohort.params[n].shape[1:]) if n in weights and weights[n].dim() <
                      cohort.params[n].dim() else weights.get(n, cohort.params[n])).detach().requires_grad_(True)
                  for n in f.names}
        names = [n for n in f.names if n in weights]
        with torch.enable_grad():
            loss = f.client_losses(params, cohort.batch, cohort.mask, cohort.count, only).sum()
            grads = torch.autograd.grad(loss, [params[n] for n in names])
        return dict(zip(names, grads))

    def hvp(self, cohort: "CohortContext", vector: dict[str, Tensor], only: list[bool] | None = None) -> dict[str, Tensor]:
        """Each client's Hessian-vector product ∇²f_i · v_i at its rows, on the step's batch (the one double backward:
        :func:`fl_lightning.step.grads.hvp`; the clients' losses are independent, so one product of their sum is
        every client's). ``only``: the clients that take it."""
        f = self._forward
        params = {n: cohort.params[n].detach().requires_grad_(True) for n in f.names}
        return hvp(lambda: f.client_losses(params, cohort.batch, cohort.mask, cohort.count, only).sum(),
                   {n: params[n] for n in f.names if n in vector}, vector)

    def sampled_label_gradient(self, cohort: "CohortContext", generators: list) -> dict[str, Tensor]:
        """Each client's gradient of its loss against labels drawn from its own softmax (``module.sampled_labels``
        over its real rows, from ``generators[i]``; None: a client that takes none, whose rows are unused), as
        ``module.sampled_label_loss`` gives one client: Sophia's Gauss-Newton-Bartlett estimate."""
        f = self._forward
        only = [g is not None for g in generators]
        params = {n: cohort.params[n].detach().requires_grad_(True) for n in f.names}
        module, batch = f.module, cohort.batch
        with f.fabric.autocast():
            out = f.client_outputs(params, batch, only)
            labels = torch.zeros(out.shape[:2], dtype=torch.long, device=out.device)
            for i, g in enumerate(generators):
                if g is not None:
                    n = f.rows[i]
                    labels[i, :n] = module.sampled_labels(out[i, :n], g)
            losses = f.sample_losses(out, {**batch, "y": labels})
            loss = ((losses * cohort.mask).sum(1) / cohort.count).sum()
        grads = torch.autograd.grad(loss, [params[n] for n in f.names])
        return dict(zip(f.names, grads))
