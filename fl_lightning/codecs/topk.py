"""TopK: the k largest-magnitude coordinates (Stich et al., NeurIPS 2018, arXiv 1809.07599; Aji & Heafield 2017).

k = ``max(1, ceil(frac · d))`` for a tensor of d entries (``frac`` in (0, 1], default 1 %: our choice for
FedEF-TopK, whose k the FedSMU paper does not give). What travels is k values (in the tensor's dtype) and k indices
of ``index_bits`` each. The rule (the FedSMU paper's bit count, App. B.2, leaves the index cost open; decision 002/#7
in docs/decisions.md): ``log2`` (default) charges ⌈log₂ d⌉ bits per index (0 for a one-entry tensor), so an fp32
tensor costs **k·(32 + ⌈log₂ d⌉)** bits, fp64 k·(64 + ⌈log₂ d⌉); ``32`` charges int32 indices (k·64 bits for fp32),
as most FL code sends them. The receiver rebuilds the dense tensor with zeros elsewhere. Ties are broken by
``torch.topk``.
"""
from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor

from ..errors import ConfigError
from ..messages import Msg
from ..config import Range
from .base import index_bits, value_bits


class TopK:
    def __init__(self, frac: Annotated[float, Range(0.0, 1.0, open_low=True)] = 0.01, index_bits: str | int = "log2"):
        if index_bits not in ("log2", 32, "32"):
            raise ConfigError("index_bits", f"unknown value {index_bits!r}", "use 32 or log2")
        self.frac, self.index_bits = float(frac), ("log2" if index_bits == "log2" else 32)

    def k(self, d: int) -> int:
        return max(1, min(d, math.ceil(self.frac * d)))

    def encode(self, tensor: Tensor, state=None,
               rng: torch.Generator | None = None) -> Msg:
        v = tensor.detach()
        flat = v.reshape(-1)
        d = flat.numel()
        k = self.k(d)
        idx, scale = self.pick(flat, k, rng)
        out = torch.zeros_like(flat)
        out[idx] = flat[idx] if scale == 1 else flat[idx] * scale
        ib = index_bits(d) if self.index_bits == "log2" else 32
        return Msg(out.view_as(v), nbits=k * (value_bits(v) + ib))

    def pick(self, flat: Tensor, k: int, rng: torch.Generator | None) -> tuple[Tensor, float]:
        """The k coordinates sent and the factor applied to their values."""
        return flat.abs().topk(k, sorted=False).indices, 1
