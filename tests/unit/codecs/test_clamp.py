"""Clamp: the inner codec's bits, a clamped reconstruction (FedPAC_Sophia_light's h >= 0)."""
import pytest
import torch

from fl_lightning.codecs import Clamp, Dense, LowRankSVD
from fl_lightning.errors import ConfigError


def test_clamp_keeps_the_bits_and_clamps_the_reconstruction():
    g = torch.Generator().manual_seed(0)
    h = torch.rand(12, 9, generator=g) ** 4  # non-negative, far from low rank
    inner = LowRankSVD(frac=0.5)  # rank 2 (a rank-1 cut of a non-negative matrix stays >= 0)
    plain, clamped = inner.encode(h), Clamp(inner, min=0.0).encode(h)
    assert plain.tensor.min() < 0  # a truncated SVD of a non-negative matrix dips below 0
    assert clamped.bits() == plain.bits()
    torch.testing.assert_close(clamped.tensor, plain.tensor.clamp(min=0.0), rtol=0, atol=0)
    v = torch.tensor([-1.0, 2.0])
    assert Clamp(Dense(), min=0.0, max=1.0).encode(v).tensor.tolist() == [0.0, 1.0]


@pytest.mark.parametrize("kw,arg", [(dict(inner="svd"), "inner"), (dict(inner=Dense(), min=None), "min"),
                                    (dict(inner=Dense(), min=2.0, max=1.0), "min")])
def test_bad_values_are_config_errors(kw, arg):
    with pytest.raises(ConfigError) as e:
        Clamp(**kw)
    assert arg in str(e.value)
