"""Datasets, partitioners and the per-client view (:class:`FederatedData`).

``conf/data/<name>.yaml`` is one node. Its ``_target_`` is a dataset builder ``fn(**args) -> (train TensorSet,
test TensorSet, DataInfo)`` (``digits.digits``, ``vision.cifar10``, ...) and its keys are that builder's
arguments, except the keys of the federated view itself (:data:`FEDERATION_KEYS`): the display ``name``,
``batch_size``, ``eval_batch_size``, ``on_device``, ``val_fraction`` (:func:`hold_out`) and ``partition``, a
partitioner node (``partition.py``, chosen with ``data/partition=<name>``).
"""
from __future__ import annotations

import inspect

import numpy as np
from hydra.utils import get_method

from ..config import instantiate
from ..errors import ConfigError
from ..config import FEDERATION_KEYS, data_defaults
from .federated import FederatedData
from .info import DataInfo
from .tensors import TensorSet

DATA = data_defaults()  # the keys every dataset takes (schema.DataKeys) and their one default
PARTITION_SEED = 0x9A27  # the partition RNG is np.random.default_rng([seed, PARTITION_SEED])
VALIDATION_SEED = 0x7A1D  # the held-out validation rows: np.random.default_rng([seed, VALIDATION_SEED])

# the built-in partitioners' display names: an old-style `data.partition.name=iid` (the partitioner is chosen with
# `data/partition=iid` now) would otherwise only relabel the run
_BUILTIN_PARTITIONS = {"iid": "iid", "dirichlet": "dirichlet_per_class", "dirichlet_per_client": "dirichlet_per_client",
                       "shards": "shards", "natural": "natural"}


def _need(ok: bool, key: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(key, problem, fix)


def _unpack_sets(out, target: str) -> tuple[TensorSet, TensorSet, DataInfo]:
    sets = (out.train, out.test, out.info) if hasattr(out, "train") else tuple(out) if isinstance(out, (tuple, list)) else ()
    _need(len(sets) == 3 and isinstance(sets[0], TensorSet) and isinstance(sets[1], TensorSet)
          and isinstance(sets[2], DataInfo), "data._target_",
          f"{target} returned {type(out).__name__}, not (train TensorSet, test TensorSet, DataInfo)",
          "return (train, test, info) from the dataset builder (see fl_lightning/data/digits.py)")
    return sets


def _parameters(target: str) -> tuple[str, ...]:
    """The argument names of a ``_target_`` function (empty when it cannot be resolved here)."""
    try:
        return tuple(inspect.signature(get_method(target)).parameters)
    except Exception:  # noqa: BLE001 - instantiate reports an unresolvable target itself
        return ()


def build_federated_data(cfg_data, num_clients: int | None, seed: int, device) -> FederatedData:
    """The ``data`` node -> dataset (its ``_target_``), partition (``data.partition``), :class:`FederatedData`.

    Errors are one-line :class:`ConfigError`\\ s naming ``data.<key>`` / ``data.partition.<key>``, or
    ``fl.num_clients`` when a client is left without training data. ``num_clients=None`` (``fl.num_clients=auto``):
    as many clients as the partitioner returns (the natural partition: one per group).
    """
    bs, ebs = cfg_data.get("batch_size", DATA["batch_size"]), cfg_data.get("eval_batch_size", DATA["eval_batch_size"])
    _need(bs is not None and int(bs) >= 1, "data.batch_size", f"must be >= 1, got {bs}", "set data.batch_size=32")
    _need(ebs is not None and int(ebs) >= 1, "data.eval_batch_size", f"must be >= 1, got {ebs}", "set data.eval_batch_size=1024")
    p = cfg_data.get("partition")
    _need(p is not None and p.get("_target_") is not None, "data.partition", "no partitioner",
          "add `defaults: [{partition: dirichlet}, _self_]` to the data yaml, or pass +data/partition=iid")
    name, target = p.get("name"), str(p.get("_target_"))
    _need(name not in _BUILTIN_PARTITIONS or target == f"{__name__}.partition.{_BUILTIN_PARTITIONS[name]}",
          "data.partition.name", f"is {name!r} but data.partition._target_ is {target} (the name only labels the run)",
          f"choose the partitioner with data/partition={name}")

    train, test, info = _unpack_sets(instantiate(cfg_data, "data", drop=FEDERATION_KEYS), str(cfg_data.get("_target_")))
    train, val = hold_out(train, test.transform, float(cfg_data.get("val_fraction", DATA["val_fraction"]) or 0.0), seed)
    labels = train.labels.cpu().numpy()
    rng = np.random.default_rng([seed, PARTITION_SEED])
    extra = {}
    if "groups" in _parameters(target):  # a partitioner by natural groups (client = user) gets the dataset's groups
        group = train.tensors.get("group")
        extra["groups"] = None if group is None else group.cpu().numpy()
    _need(num_clients is not None or bool(extra), "fl.num_clients", f"auto needs a partition by natural groups, "
          f"not {target}", "use data/partition=natural, or give fl.num_clients a number")
    _need(num_clients is None or num_clients <= len(labels), "fl.num_clients",  # before a partitioner sizes arrays by it
          f"{num_clients} clients but {cfg_data.get('name') or 'the dataset'} has {len(labels)} training examples",
          f"use at most {len(labels)} clients (fl.num_clients={min(len(labels), 16)}, say)")
    parts = instantiate(p, "data.partition", labels=labels, num_clients=num_clients, rng=rng, **extra)
    count = len(parts) if isinstance(parts, (list, tuple)) else -1
    _need(not extra or count < 1 or num_clients in (None, count), "fl.num_clients",
          f"is {num_clients} but the partition by natural groups gives {count} clients", "set fl.num_clients=auto")
    _need(count >= 1 and num_clients in (None, count), "data.partition._target_",
          f"{target} returned {type(parts).__name__} of length {count if count >= 0 else '?'}, "
          f"not {num_clients} index arrays", "return one array of training-example indices per client")
    num_clients = count
    parts = [np.asarray(i, dtype=np.int64) for i in parts]
    empty = [i for i, q in enumerate(parts) if len(q) == 0]
    if empty:
        _need(False, "fl.num_clients", f"client {empty[0]} received no training data ({len(empty)} empty of "
              f"{num_clients}; {len(labels)} training examples)", _fewer_empty_clients(p, num_clients, len(labels)))
    if cfg_data.get("on_device", DATA["on_device"]):
        train, test = train.to(device), test.to(device)
        val = None if val is None else val.to(device)
    return FederatedData(train, test, info, parts, int(bs), seed, int(ebs), val=val)


def hold_out(train: TensorSet, eval_transform, fraction: float, seed: int) -> tuple[TensorSet, TensorSet | None]:
    """``data.val_fraction``: that fraction of the training pool (rounded, at least one row) held out as a validation
    set before partitioning, drawn uniformly by ``default_rng([seed, VALIDATION_SEED])``; it is evaluated like the
    test set (the test set's transform: no augmentation) and logged as ``val_*``. 0: no validation set, the
    training pool untouched (every earlier result stands)."""
    if not fraction > 0:
        return train, None
    n = len(train)
    k = max(1, int(round(fraction * n)))
    _need(k < n, "data.val_fraction", f"{fraction} of {n} training examples leaves none to train on",
          "use a smaller data.val_fraction, e.g. 0.1")
    order = np.random.default_rng([seed, VALIDATION_SEED]).permutation(n)
    return train.subset(np.sort(order[k:])), train.subset(np.sort(order[:k]), eval_transform)


def _fewer_empty_clients(p, num_clients: int, n: int) -> str:
    """The fix for clients left without data, in the chosen partitioner's own keys."""
    fixes = ["use fewer clients (fl.num_clients)"]
    if "shards_per_client" in p:
        k = max(1, n // num_clients)
        fixes[0] = f"use at most {n // int(p.shards_per_client)} clients (fl.num_clients)"
        if k < int(p.shards_per_client):
            fixes.append(f"data.partition.shards_per_client={k}")
    if "alpha" in p:
        fixes.append("a larger data.partition.alpha")
    if "min_size" in p:
        fixes.append("data.partition.min_size >= 1")
    return ", ".join(fixes[:-1]) + (" or " if len(fixes) > 1 else "") + fixes[-1]


__all__ = ["DataInfo", "FederatedData", "TensorSet", "build_federated_data", "hold_out", "FEDERATION_KEYS"]
