"""Partitioners, built from their ``conf/data/partition/*.yaml`` nodes the way the data builder builds them."""
import hashlib

import numpy as np
import pytest

from fl_lightning.config import check_targets
from fl_lightning.config.compose import instantiate
from fl_lightning.data import FEDERATION_KEYS, PARTITION_SEED, build_federated_data
from fl_lightning.data import partition as P
from fl_lightning.errors import ConfigError
from tests.conftest import make_cfg

LABELS = np.repeat(np.arange(10), 50)  # 500 examples, 10 classes


def part(group: str, *overrides: str, labels=LABELS, n: int = 10, seed: int = 3):
    """The partition as a run builds it: the config check (ranges from the annotations), then the partitioner."""
    cfg = make_cfg([f"data/partition={group}", *overrides], "unused")
    check_targets(cfg, groups=("data",), drop={"data": FEDERATION_KEYS})
    return instantiate(cfg.data.partition, "data.partition", labels=labels, num_clients=n,
                       rng=np.random.default_rng([seed, PARTITION_SEED]))


def digest(parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(np.int64(len(p)).tobytes())
        h.update(np.asarray(p, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("group,overrides", [("iid", []), ("dirichlet", ["data.partition.alpha=0.3", "data.partition.min_size=5"]),
                                             ("shards", ["data.partition.shards_per_client=2"])])
def test_disjoint_cover_and_deterministic(group, overrides):
    parts = part(group, *overrides)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(LABELS)))  # every example exactly once
    again = part(group, *overrides)
    assert all((a == b).all() for a, b in zip(parts, again))
    other = part(group, *overrides, seed=4)
    assert any(len(a) != len(b) or (a != b).any() for a, b in zip(parts, other))


@pytest.mark.parametrize("group,overrides,expected", [
    ("iid", [], "5548ffcefac9670b"),
    ("dirichlet", ["data.partition.alpha=0.3", "data.partition.min_size=5"], "dea75240fac3547c"),
    ("dirichlet_per_client", ["data.partition.alpha=0.1"], "4ab927598548859a"),
    ("shards", ["data.partition.shards_per_client=2"], "3bd9330a8e0358fc"),
])
def test_same_clients_as_before_the_config_group(group, overrides, expected):
    """Digests of the partitions the name-dispatched ``partition()`` gave for seed 3 (before partitioners became
    ``_target_`` nodes): a seed keeps naming the same client data."""
    assert digest(part(group, *overrides)) == expected


def test_dirichlet_skew_grows_as_alpha_shrinks():
    def mean_classes(alpha):
        parts = part("dirichlet", f"data.partition.alpha={alpha}", "data.partition.min_size=1", seed=0)
        return P.stats(LABELS, parts).classes_per_client.mean()

    assert mean_classes(0.05) < mean_classes(100.0)
    assert mean_classes(100.0) == 10


def test_dirichlet_min_size_respected():
    parts = part("dirichlet", "data.partition.min_size=20", seed=1)
    assert min(len(p) for p in parts) >= 20


def test_dirichlet_per_client_equal_sizes_seed004():
    parts = part("dirichlet_per_client", "data.partition.alpha=0.1", n=7, seed=0)
    assert {len(p) for p in parts} == {len(LABELS) // 7}
    # strong skew: most clients concentrate on few classes
    dominant = [np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts]
    assert np.mean(dominant) > 0.5


def test_shards_give_few_classes():
    parts = part("shards", seed=0)
    assert P.stats(LABELS, parts).classes_per_client.max() <= 2


@pytest.mark.parametrize("group,override,key", [
    ("dirichlet", "data.partition.alpha=0", "data.partition.alpha"),
    ("dirichlet_per_client", "data.partition.alpha=-1", "data.partition.alpha"),
    ("dirichlet", "data.partition.min_size=60", "data.partition.min_size"),  # impossible: 500 examples, 10 clients
    ("shards", "data.partition.shards_per_client=0", "data.partition.shards_per_client"),
    ("iid", "+data.partition.alpha=0.1", "data.partition.alpha"),            # an argument iid does not take
])
def test_bad_option_is_a_config_error_naming_the_full_key(group, override, key):
    with pytest.raises(ConfigError) as e:
        part(group, override, seed=0)
    assert e.value.key == key
    assert "\n" not in str(e.value)


def test_data_builder_uses_the_seeded_rng():
    cfg = make_cfg(["data/partition=dirichlet", "data.on_device=false"], "unused")
    data = build_federated_data(cfg.data, 16, 5, "cpu")
    labels = data.train.labels.numpy()
    expected = P.dirichlet_per_class(labels, 16, np.random.default_rng([5, 0x9A27]), alpha=0.5, min_size=8)
    assert all(np.array_equal(a.numpy(), b) for a, b in zip(data.client_indices, expected))
    assert data.info.input_shape == (1, 8, 8) and data.num_classes == 10


def test_empty_client_is_a_config_error():
    cfg = make_cfg(["data/partition=iid"], "unused")
    with pytest.raises(ConfigError) as e:
        build_federated_data(cfg.data, 5000, 0, "cpu")  # digits: 1,437 training images
    assert e.value.key == "fl.num_clients"


def test_old_style_partition_name_is_refused():
    """``data.partition.name=iid`` used to switch the partitioner; now only ``data/partition=iid`` does."""
    cfg = make_cfg(["data.partition.name=iid"], "unused")
    with pytest.raises(ConfigError, match="data/partition=iid") as e:
        build_federated_data(cfg.data, 16, 0, "cpu")
    assert e.value.key == "data.partition.name"
