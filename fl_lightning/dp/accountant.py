"""The privacy accountant: ε at δ after r rounds of the sampled Gaussian mechanism, and z calibrated to a target ε.

Google's ``dp_accounting`` (the library behind TensorFlow Privacy) does the accounting:

- ``fl.sampling=poisson`` (each client joins a round with probability q): ``PoissonSampledDpEvent(q,
  GaussianDpEvent(z))`` under add/remove-one neighbours, by the privacy-loss distribution (PLD: Koskela, Jälkö &
  Honkela, AISTATS 2020, arXiv:1906.03049; Doroshenko et al., PoPETs 2022, arXiv:2207.04380), or by Rényi DP (RDP:
  Mironov, CSF 2017, arXiv:1702.07476; Mironov, Talwar & Zhang 2019, arXiv:1908.10530) with ``dp.accountant=rdp``.
- ``fl.sampling=fixed`` (S of N clients without replacement): ``SampledWithoutReplacementDpEvent(N, S,
  GaussianDpEvent(z/2))`` under replace-one neighbours, by RDP only (Wang, Balle & Kasiviswanathan, AISTATS 2019,
  arXiv:1808.00087, Thm. 27): dp_accounting's PLD accountant does not take that event. Replacing a client moves the
  clipped sum by up to 2C, so the noise std z·C is z/2 sensitivities (the event's noise multiplier is std over
  sensitivity).

The accountant holds no state: ε after r rounds is a pure function of (z, sampling, r, δ), so a resumed run accounts
exactly as the uninterrupted one. An empty round (Poisson) counts: its noise is released too.
"""
from __future__ import annotations

import functools
import logging
import math

ACCOUNTANTS = ("pld", "rdp")
SAMPLINGS = ("fixed", "poisson")
PLD_DISCRETIZATION = 1e-3  # dp_accounting's value_discretization_interval; its ε is an upper bound at any interval
Z_MAX = 1e3  # the largest noise multiplier calibration tries
# RDP orders for sampling without replacement: its bound costs O(α) per integer order, and dp_accounting's default
# orders up to 1024 take ~0.3 s per z; these give the same ε wherever the optimal order is at most 128 (ε ≳ 0.1)
WOR_ORDERS = (1.5, 1.75, *range(2, 13), 14, 16, 20, 24, 28, 32, 40, 48, 64, 80, 96, 128)


def _quiet():
    """dp_accounting's RDP logs a warning per order where a series converges slowly (the order is dropped, the
    bound stays valid): kept off the run's console."""
    logging.getLogger("absl").setLevel(logging.ERROR)


def which(accountant: str, sampling: str) -> str:
    """The accountant used: ``pld`` is not available for sampling without replacement (fixed), which uses ``rdp``."""
    return "rdp" if sampling == "fixed" else accountant


@functools.lru_cache(maxsize=64)
def _rdp_one_round(z: float, num_clients: int, per_round: int, sampling: str):
    """(orders, RDP of one round) under the sampling's event."""
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    _quiet()
    if sampling == "poisson":
        acc = RdpAccountant()
        acc.compose(dpa.PoissonSampledDpEvent(per_round / num_clients, dpa.GaussianDpEvent(z)))
    else:
        acc = RdpAccountant(orders=WOR_ORDERS, neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
        acc.compose(dpa.SampledWithoutReplacementDpEvent(num_clients, per_round, dpa.GaussianDpEvent(z / 2)))
    return acc._orders, acc._rdp.copy()  # noqa: SLF001 (RDP composes linearly: r rounds are r times one)


@functools.lru_cache(maxsize=4096)
def epsilon(z: float, rounds: int, delta: float, num_clients: int, per_round: int, sampling: str = "poisson",
            accountant: str = "pld") -> float:
    """ε at ``delta`` after ``rounds`` rounds with noise multiplier ``z`` (std z·C on the sum of uploads clipped to C),
    ``per_round`` of ``num_clients`` clients (fixed) or each with q = per_round/num_clients (poisson). z = 0: inf."""
    if rounds <= 0:
        return 0.0
    if z <= 0:
        return math.inf
    kind = which(accountant, sampling)
    if kind == "rdp":
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        orders, rdp = _rdp_one_round(float(z), num_clients, per_round, sampling)
        return float(compute_epsilon(orders, rdp * rounds, delta)[0])
    import dp_accounting as dpa
    from dp_accounting.pld import PLDAccountant

    acc = PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    acc.compose(dpa.PoissonSampledDpEvent(per_round / num_clients, dpa.GaussianDpEvent(float(z))), int(rounds))
    return float(acc.get_epsilon(delta))


def calibrate(target: float, rounds: int, delta: float, num_clients: int, per_round: int, sampling: str = "poisson",
              accountant: str = "pld", rtol: float = 0.005) -> float | None:
    """The smallest noise multiplier z (to ``rtol`` of ε) whose ε after ``rounds`` is at most ``target``: bisection
    on log z (ε decreases in z); the ε it gives is within [1 − rtol, 1]·target unless z is at the bracket's floor.
    None: no z up to :data:`Z_MAX` reaches ``target``."""
    eps = lambda z: epsilon(z, rounds, delta, num_clients, per_round, sampling, accountant)  # noqa: E731
    hi = 1.0
    while eps(hi) > target:
        if hi >= Z_MAX:
            return None
        hi = min(hi * 4, Z_MAX)
    lo = hi / 4
    if eps(lo) <= target:
        lo = 1e-3
        if eps(lo) <= target:
            return lo
    for _ in range(100):  # invariant: eps(lo) > target >= eps(hi)
        if eps(hi) >= (1 - rtol) * target:
            break
        mid = math.sqrt(lo * hi)
        if eps(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def rounds_within(max_epsilon: float, z: float, rounds: int, delta: float, num_clients: int, per_round: int,
                  sampling: str = "poisson", accountant: str = "pld") -> int:
    """The most rounds (at most ``rounds``) whose ε stays at most ``max_epsilon`` (ε grows with rounds: bisection)."""
    eps = lambda r: epsilon(z, r, delta, num_clients, per_round, sampling, accountant)  # noqa: E731
    if eps(rounds) <= max_epsilon:
        return rounds
    lo, hi = 0, rounds  # eps(lo) <= max < eps(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if eps(mid) <= max_epsilon:
            lo = mid
        else:
            hi = mid
    return lo
