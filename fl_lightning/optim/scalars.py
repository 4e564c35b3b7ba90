"""In-place steps whose scale may be a Python number or a 0-d tensor.

A learning rate is a float in an eager run. Under ``trainer.compile`` it is a 0-d tensor on the device
(:class:`fl_lightning.compiled_step.CompiledStep`), so a schedule that changes it every round does not make Dynamo
recompile the step: a float passed as ``alpha=`` is baked into the graph as a constant. These helpers keep the eager
arithmetic exactly as it was (``alpha=``/``value=``, bit for bit) and multiply by the tensor otherwise.
"""
from __future__ import annotations

import torch
from torch import Tensor


def add_scaled_(p: Tensor, x: Tensor, a) -> Tensor:
    """``p += a·x`` in place."""
    return p.add_(x * a) if isinstance(a, Tensor) else p.add_(x, alpha=a)


def addcdiv_scaled_(p: Tensor, m: Tensor, d: Tensor, a) -> Tensor:
    """``p += a·m/d`` in place."""
    return p.add_(m / d * a) if isinstance(a, Tensor) else p.addcdiv_(m, d, value=a)


def foreach_add_scaled_(ps: list[Tensor], xs: list[Tensor], a) -> None:
    """``p += a·x`` for each pair, in place."""
    if isinstance(a, Tensor):
        torch._foreach_add_(ps, torch._foreach_mul(xs, a))
    else:
        torch._foreach_add_(ps, xs, alpha=a)
