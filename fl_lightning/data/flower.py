"""Flower Datasets' partitioners by name (``data/partition=flower``; the optional extra ``pip install -e ".[flower]"``):
``data.partition.partitioner`` is the class name in ``flwr_datasets.partitioner`` (``PathologicalPartitioner``,
``InnerDirichletPartitioner``, ``LinearPartitioner``, ``ExponentialPartitioner``, ``SizePartitioner``,
``SquarePartitioner``, ``DirichletPartitioner``, ``ShardPartitioner``, ``NaturalIdPartitioner``, ...) and the other
keys of ``data.partition`` are its arguments, so a split stated in Flower's terms by another paper can be matched.

The partitioner runs over a table of the dataset's training examples with the columns ``label``, ``group`` (the
dataset's ``group`` tensor, 0 where it has none) and the example's index, which comes back as the client's index
list. Filled in here, never from the config: ``num_partitions = fl.num_clients``, ``partition_by`` = ``label``
(``group`` for NaturalId / GroupedNaturalId; may be given), and ``seed`` = a number drawn from the run's partition
stream (``default_rng([seed, 0x9A27])``). Partitioners that take no seed (Iid, Linear, Exponential, Size, Square)
get the rows shuffled by that stream first; NaturalId's split does not depend on the seed. An unknown class or an
argument the class does not take is one line naming the key and the closest name.
"""
from __future__ import annotations

import difflib
import inspect
import logging
import warnings

import numpy as np

from ..errors import ConfigError

log = logging.getLogger("fl_lightning")
NATURAL = ("NaturalIdPartitioner", "GroupedNaturalIdPartitioner")  # split by the group column, seed-free
FILLED = ("num_partitions", "seed")  # set from fl.num_clients and the run's seed


def _module():
    try:
        import flwr_datasets.partitioner as module
    except ImportError:
        raise ConfigError("partitioner", "data/partition=flower needs the flwr-datasets package, which is not installed",
                          'pip install -e ".[flower]" (Python 3.11+)') from None
    return module


def classes() -> dict[str, type]:
    """The row partitioners of ``flwr_datasets.partitioner`` by class name (not the base class, not the vertical
    ones, which split columns)."""
    module = _module()
    base = module.Partitioner
    return {n: c for n, c in vars(module).items() if inspect.isclass(c) and issubclass(c, base) and c is not base
            and not n.startswith("Vertical")}


def _closest(name: str, names) -> str:
    near = difflib.get_close_matches(name, list(names), n=1, cutoff=0.4)
    return f"did you mean {near[0]}? " if near else ""


def flower(labels: np.ndarray, num_clients: int | None, rng: np.random.Generator, groups=None,
           partitioner: str = "IidPartitioner", **options) -> list[np.ndarray]:
    """The client index lists of the Flower partitioner ``partitioner`` with ``options`` (see the module docstring)."""
    known = classes()
    if partitioner not in known:
        raise ConfigError("partitioner", f"flwr_datasets.partitioner has no {partitioner!r}",
                          f"{_closest(str(partitioner), known)}(one of {', '.join(sorted(known))})")
    cls = known[partitioner]
    options = {k: v for k, v in options.items() if v is not None}  # null: not given (conf/data/partition/flower.yaml)
    params = {n: p for n, p in inspect.signature(cls.__init__).parameters.items() if n != "self"}
    for name in options:
        if name not in params or name in FILLED:
            takes = [n for n in params if n not in FILLED]
            why = (f"is set from {'fl.num_clients' if name == 'num_partitions' else 'the run seed'}, not here"
                   if name in FILLED else f"is not an argument of {partitioner}")
            raise ConfigError(name, why, f"{_closest(name, takes) if name not in FILLED else ''}remove it "
                              f"({partitioner} takes: {', '.join(takes) or 'nothing more'})")
    args = dict(options)
    natural = partitioner in NATURAL
    if "partition_by" in params:
        args.setdefault("partition_by", "group" if natural else "label")
    if "num_partitions" in params:
        if num_clients is None:
            raise ConfigError("partitioner", f"{partitioner} needs a number of clients",
                              "give fl.num_clients a number (auto is one client per group: NaturalIdPartitioner)")
        args["num_partitions"] = int(num_clients)
    seed = int(rng.integers(2**31 - 1))
    if "seed" in params:
        args["seed"] = seed
    absent = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in args]
    if absent:
        raise ConfigError(absent[0], f"is required by {partitioner}", f"set data.partition.{absent[0]}")
    n = len(labels)
    if args.get("partition_by") == "group" and groups is None:
        raise ConfigError("partition_by", "the dataset has no 'group' tensor to split by",
                          "use a dataset with natural groups (data=sentiment140) or partition_by=label")
    order = np.arange(n) if natural or "seed" in params else np.random.default_rng(seed).permutation(n)
    import datasets

    group = np.zeros(n, dtype=np.int64) if groups is None else np.asarray(groups)
    table = datasets.Dataset.from_dict({"label": np.asarray(labels)[order], "group": group[order], "index": order})
    try:
        with warnings.catch_warnings(record=True) as said:  # Flower's notes (e.g. classes left unused): one line each
            warnings.simplefilter("always")
            p = cls(**args)
            p.dataset = table
            parts = [np.sort(np.asarray(p.load_partition(i)["index"], dtype=np.int64)) for i in range(p.num_partitions)]
        for w in said:
            log.warning("%s: %s", partitioner, " ".join(str(w.message).split()))
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError("partitioner", f"{partitioner} refused the split ({type(err).__name__}: "
                          f"{' '.join(str(err).split())[:200]})", "change its arguments (data.partition.*) or "
                          "fl.num_clients") from None
    return parts
