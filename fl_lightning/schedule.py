"""Per-round learning-rate multipliers: ``constant`` or ``cosine`` over rounds (seed 004 decays to 0 over R),
with optional linear warm-up rounds and a floor ``min_factor``."""
from __future__ import annotations

import math


def lr_factor(round_idx: int, rounds: int, kind: str = "constant", min_factor: float = 0.0, warmup_rounds: int = 0) -> float:
    if warmup_rounds and round_idx < warmup_rounds:
        return (round_idx + 1) / warmup_rounds
    if kind == "constant":
        return 1.0
    if kind == "cosine":
        span = max(1, rounds - warmup_rounds)
        t = (round_idx - warmup_rounds) / span
        return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * t))
    raise ValueError(kind)
