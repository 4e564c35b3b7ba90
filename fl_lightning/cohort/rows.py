"""Per-client scaling of a cohort's stacked tensors (K, ...) in a fixed number of kernels, whatever their count.

``torch._foreach_mul_(tensors, [x.view(-1, 1, ...) for ...])`` broadcasts a (K,) factor over each tensor, which the
multi-tensor kernels do not take: on CUDA it falls back to one kernel per tensor (a ResNet-18 has 62, a ViT-Tiny 152).
Here the tensors are copied into one (K, P) buffer (one ``cat``), scaled there (one kernel) and copied back (one
``split_with_sizes_copy``, a single kernel on CUDA): three launches, and the same arithmetic elementwise (the values
copied exactly, each multiplied or divided by its client's factor), so the result is the per-tensor one bit for bit.
"""
from __future__ import annotations

import torch
from torch import Tensor


def flat_rows(tensors: list[Tensor]) -> Tensor | None:
    """``tensors`` (K, ...) as one (K, P) copy, each client's entries in its row; None where they cannot share one
    (dtypes or devices differ, a tensor not contiguous)."""
    t0 = tensors[0]
    if any(t.dtype != t0.dtype or t.device != t0.device or not t.is_contiguous() for t in tensors):
        return None
    K = t0.shape[0]
    return torch.cat([t.reshape(K, -1) for t in tensors], dim=1)


def write_rows_(tensors: list[Tensor], flat: Tensor) -> None:
    """``flat`` (K, P) back into ``tensors`` (K, ...) (one kernel on CUDA)."""
    K = flat.shape[0]
    torch.split_with_sizes_copy(flat, [t[0].numel() for t in tensors], dim=1, out=[t.view(K, -1) for t in tensors])


@torch.no_grad()
def scale_rows_(tensors: list[Tensor], x: Tensor, op: str = "mul", flat: Tensor | None = None) -> None:
    """Each client's rows of ``tensors`` (K, ...) multiplied (``op="mul"``) or divided (``"div"``) by its entry of
    ``x`` (K,), in place; ``flat``: their :func:`flat_rows` already made (clipping's, for the norm)."""
    if not tensors:
        return
    flat = flat if flat is not None else flat_rows(tensors)
    if flat is None:  # the per-tensor form
        views = [x.view(-1, *([1] * (t.dim() - 1))) for t in tensors]
        (torch._foreach_mul_ if op == "mul" else torch._foreach_div_)(tensors, views)
        return
    getattr(flat, f"{op}_")(x.view(-1, 1))
    write_rows_(tensors, flat)
