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
argument the class does not take is one line naming the key and the closest name, refused with the config's other
checks before anything is built. The arguments a config can give are the scalar and list ones (:data:`OPTIONS`);
``DistributionPartitioner``'s array and ``IdToSizeFncPartitioner``'s function are not expressible in a config.

A partitioner's notes (its warnings, e.g. classes left unused) are one log line each, in this config's words (an
argument Flower renamed is named as ``data.partition.*`` takes it: :func:`note`); the libraries' deprecation warnings
(``DeprecationWarning``, ``FutureWarning``: pyarrow's ``null_placement``) are no note: they go back to Python's
warnings, whose filters show or hide them as any library's, and stay out of the run's log.
"""
from __future__ import annotations

import difflib
import inspect
import logging
import re
import warnings
from typing import Annotated, Optional

import numpy as np

from ..config import Range, Validate
from ..errors import ConfigError

log = logging.getLogger("fl_lightning")
NATURAL = ("NaturalIdPartitioner", "GroupedNaturalIdPartitioner")  # split by the group column, seed-free
FILLED = ("num_partitions", "seed")  # set from fl.num_clients and the run's seed
# the partitioners' arguments a config can state (conf/data/partition/flower.yaml; null: not given)
OPTIONS = ("partition_by", "alpha", "min_partition_size", "self_balancing", "num_classes_per_partition",
           "class_assignment_mode", "partition_sizes", "num_shards_per_partition", "shard_size",
           "keep_incomplete_shard", "strictness", "group_size", "mode", "sort_unique_ids", "shuffle")


# Flower's words in its notes -> this config's: (pattern, the key and value that do it here). flwr-datasets 0.6's
# PathologicalPartitioner still advises its old argument first_class_deterministic_assignment=True
RENAMED = ((re.compile(r"'?first_class_deterministic_assignment\s*=\s*True'?"),
            "data.partition.class_assignment_mode=first-deterministic"),)
# the advice of a note, dropped where the config already follows it
_ADVICE = re.compile(r"\s*If it is undesired behavior consider setting\s+(\S+)\s+which.*$", re.S)
# library deprecations: handed back to Python's warnings, never a partitioner's note
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
_registry: dict = {}  # warn_explicit's per-location record: under Python's "default" action, once per split


def note(message: str, given: dict) -> str:
    """A partitioner's note on one line, in this config's words: Flower's old argument names replaced by the
    ``data.partition`` key that does the same, and advice to set what ``given`` (the arguments passed) already sets
    left out."""
    text = " ".join(str(message).split())
    for pattern, ours in RENAMED:
        text = pattern.sub(ours, text)
    advice = _ADVICE.search(text)
    if advice and "=" in advice.group(1):
        key, _, value = advice.group(1).rpartition(".")[2].partition("=")
        if str(given.get(key)) == value:
            text = text[:advice.start()]
    return text


def _relay(said: list, partitioner: str, given: dict) -> None:
    """The warnings caught while ``partitioner`` split the data: its notes one log line each, the libraries'
    deprecations back to Python's warnings (their filters decide; not the run's log)."""
    for w in said:
        if issubclass(w.category, DEPRECATIONS):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, registry=_registry)
        else:
            log.warning("%s: %s", partitioner, note(str(w.message), given))


def _module():
    try:
        import flwr_datasets.partitioner as module
    except ImportError:
        raise ConfigError("partitioner", "data/partition=flower needs the flwr-datasets package, which is not installed",
                          'pip install -e ".[flower]" (Python 3.11+)') from None
    return module


def installed() -> bool:
    try:
        _module()
    except ConfigError:
        return False
    return True


def classes() -> dict[str, type]:
    """The row partitioners of ``flwr_datasets.partitioner`` by class name (not the base class, not the vertical
    ones, which split columns)."""
    module = _module()
    base = module.Partitioner
    return {n: c for n, c in vars(module).items() if inspect.isclass(c) and issubclass(c, base) and c is not base
            and not n.startswith("Vertical")}


def takes(partitioner: str) -> list[str]:
    """The arguments of a partitioner class a config may set (not those filled in here)."""
    params = inspect.signature(classes()[partitioner].__init__).parameters
    return [n for n in params if n != "self" and n not in FILLED]


def _closest(name: str, names) -> str:
    near = difflib.get_close_matches(str(name), list(names), n=1, cutoff=0.4)
    return f"did you mean {near[0]}? " if near else ""


class _Said(str):
    """A :class:`~fl_lightning.config.Validate` message computed from the values (the closest name), where a fixed
    template cannot say it: ``format(**values)`` calls ``fn``."""

    def __new__(cls, fn):
        obj = super().__new__(cls, fn.__name__)
        obj.fn = fn
        return obj

    def format(self, *args, **values):  # noqa: A003 - str.format's name, called by the config checks
        return self.fn(**values)


def _unset(num_partitions) -> bool:
    return num_partitions is None


def _unset_seed(seed) -> bool:
    return seed is None


def _known(partitioner) -> bool:
    return installed() and partitioner in classes()


def _unknown(partitioner) -> str:
    if not installed():
        return "data/partition=flower needs the flwr-datasets package, which is not installed"
    return f"flwr_datasets.partitioner has no {partitioner!r}"


def _unknown_fix(partitioner) -> str:
    if not installed():
        return 'pip install -e ".[flower]" (Python 3.11+)'
    known = classes()
    return f"{_closest(partitioner, known)}(one of {', '.join(sorted(known))})"


def _taken(option: str, choices: tuple[str, ...] = ()) -> Validate:
    """The rule on ``option``: set (not null) only for a partitioner that takes it (and to one of ``choices``);
    refused naming the option and the closest argument the partitioner takes."""
    def ok(partitioner, value) -> str | None:
        if value is None or value == "null" or not _known(partitioner):
            return None
        if option not in takes(partitioner):
            return "absent"
        return "choice" if choices and value not in choices else None

    def rule(partitioner, **value) -> bool:
        return ok(partitioner, value[option]) is None

    def problem(partitioner, **value) -> str:
        if ok(partitioner, value[option]) == "choice":
            return f"unknown value {value[option]!r} for {partitioner}"
        return f"is not an argument of {partitioner}"

    def fix(partitioner, **value) -> str:
        if ok(partitioner, value[option]) == "choice":
            return f"use one of {', '.join(choices)}, or null"
        args = takes(partitioner)
        return (f"{_closest(option, args)}remove it or set it to null ({partitioner} takes: "
                f"{', '.join(args) or 'nothing more'})")

    # the config checks call the rule with the arguments its signature names: partitioner and this option
    rule.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                            for n in ("partitioner", option)])
    rule.__name__ = f"takes_{option}"
    return Validate(rule, _Said(problem), _Said(fix))


def _opt(low=None, high=None, open_low=False) -> Range:
    """An option's range; ``null`` is the word a fix suggests (not given: the class's default)."""
    return Range(low, high, open_low=open_low, words=("null",))


def flower(labels: np.ndarray, num_clients: int | None, rng: np.random.Generator, groups=None,
           partitioner: Annotated[str, Validate(_known, _Said(_unknown), _Said(_unknown_fix))] = "IidPartitioner",
           partition_by: Annotated[Optional[str], _opt(), _taken("partition_by", ("label", "group"))] = None,
           alpha: Annotated[Optional[float], _opt(0.0, 1e6, open_low=True), _taken("alpha")] = None,
           min_partition_size: Annotated[Optional[int], _opt(0, 10**9), _taken("min_partition_size")] = None,
           self_balancing: Annotated[Optional[bool], _opt(), _taken("self_balancing")] = None,
           num_classes_per_partition: Annotated[Optional[int], _opt(1, 10**6), _taken("num_classes_per_partition")] = None,
           class_assignment_mode: Annotated[Optional[str], _opt(), _taken(
               "class_assignment_mode", ("random", "deterministic", "first-deterministic"))] = None,
           partition_sizes: Annotated[Optional[list[int]], _opt(0, 10**9), _taken("partition_sizes")] = None,
           num_shards_per_partition: Annotated[Optional[int], _opt(1, 10**6), _taken("num_shards_per_partition")] = None,
           shard_size: Annotated[Optional[int], _opt(1, 10**9), _taken("shard_size")] = None,
           keep_incomplete_shard: Annotated[Optional[bool], _opt(), _taken("keep_incomplete_shard")] = None,
           strictness: Annotated[Optional[float], _opt(0.0, 1.0), _taken("strictness")] = None,
           group_size: Annotated[Optional[int], _opt(1, 10**9), _taken("group_size")] = None,
           mode: Annotated[Optional[str], _opt(), _taken(
               "mode", ("allow-smaller", "allow-bigger", "drop-reminder", "strict"))] = None,
           sort_unique_ids: Annotated[Optional[bool], _opt(), _taken("sort_unique_ids")] = None,
           shuffle: Annotated[Optional[bool], _opt(), _taken("shuffle")] = None,
           num_partitions: Annotated[Optional[int], Validate(_unset, "is set from fl.num_clients, not here",
                                                             "remove it and set fl.num_clients")] = None,
           seed: Annotated[Optional[int], Validate(_unset_seed, "is drawn from the run's seed, not set here",
                                                   "remove it and set the top-level seed")] = None) -> list[np.ndarray]:
    """The client index lists of the Flower partitioner ``partitioner`` with the arguments given (not null; see the
    module docstring)."""
    if not _known(partitioner):
        raise ConfigError("partitioner", _unknown(partitioner), _unknown_fix(partitioner))
    cls = classes()[partitioner]
    given = {k: v for k, v in locals().items() if k in OPTIONS}
    options = {k: v for k, v in given.items() if v is not None and v != "null"}  # null: not given (the yaml's)
    params = {n: p for n, p in inspect.signature(cls.__init__).parameters.items() if n != "self"}
    for name in options:  # checked with the config already; again for a direct call
        if name not in params:
            v = _taken(name)
            raise ConfigError(name, v.problem.format(partitioner=partitioner, **{name: options[name]}),
                              v.fix.format(partitioner=partitioner, **{name: options[name]}))
    args = dict(options)
    natural = partitioner in NATURAL
    if "partition_by" in params:
        args.setdefault("partition_by", "group" if natural else "label")
    if "num_partitions" in params:
        if num_clients is None:
            raise ConfigError("partitioner", f"{partitioner} needs a number of clients",
                              "give fl.num_clients a number (auto is one client per group: NaturalIdPartitioner)")
        args["num_partitions"] = int(num_clients)
    seed = int(rng.integers(2**31 - 1))  # the run's partition stream, never a config value
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
        _relay(said, partitioner, args)
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError("partitioner", f"{partitioner} refused the split ({type(err).__name__}: "
                          f"{' '.join(str(err).split())[:200]})", "change its arguments (data.partition.*) or "
                          "fl.num_clients") from None
    return parts
