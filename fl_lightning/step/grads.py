"""What a part may ask of a step beyond its own gradient, written once for a client and a cohort: the Hessian-vector
product by double backward (Pearlmutter 1994) and the kernels it needs."""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel


@contextlib.contextmanager
def twice_differentiable():
    """Kernels with a double backward, for the forward of a Hessian-vector product: scaled-dot-product attention on
    its math backend (the fused CPU/flash/memory-efficient kernels have no double backward: timm's ViT and Swin,
    transformers' LLaMA and RoBERTa call it) and cuDNN off (its RNNs have none). The training step keeps the fused
    kernels; only an estimate's forward runs here."""
    with sdpa_kernel(SDPBackend.MATH), torch.backends.cudnn.flags(enabled=False):
        yield


def hvp(loss_fn: Callable[[], Tensor], params: dict[str, Tensor], vector: dict[str, Tensor]) -> dict[str, Tensor]:
    """``∇²f · v`` for every tensor of ``params`` (zeros where the loss does not reach it): ``loss_fn()`` is f, taken
    under :func:`twice_differentiable`; ``vector`` maps names of ``params`` to v (a cohort's: its stacked rows, whose
    clients' losses are independent, so one product of their sum is every client's). ``.grad`` is untouched."""
    names = list(params)
    ps = [params[n] for n in names]
    with twice_differentiable():
        grads = torch.autograd.grad(loss_fn(), ps, create_graph=True, allow_unused=True)
        dot = sum((g * vector[n].to(g.dtype)).sum() for n, g in zip(names, grads) if g is not None and n in vector)
        hv = torch.autograd.grad(dot, ps, allow_unused=True)
    return {n: (h.detach() if h is not None else torch.zeros_like(p)) for n, p, h in zip(names, ps, hv)}
