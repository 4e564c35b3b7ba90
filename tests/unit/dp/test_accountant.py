"""The accountant (fl_lightning/dp/accountant.py) against independent computations: a published figure, a second
library (prv-accountant: Gopi, Lee & Wutschitz, NeurIPS 2021, arXiv:2106.02848, its PRV accountant with stated error
bounds and its own RDP), the exact ε of the composed Gaussian mechanism (Balle & Wang, ICML 2018, arXiv:1805.06530,
Thm. 8; Dong, Roth & Su's μ-GDP, arXiv:1905.02383) for sampling without replacement at q = 1, and the calibration."""
from __future__ import annotations

import math

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from fl_lightning.dp import accountant as A

slow = pytest.mark.slow
N = 100_000  # a large federation, so q = S / N takes the values below


def _poisson(z, q, rounds, delta, kind):
    return A.epsilon(z, rounds, delta, N, round(q * N), "poisson", kind)


def test_published_abadi_figure():
    """Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, arXiv:1607.00133, Sec. 3.1: q = 0.01,
    σ = 4, δ = 1e-5, T = 10,000 gives ε ≈ 1.26 by the moments accountant (9.34 by strong composition). Both
    accountants here are tighter than the moments accountant's conversion, and neither is far below it."""
    for kind in A.ACCOUNTANTS:
        eps = _poisson(4.0, 0.01, 10_000, 1e-5, kind)
        assert 0.9 <= eps <= 1.26, (kind, eps)


@pytest.mark.parametrize("z,q,rounds,delta", [(1.1, 256 / 60_000, 2_000, 1e-5), *(pytest.param(*c, marks=slow) for c in (
    (1.0, 0.5, 40, 0.05), (4.0, 0.01, 10_000, 1e-5), (0.8, 0.1, 100, 1e-6)))])
def test_pld_within_prv_accountants_error_bounds(z, q, rounds, delta):
    """Poisson sampling (add/remove): PLD's ε inside prv-accountant's [lower, upper] bound (eps_error 1%), widened
    by the PLD's own discretisation (an upper bound: at most ~0.5% above)."""
    from prv_accountant import Accountant

    lo, _, hi = Accountant(noise_multiplier=z, sampling_probability=q, delta=delta, max_compositions=rounds,
                           eps_error=0.01).compute_epsilon(rounds)
    eps = _poisson(z, q, rounds, delta, "pld")
    assert lo * 0.995 <= eps <= hi * 1.005, (lo, eps, hi)


@pytest.mark.parametrize("z,q,rounds,delta", [(4.0, 0.01, 10_000, 1e-5), (0.8, 0.1, 100, 1e-6),
                                              (1.1, 256 / 60_000, 14_063, 1e-5)])
def test_rdp_matches_prv_accountants_rdp(z, q, rounds, delta):
    """The RDP accountant against prv-accountant's own RDP (its orders and conversion): within 1%. (At q = 0.5, z = 1
    dp_accounting drops its fractional orders below 2, whose series do not converge, and is up to 15% looser.)"""
    from prv_accountant.other_accountants import RDP
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    _, ref, _ = RDP([PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=z)]).compute_epsilon(
        delta, [rounds])
    assert _poisson(z, q, rounds, delta, "rdp") == pytest.approx(float(ref), rel=0.01)


def _gaussian_exact_eps(mu: float, delta: float) -> float:
    """The exact ε at δ of μ-GDP (a Gaussian mechanism with sensitivity/std = μ): δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    f = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta  # noqa: E731
    return brentq(f, 0.0, 500.0)


@pytest.mark.parametrize("z,rounds", [(2.0, 10), (5.0, 40), (1.0, 3)])
def test_fixed_sampling_all_clients_is_the_composed_gaussian(z, rounds):
    """fl.sampling=fixed with S = N (q = 1): replace-one neighbours move the clipped sum by 2C, the noise std is z·C,
    so R rounds are μ-GDP with μ = 2√R / z. RDP's ε is an upper bound on the exact one, and not loose by more than 35%."""
    exact = _gaussian_exact_eps(2 * math.sqrt(rounds) / z, 1e-5)
    eps = A.epsilon(z, rounds, 1e-5, 16, 16, "fixed")
    assert exact <= eps <= 1.35 * exact, (exact, eps)


def test_fixed_sampling_costs_more_than_poisson():
    """Replace-one (fixed-size) is the stronger neighbour relation: at the same z and q its ε exceeds add/remove's."""
    for z in (0.8, 2.0):
        assert A.epsilon(z, 50, 1e-5, 100, 10, "fixed") > A.epsilon(z, 50, 1e-5, 100, 10, "poisson", "rdp")
    assert A.which("pld", "fixed") == "rdp" and A.which("pld", "poisson") == "pld"


@pytest.mark.parametrize("sampling,kind,target", [("poisson", "pld", 0.5), ("fixed", "rdp", 8.0),
                                                  *(pytest.param(*c, marks=slow) for c in (("poisson", "pld", 8.0),
                                                                                           ("poisson", "rdp", 2.0)))])
def test_calibration_within_one_percent(sampling, kind, target):
    z = A.calibrate(target, 40, 1e-3, 200, 20, sampling, kind)
    eps = A.epsilon(z, 40, 1e-3, 200, 20, sampling, kind)
    assert 0.99 * target <= eps <= target, (z, eps)
    assert A.epsilon(z * 0.97, 40, 1e-3, 200, 20, sampling, kind) > target  # the smallest such z, to ~3%


@slow
def test_calibration_unreachable_and_the_round_limit():
    assert A.calibrate(1e-4, 40, 1e-3, 16, 8, "poisson") is None  # no z up to 1e3 gives ε = 1e-4 over 40 rounds
    z = 1.5
    eps = [A.epsilon(z, r, 1e-3, 100, 10, "poisson") for r in range(0, 21)]
    assert eps == sorted(eps) and eps[0] == 0
    limit = A.rounds_within(eps[12] + 1e-9, z, 20, 1e-3, 100, 10, "poisson")
    assert limit == 12
    assert A.rounds_within(1e9, z, 20, 1e-3, 100, 10, "poisson") == 20
    assert A.epsilon(0.0, 5, 1e-3, 100, 10) == math.inf
