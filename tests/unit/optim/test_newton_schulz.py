"""Newton–Schulz orthogonalization / spectral LMO (fl_lightning.optim.newton_schulz), incl. Lemma 12 of seed 000."""

import math

import pytest
import torch

from fl_lightning.optim import NS_COEFFS, as_matrix, lmo_spectral, matrix_shape, ns_polynomial, orthogonalize

PE = "polar_express"  # (15/8, -5/4, 3/8): seed-000 theory coefficients


def rand_orth(n, gen):
    q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=gen))
    return q


def with_spectrum(m, n, s, gen):
    """m×n matrix U diag(s) Vᵀ with Haar-ish random U, V."""
    r = min(m, n)
    return rand_orth(m, gen)[:, :r] @ torch.diag(s.to(torch.float64)) @ rand_orth(n, gen)[:r, :]


def test_coeff_table():
    assert NS_COEFFS["muon"] == (3.4445, -4.7750, 2.0315)
    assert NS_COEFFS["polar_express"] == (15 / 8, -5 / 4, 3 / 8)


def test_T0_is_frobenius_normalization():
    G = torch.randn(5, 9, dtype=torch.float64)
    for coeffs in ("muon", PE):
        torch.testing.assert_close(orthogonalize(G, steps=0, coeffs=coeffs), G / G.norm(), rtol=1e-14, atol=0)
    G32 = torch.randn(3, 4, 3, 3)  # conv kernel: still normalized by its total Frobenius norm
    torch.testing.assert_close(orthogonalize(G32, steps=0), G32 / G32.norm())


@pytest.mark.parametrize("shape", [(6, 6), (4, 9), (9, 4)])
def test_svd_gives_polar_factor(shape):
    G = torch.randn(*shape, dtype=torch.float64)
    O = orthogonalize(G, method="svd")
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    torch.testing.assert_close(O, U @ Vh)
    r = min(shape)
    gram = O @ O.T if shape[0] <= shape[1] else O.T @ O  # orthonormal rows (wide) / columns (tall)
    torch.testing.assert_close(gram, torch.eye(r, dtype=torch.float64))
    torch.testing.assert_close((G * O).sum(), S.sum())  # <G, UVᵀ> = ||G||_trace
    torch.testing.assert_close(lmo_spectral(G, method="svd"), -O)
    assert (G * lmo_spectral(G, method="svd")).sum() == pytest.approx(-S.sum().item())


def test_svd_rank_deficient_uses_rank_r_part():
    gen = torch.Generator().manual_seed(1)
    G = with_spectrum(6, 8, torch.tensor([3.0, 1.0, 0, 0, 0, 0]), gen)
    sv = torch.linalg.svdvals(orthogonalize(G, method="svd"))
    torch.testing.assert_close(sv, torch.tensor([1.0, 1, 0, 0, 0, 0], dtype=torch.float64), atol=1e-10, rtol=0)


def test_polar_express_converges_to_svd():
    gen = torch.Generator().manual_seed(2)
    G = with_spectrum(7, 12, torch.logspace(0, -1, 7), gen)
    torch.testing.assert_close(orthogonalize(G, steps=25, coeffs=PE), orthogonalize(G, method="svd"), atol=1e-9, rtol=0)


def test_keller_ns5_singular_values_in_band():
    gen = torch.Generator().manual_seed(3)
    for m, n in [(16, 16), (8, 32), (32, 8), (20, 12)]:
        r = min(m, n)
        s = torch.logspace(0, -1.5, r) * torch.exp(0.1 * torch.randn(r, generator=gen))
        G = with_spectrum(m, n, s, gen).float()
        sv = torch.linalg.svdvals(orthogonalize(G, steps=5, coeffs="muon"))
        assert sv.min() >= 0.6 and sv.max() <= 1.25, (m, n, sv)
    # default kwargs are Keller Jordan's quintic, 5 steps
    torch.testing.assert_close(orthogonalize(G), orthogonalize(G, steps=5, coeffs=NS_COEFFS["muon"]))


@pytest.mark.parametrize("coeffs", ["muon", PE])
def test_wide_tall_equivalence(coeffs):
    G = torch.randn(5, 11, dtype=torch.float64)
    torch.testing.assert_close(orthogonalize(G.T, steps=4, coeffs=coeffs), orthogonalize(G, steps=4, coeffs=coeffs).T)
    torch.testing.assert_close(orthogonalize(G.T, method="svd"), orthogonalize(G, method="svd").T)


@pytest.mark.parametrize("method", ["ns", "svd"])
def test_batching_equals_per_matrix(method):
    G = torch.randn(4, 6, 9, generator=torch.Generator().manual_seed(0))  # seeded: whatever ran before in the worker
    G[1] *= 100.0  # different scales: each matrix must be normalized on its own
    G[2] = 0.0  # and a zero matrix in the batch stays zero
    out = orthogonalize(G, steps=5, method=method)
    for i in range(4):
        torch.testing.assert_close(out[i], orthogonalize(G[i], steps=5, method=method), atol=1e-6, rtol=1e-5)
    assert torch.all(out[2] == 0) and torch.isfinite(out).all()


def test_conv_reshape_round_trip():
    W = torch.randn(8, 3, 3, 3)
    assert as_matrix(W).shape == (8, 27) and matrix_shape(W) == (8, 27)
    assert as_matrix(torch.randn(4, 5, 6)).shape == (4, 5, 6) and matrix_shape(torch.Size([4, 5, 6])) == (5, 6)
    torch.testing.assert_close(as_matrix(W).reshape(W.shape), W)
    for method in ("ns", "svd"):
        out = orthogonalize(W, method=method)
        assert out.shape == W.shape
        torch.testing.assert_close(out, orthogonalize(W.reshape(8, 27), method=method).reshape(W.shape))
    with pytest.raises(ValueError):
        as_matrix(torch.randn(5))


@pytest.mark.parametrize("method", ["ns", "svd"])
def test_zero_input_gives_zeros(method):
    for shape in [(3, 4), (5, 2), (2, 3, 3, 3)]:
        out = orthogonalize(torch.zeros(shape), method=method)
        assert out.shape == shape and torch.all(out == 0)
    out = lmo_spectral(torch.zeros(3, 4), steps=0)
    assert torch.all(out == 0)


def test_dtype_handling():
    G = torch.randn(16, 32)
    assert orthogonalize(G).dtype == torch.float32
    assert orthogonalize(G.double()).dtype == torch.float64
    bf = orthogonalize(G, dtype=torch.bfloat16)  # computed in bf16, returned in the input dtype
    assert bf.dtype == torch.float32
    assert (bf - orthogonalize(G)).abs().max() < 0.1
    torch.testing.assert_close(orthogonalize(G, dtype="bfloat16"), bf)


def test_bad_arguments():
    with pytest.raises(ValueError):
        orthogonalize(torch.randn(3, 3), steps=-1)
    with pytest.raises(ValueError):
        orthogonalize(torch.randn(3, 3), coeffs="nope")
    with pytest.raises(ValueError):
        orthogonalize(torch.randn(3, 3), method="qr")


# ----------------------------------------------------------------------------- Lemma 12 (spec 000 §8 C4)
def p_kappa(kappa: float, T: int) -> float:
    """p(κ, T) = 1 + log(1 - (1-κ)^{1.5^T}) / log κ. κ = 1 (rank one: all Schatten norms coincide) → the limit
    κ → 1, which is 2 at T = 0 and 1 for T ≥ 1."""
    if kappa >= 1.0:
        return 2.0 if T == 0 else 1.0
    return 1.0 + math.log1p(-((1.0 - kappa) ** (1.5**T))) / math.log(kappa)


def test_p_kappa_properties():
    for kappa in [1e-6, 1e-3, 0.05, 0.2, 0.5, 0.7071, 0.99, 1.0]:
        ps = [p_kappa(kappa, T) for T in range(12)]
        assert ps[0] == pytest.approx(2.0, abs=1e-9)
        assert all(b <= a + 1e-12 for a, b in zip(ps, ps[1:])), ps  # p decreases with T
        assert all(1.0 - 1e-12 <= p <= 2.0 + 1e-12 for p in ps)
    assert p_kappa(0.3, 30) == pytest.approx(1.0, abs=1e-6)  # → 1 as T → ∞


def test_phi_properties_on_grid():
    x = torch.linspace(0, 1, 20001, dtype=torch.float64)
    phi = ns_polynomial(x, PE)
    assert ns_polynomial(1.0, PE) == pytest.approx(1.0)
    assert torch.all(phi >= x - 1e-15)
    assert torch.all(1 - phi <= (1 - x) ** 1.5 + 1e-15)
    assert torch.all((phi >= 0) & (phi <= 1 + 1e-15))
    torch.testing.assert_close(1 - phi, (1 - x) ** 3 * (3 * x**2 + 9 * x + 8) / 8)  # spec 000 §3.2 factorization


def _lemma12_cases():
    gen = torch.Generator().manual_seed(12)
    spectra = {
        "geo10": lambda r: torch.logspace(0, -1, r),
        "geo1e3": lambda r: torch.logspace(0, -3, r),
        "geo1e6": lambda r: torch.logspace(0, -6, r),
        "flat": lambda r: 1 + 0.01 * torch.rand(r, generator=gen),
        "dominant": lambda r: torch.cat([torch.tensor([100.0]), torch.rand(r - 1, generator=gen)]),
        "lowrank": lambda r: torch.cat([0.5 + torch.rand((r + 1) // 2, generator=gen), torch.zeros(r // 2)]),
        "rank1": lambda r: torch.cat([torch.tensor([3.0]), torch.zeros(r - 1)]),
    }
    for m, n in [(4, 4), (3, 7), (8, 5), (12, 12), (2, 10), (10, 3)]:
        yield torch.randn(m, n, dtype=torch.float64, generator=gen)
        for f in spectra.values():
            scale = 10 ** (2 * torch.randn((), generator=gen).item())  # the lemma is scale-free
            yield scale * with_spectrum(m, n, f(min(m, n)), gen)


def test_lemma12_inner_product_and_spectral_bounds():
    """Lemma 12 with (15/8, -5/4, 3/8), T = 0..7: with G^(T) = orthogonalize(G) (Alg. 2 without the minus),
    (i) <G, G^(T)> ≥ ||G||_p(κ,T), (ii) ||G^(T)||_sp ≤ 1, (iii) <G, G^(T)> ≤ ||G||_trace."""
    n_cases = 0
    for G in _lemma12_cases():
        s = torch.linalg.svdvals(G)
        s = s[s > 1e-12 * s.max()]  # nonzero singular values
        kappa = (s.min() / s.norm()).item()
        trace = s.sum().item()
        for T in range(8):
            O = orthogonalize(G, steps=T, coeffs=PE)
            ip = (G * O).sum().item()
            p = p_kappa(kappa, T)
            schatten_p = (s**p).sum().item() ** (1 / p)
            assert ip >= schatten_p * (1 - 1e-10), (tuple(G.shape), T, kappa, ip, schatten_p)  # (i)
            assert torch.linalg.matrix_norm(O, 2).item() <= 1 + 1e-6  # (ii)
            assert ip <= trace * (1 + 1e-10)  # (iii)
            n_cases += 1
    assert n_cases >= 300


def test_keller_coefficients_overshoot_spectral_norm():
    """Negative control: Keller Jordan's quintic pushes singular values above 1, so Lemma 12 (ii) fails."""
    gen = torch.Generator().manual_seed(4)
    worst = max(
        torch.linalg.matrix_norm(orthogonalize(G, 5, "muon"), 2).item()
        for G in torch.randn(5, 8, 8, dtype=torch.float64, generator=gen)
    )
    assert worst > 1.05
    x = torch.linspace(0, 1, 1001, dtype=torch.float64)
    assert ns_polynomial(x, "muon").max() > 1.2  # already one step overshoots
