"""Flower Datasets' partitioners by name (``data/partition=flower``, issue 62): each against its own documented
property, computed here independently; seeded from the run's seed; one-line refusals naming the closest name.
flwr-datasets is in the dev extra (Python 3.11+), so these run wherever the tests do."""
from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

from fl_lightning.config.compose import instantiate
from fl_lightning.data import PARTITION_SEED
from fl_lightning.errors import ConfigError
from tests.helpers.cli import FAST, build_loop, make_cfg
from tests.unit.data.test_partition import LABELS, part

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="flwr-datasets 0.6 needs Python 3.11+")

N = len(LABELS)  # 500 examples, 10 classes of 50


def flower(name: str, *args: str, n: int | None = 10, seed: int = 3, groups=None):
    """The partition as a run builds it (``part``), with the dataset's ``groups`` when given."""
    if groups is None:
        return part("flower", f"data.partition.partitioner={name}", *args, n=n, seed=seed)
    cfg = make_cfg(["data/partition=flower", f"data.partition.partitioner={name}", *args], "unused")
    return instantiate(cfg.data.partition, "data.partition", labels=LABELS, num_clients=n, groups=groups,
                       rng=np.random.default_rng([seed, PARTITION_SEED]))


def same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_pathological_gives_each_client_exactly_its_number_of_classes():
    parts = flower("PathologicalPartitioner", "data.partition.num_classes_per_partition=2")
    assert len(parts) == 10
    assert [len(np.unique(LABELS[p])) for p in parts] == [2] * 10
    allp = np.concatenate(parts)
    assert len(np.unique(allp)) == len(allp)  # no example on two clients
    assert same(parts, flower("PathologicalPartitioner", "data.partition.num_classes_per_partition=2"))
    assert not same(parts, flower("PathologicalPartitioner", "data.partition.num_classes_per_partition=2", seed=4))


def _id_to_size(n: int, m: int, f) -> list[int]:
    """Flower's IdToSizeFnc rule, written out: client i gets floor(n f(i+1) / sum f), the last one the rest."""
    w = np.array([f(i + 1) for i in range(m)], dtype=np.float64)
    sizes = [int(np.floor(n * x / w.sum())) for x in w]
    sizes[-1] += n - sum(sizes)
    return sizes


@pytest.mark.parametrize("name, m, f", [("LinearPartitioner", 10, lambda i: i), ("ExponentialPartitioner", 4, np.exp)])
def test_linear_and_exponential_sizes_are_in_their_ratio(name, m, f):
    parts = flower(name, n=m)
    assert [len(p) for p in parts] == _id_to_size(N, m, f)
    assert sorted(np.concatenate(parts).tolist()) == list(range(N))
    # seed-free partitioners see the rows shuffled by the run's seed: same seed same split, another seed another
    assert same(parts, flower(name, n=m)) and not same(parts, flower(name, n=m, seed=4))


def test_natural_id_gives_one_client_per_group_whatever_the_seed():
    groups = np.arange(N) % 7
    parts = flower("NaturalIdPartitioner", n=None, groups=groups)
    want = sorted(tuple(np.flatnonzero(groups == g)) for g in range(7))
    assert sorted(tuple(p) for p in parts) == want
    assert same(parts, flower("NaturalIdPartitioner", n=None, groups=groups, seed=99))


def test_inner_dirichlet_gives_the_sizes_asked_for():
    args = ("data.partition.partition_sizes=[100,150,250]", "data.partition.alpha=0.5")
    parts = flower("InnerDirichletPartitioner", *args, n=3)
    assert [len(p) for p in parts] == [100, 150, 250]
    assert len(np.unique(np.concatenate(parts))) == N
    assert same(parts, flower("InnerDirichletPartitioner", *args, n=3))
    assert not same(parts, flower("InnerDirichletPartitioner", *args, n=3, seed=4))


@pytest.mark.parametrize("args, key, needle", [
    (["data.partition.partitioner=PathologicPartitioner"], "data.partition.partitioner",
     "has no 'PathologicPartitioner'; fix: did you mean PathologicalPartitioner?"),
    (["data.partition.partitioner=PathologicalPartitioner", "+data.partition.num_class_per_partition=2"],
     "data.partition.num_class_per_partition", "did you mean data.partition.num_classes_per_partition?"),
    (["data.partition.partitioner=LinearPartitioner", "data.partition.alpha=0.5"], "data.partition.alpha",
     "is not an argument of LinearPartitioner"),
    (["data.partition.partitioner=PathologicalPartitioner"], "data.partition.num_classes_per_partition",
     "is required by PathologicalPartitioner"),
    (["data.partition.partitioner=IidPartitioner", "+data.partition.num_partitions=3"], "data.partition.num_partitions",
     "is set from fl.num_clients"),
])
def test_refusals_are_one_line_naming_the_key_and_the_closest_name(args, key, needle):
    with pytest.raises(ConfigError) as err:
        part("flower", *args)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"config error: {key}:") and needle in msg, msg


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["data.partition.partitioner=PathologicalPartitioner", "data.partition.num_classes_per_partition=3"],
    ["data.partition.partitioner=LinearPartitioner"],
    ["data.partition.partitioner=DirichletPartitioner", "data.partition.alpha=0.5", "data.partition.min_partition_size=5"],
])
def test_a_run_with_a_flower_partition(tmp_path, args):
    loop = build_loop([*FAST, "fl.rounds=1", "data/partition=flower", *args], tmp_path)
    sizes = [loop.data.num_samples(c) for c in range(loop.data.num_clients)]
    assert loop.data.num_clients == 6 and min(sizes) > 0
    loop.run(progress_enabled=False)


def test_without_the_package_the_group_says_so_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr_datasets.partitioner", None)  # import fails as if not installed
    with pytest.raises(ConfigError) as err:
        flower("IidPartitioner")
    msg = str(err.value)
    assert "\n" not in msg and "needs the flwr-datasets package" in msg and 'pip install -e ".[flower]"' in msg


def _split(partitioner: str, n: int, **args):
    from fl_lightning.data.flower import flower as split

    return split(LABELS, n, np.random.default_rng(0), partitioner=partitioner, **args)


def test_a_partitioners_note_names_this_configs_key_not_flowers_old_argument(caplog):
    """Issue 65 item 7: PathologicalPartitioner's note on unused classes advises Flower's old argument
    ``first_class_deterministic_assignment=True``; the log line names ``data.partition.class_assignment_mode``, and
    says nothing of it where the config already sets it."""
    caplog.set_level("WARNING", logger="fl_lightning")
    _split("PathologicalPartitioner", 4, num_classes_per_partition=2, class_assignment_mode="deterministic")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("PathologicalPartitioner: Classes: [5, 6, 7, 8, 9] will NOT be used")
    assert "first_class_deterministic_assignment" not in lines[0]
    assert "consider setting data.partition.class_assignment_mode=first-deterministic" in lines[0]
    caplog.clear()
    _split("PathologicalPartitioner", 2, num_classes_per_partition=2, class_assignment_mode="first-deterministic")
    lines = [r.getMessage() for r in caplog.records]  # 10 classes, 2 x 2 used: unused still, and nothing to advise
    assert len(lines) == 1 and lines[0].endswith("will NOT be used due to the chosen configuration."), lines


def test_library_deprecations_are_no_partitioner_notes(caplog, monkeypatch):
    """Issue 65 item 7: a DeprecationWarning or FutureWarning raised inside a split (pyarrow's ``null_placement``
    under ShardPartitioner) is no line of the run's log: it goes back to Python's warnings; a partitioner's own
    warning is still one line."""
    from flwr_datasets.partitioner import IidPartitioner

    import fl_lightning.data.flower as fw

    class Noisy(IidPartitioner):
        def load_partition(self, partition_id):
            warnings.warn("old_sort is deprecated", FutureWarning)
            warnings.warn("old_api is deprecated", DeprecationWarning)
            if partition_id == 0:
                warnings.warn("partition 0 is small")
            return super().load_partition(partition_id)

    monkeypatch.setattr(fw, "classes", lambda: {"Noisy": Noisy})
    caplog.set_level("WARNING", logger="fl_lightning")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        parts = _split("Noisy", 3)
    assert sorted(np.concatenate(parts).tolist()) == list(range(N))
    assert [r.getMessage() for r in caplog.records] == ["Noisy: partition 0 is small"]
    assert {(w.category, str(w.message)) for w in shown} >= {(FutureWarning, "old_sort is deprecated"),
                                                              (DeprecationWarning, "old_api is deprecated")}
    caplog.clear()
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _split("ShardPartitioner", 4, num_shards_per_partition=2, shard_size=10)  # pyarrow >= 25: null_placement
    assert not [r for r in caplog.records if "null_placement" in r.getMessage()]
