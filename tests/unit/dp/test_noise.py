"""DPNoise (fl_lightning/dp/noise.py) on aggregates built by hand: the deviation from the noiseless sum has std z·C
(a chi-square test over many rounds at fixed seeds), the mean divides by the expected clients, the noise is a function
of (seed, round) alone, an empty round releases noise on the remembered layout."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chi2

from fl_lightning.dp import CentralDP
from fl_lightning.dp.clip import COUNT_KEY
from fl_lightning.messages import Msg
from fl_lightning.strategies.aggregate import Aggregate

SHAPES = {"aggregation/w": (6, 4), "aggregation/b": (4,), "momentum/m/w": (6, 4)}


def _noise(z=1.3, clip=0.7, seed=0, n=20, s=5, sampling="poisson", mech=CentralDP, **kw):
    m = mech(clip=clip, noise_multiplier=z, num_clients=n, clients_per_round=s, rounds=50, sampling=sampling,
             seed=seed, **kw)
    noise = m.parts()["dp_noise"]
    noise.setup(SimpleNamespace(device=torch.device("cpu"), all_reduce_sum=None, local_steps=3))
    return noise


def _agg(clients: int, seed: int = 0) -> Aggregate:
    g = torch.Generator().manual_seed(seed)
    agg = Aggregate(20)
    for _ in range(clients):
        agg.add({k: Msg(torch.randn(s, generator=g, dtype=torch.float64)) for k, s in SHAPES.items()}, steps=3)
    return agg


def test_deviation_has_std_z_times_clip_chi_square():
    z, clip, rounds = 1.3, 0.7, 300
    noise = _noise(z, clip)
    total, df = 0.0, 0
    for r in range(rounds):
        agg = _agg(5, seed=r)
        before = {k: v.clone() for k, v in agg.sums.items()}
        noise.aggregate(r, agg)
        for k, v in before.items():
            dev = (agg.sums[k] - v) / (z * clip)
            total += float(dev.square().sum())
            df += dev.numel()
    p = chi2.cdf(total, df)  # the sum of df squared standard normals, if the std is z·C
    assert 0.001 < p < 0.999, (total / df, p)
    assert abs(total / df - 1) < 0.05  # a std off by 2.5% would fail: (1.025)^2 - 1 = 0.05 is 7 sigma at df 1.5e4


def test_mean_divides_by_expected_clients_and_noise_is_a_function_of_seed_and_round():
    a, b = _noise(seed=3), _noise(seed=3)
    agg1, agg2, agg3 = _agg(7, 1), _agg(7, 1), _agg(7, 1)
    b.aggregate(9, _agg(2, 5))  # another round first: the draw of round 4 does not depend on it
    a.aggregate(4, agg1)
    b.aggregate(4, agg2)
    _noise(seed=4).aggregate(4, agg3)
    for k in SHAPES:
        assert torch.equal(agg1.sums[k], agg2.sums[k])
        assert not torch.equal(agg1.sums[k], agg3.sums[k])
        assert agg1.weights[k] == 5.0  # q·N = clients_per_round, not the 7 that came
        assert torch.equal(agg1.mean(k), agg1.sums[k] / 5.0)
    assert agg1.num_sampled == 5 and agg1.steps == 15  # the parts see the expected count


def test_zero_noise_changes_no_bit_and_fixed_sampling_keeps_the_count():
    noise = _noise(z=0.0, sampling="fixed", s=5)
    agg, ref = _agg(5, 2), _agg(5, 2)
    noise.aggregate(0, agg)
    for k in SHAPES:
        assert torch.equal(agg.sums[k], ref.sums[k]) and agg.weights[k] == ref.weights[k] == 5.0
    assert agg.num_sampled == 5 and agg.steps == ref.steps
    assert noise.server_update(0, agg) == {"dp_delta": 20 ** -1.1, "dp_noise_multiplier": 0.0}  # z = 0: no ε (∞)


def test_empty_round_releases_noise_on_the_remembered_layout_and_resumes_it():
    noise = _noise()
    assert not noise.releases_empty_rounds  # no layout yet: nothing to noise
    noise.aggregate(0, _agg(3))
    assert noise.releases_empty_rounds
    empty = Aggregate(20)
    noise.aggregate(1, empty)
    assert set(empty.sums) == set(SHAPES)
    assert all(empty.sums[k].shape == SHAPES[k] and empty.weights[k] == 5.0 for k in SHAPES)
    assert all(float(empty.sums[k].abs().sum()) > 0 for k in SHAPES)  # noise on zeros
    fresh = _noise()  # a resumed run: the layout comes back from the checkpoint
    fresh.load_state_dict(noise.state_dict())
    again = Aggregate(20)
    fresh.aggregate(1, again)
    assert all(torch.equal(again.sums[k], empty.sums[k]) for k in SHAPES)
