"""The truncated-SVD codec (seed 004 FedMuon_SVD, spec 004 §3.5.5): rank rules, exactness at full rank, Eckart–Young
optimality of the truncation, and the bytes of the three factors."""
from __future__ import annotations

import math

import pytest
import torch

from fl_lightning.errors import ConfigError
from fl_lightning.codecs.lowrank import dense_fraction, svd_compress, svd_rank, svd_roundtrip


def test_svd_rank_rules():
    assert svd_rank(64, 27, "storage_frac", 0.05) == 1  # int(0.05·64·27/92) = 0 -> at least 1
    assert svd_rank(512, 512, "storage_frac", 0.05) == int(0.05 * 512 * 512 / 1025) == 12
    assert svd_rank(512, 512, "rank_frac", 0.05) == 25
    assert svd_rank(10, 4, "rank_frac", 1.0) == 4 and svd_rank(10, 4, "storage_frac", 1.0) == 2
    assert dense_fraction((512, 512), "storage_frac", 0.05) <= 0.05
    with pytest.raises(ConfigError, match="svd_mode"):
        svd_rank(4, 4, "top_k", 0.1)


@pytest.mark.parametrize("shape", [(8, 5), (5, 8), (6, 3, 3, 3), (4, 7, 2)])
def test_svd_full_rank_is_exact_and_bytes_counted(shape):
    t = torch.randn(*shape)
    m, n = shape[0], math.prod(shape[1:])
    rec, nbytes = svd_roundtrip(t, "rank_frac", 1.0)
    torch.testing.assert_close(rec, t, rtol=1e-4, atol=1e-5)
    r = min(m, n)
    assert nbytes == (m * r + r + r * n) * 4
    U, S, Vh = svd_compress(t, "rank_frac", 1.0)
    assert U.shape == (m, r) and S.shape == (r,) and Vh.shape == (r, n)


def test_svd_truncation_is_best_rank_r():
    g = torch.Generator().manual_seed(0)
    low = torch.randn(20, 2, generator=g) @ torch.randn(2, 30, generator=g)
    rec, nbytes = svd_roundtrip(low, "rank_frac", 0.1)  # r = 2 = the true rank: exact
    torch.testing.assert_close(rec, low, rtol=1e-4, atol=1e-4)
    assert nbytes == (20 * 2 + 2 + 2 * 30) * 4
    t = torch.randn(20, 30, generator=g)
    rec, _ = svd_roundtrip(t, "rank_frac", 0.1)
    s = torch.linalg.svdvals(t)
    assert (t - rec).norm().item() == pytest.approx(s[2:].norm().item(), rel=1e-4)  # Eckart–Young
    b = torch.randn(7)
    rec, nbytes = svd_roundtrip(b)
    assert torch.equal(rec, b) and nbytes == 28  # vectors travel dense
