"""The adaptive clip (fl_lightning/dp/adaptive.py) against Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS 2021,
arXiv:1905.03871: the geometric update of C from the noised count (Alg. 1), the update's noise that keeps the round's
total privacy (Sec. 3), C in the checkpoint."""
from __future__ import annotations

import math

import pytest
import torch

from fl_lightning.dp import AdaptiveCentralDP
from fl_lightning.dp.clip import COUNT_KEY
from fl_lightning.messages import Msg
from fl_lightning.strategies.aggregate import Aggregate
from tests.unit.dp.test_noise import _noise


def test_adaptive_clip_follows_the_geometric_rule():
    """Andrew et al. 2021, Alg. 1: C ← C·exp(−η(b̃ − γ)), with b̃ the noised fraction under C. No count noise (z = 0):
    b̃ is exact."""
    noise = _noise(z=0.0, clip=1.0, mech=AdaptiveCentralDP, target_quantile=0.5, clip_lr=0.2)
    agg = Aggregate(20)
    for b in (1, 1, 1, 0, 0):  # 3 of 5 under C
        agg.add({COUNT_KEY: Msg(torch.tensor(b - 0.5, dtype=torch.float64)), "aggregation/b": Msg(torch.zeros(4))})
    noise.aggregate(0, agg)
    out = noise.server_update(0, agg)
    assert out["dp_below_fraction"] == pytest.approx(0.6) and out["dp_clip"] == 1.0
    assert noise.clip == pytest.approx(math.exp(-0.2 * 0.1), rel=1e-12)
    assert float(noise.state_dict()["clip"]) == noise.clip


def test_adaptive_update_noise_keeps_the_total_privacy():
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the update and the count together are one Gaussian with z (Andrew et al. Sec. 3)."""
    m = AdaptiveCentralDP(noise_multiplier=1.0, num_clients=1000, clients_per_round=100, rounds=10, sampling="poisson")
    assert m.count_noise == 5.0  # m / 20
    assert m.update_noise ** -2 + (2 * m.count_noise) ** -2 == pytest.approx(1.0)
