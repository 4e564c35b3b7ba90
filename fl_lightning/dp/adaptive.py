"""AdaptiveNoise: DP noise with the clip C adapted each round toward a quantile of the clients' upload norms.

Andrew, Thakkar, McMahan & Ramaswamy, "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021,
arXiv:1905.03871, Alg. 1: each client sends b_i = 1[‖u_i‖ ≤ C] (centred, b_i − ½: sensitivity ½); the server
noises the count with N(0, σ_b²), b̃ = (Σ(b_i − ½) + N(0, σ_b²))/m + ½ with m the expected clients, and steps
C ← C·exp(−η_C (b̃ − γ)) (the geometric update, their eq. 3). The update's noise is z_Δ·C with
z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) (their Sec. 3), so the round as a whole is one Gaussian mechanism with multiplier z.
C is server state: checkpointed, the same on every process (the noised count is).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from ..strategies.base import Aggregate
from .clip import COUNT_KEY
from .noise import DPNoise


class AdaptiveNoise(DPNoise):
    def update_std(self) -> float:
        return self.mech.update_noise * self.clip

    def count_std(self) -> float:
        return self.mech.count_noise if self.mech.noise_multiplier > 0 else 0.0

    def server_update(self, round_idx: int, agg: Aggregate) -> dict[str, float]:
        out = super().server_update(round_idx, agg)
        used = self.clip
        if COUNT_KEY in agg.sums:
            below = float(agg.sums[COUNT_KEY]) / self.mech.expected_clients + 0.5
            self.clip = used * math.exp(-self.mech.clip_lr * (below - self.mech.target_quantile))
            out["dp_below_fraction"] = below
        out["dp_clip"] = used
        return out

    def state_dict(self) -> dict[str, Tensor]:
        return {**super().state_dict(), "clip": torch.tensor(self.clip, dtype=torch.float64)}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.clip = float(state["clip"])
        super().load_state_dict({k: state[k] for k in state if k != "clip"})
