"""Quantize: b-bit symmetric uniform quantization with one scale per tensor (QSGD-style deterministic rounding to the
nearest level; Alistarh et al., NeurIPS 2017, arXiv 1610.02132, without the stochastic rounding).

FedSMU's α-bit variants (FedSMU paper, anonymous, under review: App. B.3, Table 8: "3-bit", "8-bit"; the quantizer
is not defined, decision 002/#20 in docs/decisions.md) replace sign(v) by this. With s = max|v| and x = v/s ∈ [−1, 1]:

  * ``grid: all_codes`` (default): the 2^b levels −1 + 2j/(2^b − 1), j = 0 … 2^b − 1 (every code used; no zero
    level; b = 1 gives ±1, i.e. sign(v) away from exact zeros);
  * ``grid: zero``: the 2L + 1 levels j/L, j = −L … L, L = 2^(b−1) − 1 (int8-style, exact zero; needs b ≥ 2).

``scale``: ``max`` rebuilds s·level (+ s per tensor, one value in the tensor's dtype: 32 bits for fp32); ``none``
rebuilds the level itself in [−1, 1] (nothing but the codes travels). FedSMU's α-bit variants use ``none``, so the
largest coordinate moves by ±1 like a sign and the server's γ1 keeps its meaning (the server step otherwise
unchanged; our reading, decision 002/#20). Bits: b·d (+ the scale).
An all-zero tensor is rebuilt as zeros.
"""
from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from ..config import Range, Validate
from ..errors import ConfigError
from ..messages import Msg
from .base import value_bits


def quantize(v: Tensor, bits: int, grid: str = "all_codes") -> tuple[Tensor, Tensor]:
    """(levels in [−1, 1] nearest to v / max|v|, the scale max|v|) for one tensor."""
    s = v.abs().max() if v.numel() else v.new_zeros(())
    x = v / torch.where(s > 0, s, torch.ones_like(s))
    if grid == "all_codes":
        n = 2 ** bits - 1
        lv = torch.round((x + 1) * (n / 2)).clamp(0, n) * (2.0 / n) - 1
    else:
        L = 2 ** (bits - 1) - 1
        lv = torch.round(x * L).clamp(-L, L) / L
    return torch.where(s > 0, lv, torch.zeros_like(lv)), s


def zero_grid_bits(bits, grid) -> bool:
    """Grid ``zero``'s levels are −1, 0 and 1 at the least: it needs 2 bits (a rule tying two arguments)."""
    return grid != "zero" or int(bits) >= 2


Bits = Annotated[int, Range(1, 16), Validate(zero_grid_bits, "grid zero needs at least 2 bits (levels -1, 0, 1)",
                                             "use bits >= 2 or grid all_codes")]


class Quantize:
    GRIDS = ("all_codes", "zero")
    SCALES = ("max", "none")

    def __init__(self, bits: Bits = 8, scale: str = "max", grid: str = "all_codes"):
        if scale not in self.SCALES:
            raise ConfigError("scale", f"unknown scale {scale!r}", f"use one of {', '.join(self.SCALES)}")
        if grid not in self.GRIDS:
            raise ConfigError("grid", f"unknown grid {grid!r}", f"use one of {', '.join(self.GRIDS)}")
        self.bits, self.scale, self.grid = int(bits), scale, grid

    def encode(self, tensor: Tensor, state=None,
               rng: torch.Generator | None = None) -> Msg:
        v = tensor.detach()
        lv, s = quantize(v, self.bits, self.grid)
        if self.scale == "max":
            return Msg(lv * s, nbits=self.bits * v.numel() + value_bits(v))
        return Msg(lv, nbits=self.bits * v.numel())
