import numpy as np
import pytest
from omegaconf import OmegaConf

from fl_lightning.data import partition as P
from fl_lightning.errors import ConfigError

LABELS = np.repeat(np.arange(10), 50)  # 500 examples, 10 classes


def cfg(**kw):
    return OmegaConf.create(kw)


@pytest.mark.parametrize("spec", [dict(name="iid"), dict(name="dirichlet", alpha=0.3, min_size=5), dict(name="shards", shards_per_client=2)])
def test_disjoint_cover_and_deterministic(spec):
    parts = P.partition(LABELS, 10, cfg(**spec), seed=3)
    allidx = np.concatenate(parts)
    assert sorted(allidx.tolist()) == list(range(len(LABELS)))  # every example exactly once
    again = P.partition(LABELS, 10, cfg(**spec), seed=3)
    assert all((a == b).all() for a, b in zip(parts, again))
    other = P.partition(LABELS, 10, cfg(**spec), seed=4)
    assert any(len(a) != len(b) or (a != b).any() for a, b in zip(parts, other))


def test_dirichlet_skew_grows_as_alpha_shrinks():
    def mean_classes(alpha):
        parts = P.partition(LABELS, 10, cfg(name="dirichlet", alpha=alpha, min_size=1), seed=0)
        return P.stats(LABELS, parts).classes_per_client.mean()

    assert mean_classes(0.05) < mean_classes(100.0)
    assert mean_classes(100.0) == 10


def test_dirichlet_min_size_respected():
    parts = P.partition(LABELS, 10, cfg(name="dirichlet", alpha=0.5, min_size=20), seed=1)
    assert min(len(p) for p in parts) >= 20


def test_dirichlet_per_client_equal_sizes_seed004():
    parts = P.partition(LABELS, 7, cfg(name="dirichlet_per_client", alpha=0.1), seed=0)
    assert {len(p) for p in parts} == {len(LABELS) // 7}
    # strong skew: most clients concentrate on few classes
    dominant = [np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts]
    assert np.mean(dominant) > 0.5


def test_shards_give_few_classes():
    parts = P.partition(LABELS, 10, cfg(name="shards", shards_per_client=2), seed=0)
    assert P.stats(LABELS, parts).classes_per_client.max() <= 2


def test_impossible_min_size_is_a_config_error():
    with pytest.raises(ConfigError, match="data.partition.min_size"):
        P.partition(LABELS, 10, cfg(name="dirichlet", alpha=0.01, min_size=60), seed=0)


def test_empty_client_is_a_config_error():
    with pytest.raises(ConfigError, match="fl.num_clients"):
        P.partition(LABELS[:5], 10, cfg(name="iid"), seed=0)
