"""fl_lightning/seeding.py's client sampling: fl.sampling=poisson's round sizes follow Binomial(N, q) (a chi-square
goodness-of-fit test at a fixed seed), each client joins with probability q, and fixed sampling is unchanged."""
from __future__ import annotations

import numpy as np
from scipy.stats import binom, chi2

from fl_lightning import seeding


def test_poisson_round_sizes_are_binomial():
    n, s, rounds = 16, 4, 4000
    q = s / n
    sizes = np.array([len(seeding.round_clients(0, r, n, s, "poisson")) for r in range(rounds)])
    expected = binom.pmf(np.arange(n + 1), n, q) * rounds
    keep = expected >= 5  # pool the tails into cells of at least 5 expected rounds
    obs = np.bincount(sizes, minlength=n + 1)
    o = np.append(obs[keep], obs[~keep].sum())
    e = np.append(expected[keep], expected[~keep].sum())
    stat = float(((o - e) ** 2 / e).sum())
    assert chi2.sf(stat, len(o) - 1) > 0.001, (stat, o, e)
    assert (sizes == 0).any()  # empty rounds happen ((3/4)^16 = 1% of them)
    joins = np.zeros(n)
    for r in range(rounds):
        joins[seeding.round_clients(0, r, n, s, "poisson")] += 1
    assert np.abs(joins / rounds - q).max() < 4 * np.sqrt(q * (1 - q) / rounds)


def test_poisson_is_seeded_by_seed_and_round_and_fixed_is_unchanged():
    assert seeding.round_clients(3, 7, 50, 10, "poisson") == seeding.round_clients(3, 7, 50, 10, "poisson")
    assert seeding.round_clients(3, 7, 50, 10, "poisson") != seeding.round_clients(3, 8, 50, 10, "poisson")
    assert seeding.round_clients(3, 7, 50, 10) == seeding.sample_clients(3, 7, 50, 10)
    assert seeding.sample_clients(0, 0, 16, 8) == sorted(
        np.random.default_rng(seeding.derive(0, seeding.SAMPLING, 0)).choice(16, size=8, replace=False).tolist())
