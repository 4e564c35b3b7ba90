"""RandK: k coordinates drawn uniformly without replacement, scaled by d/k — an unbiased compressor
(Stich et al., NeurIPS 2018, arXiv 1809.07599; variance ω = d/k − 1). SCALLION's default (Huang, Li & Li 2023,
arXiv 2308.08165: "unbiased compression"; a baseline of seed 002, decision 002/#6 in docs/decisions.md).

The coordinates come from the sending client's generator (``client.rng("codec")``, passed by the part), so a run is
reproducible and resumes exactly. k = max(1, ⌈frac·d⌉) per tensor. Bits as :class:`TopK`: k values and k indices of
⌈log₂ d⌉ bits (``index_bits: 32`` for int32 indices).
"""
from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from ..config import Range
from .topk import TopK


class RandK(TopK):
    def __init__(self, frac: Annotated[float, Range(0.0, 1.0, open_low=True)] = 0.1, index_bits: str | int = "log2"):
        super().__init__(frac, index_bits)

    def omega(self, d: int) -> float:
        return d / self.k(d) - 1

    def pick(self, flat: Tensor, k: int, rng: torch.Generator | None) -> tuple[Tensor, float]:
        if rng is None:
            raise ValueError("RandK needs the client's generator (rng)")
        d = flat.numel()
        return torch.randperm(d, generator=rng, device=rng.device)[:k].to(flat.device), d / k
