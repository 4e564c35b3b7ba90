"""Datasets, partitioners and the per-client view (:class:`FederatedData`)."""
from __future__ import annotations

from ..errors import ConfigError
from . import partition as partition_mod
from .federated import FederatedData
from .tensors import TensorSet

DATASETS = ("digits", "cifar10", "cifar100", "fashion_mnist", "mnist")


def load_sets(cfg):
    """Return (train, test, num_classes) for ``cfg.name``."""
    name = cfg.name
    if name == "digits":
        from .digits import load_digits_sets

        return load_digits_sets()
    if name in ("cifar10", "cifar100", "fashion_mnist", "mnist"):
        from .vision import load_torchvision_sets

        return load_torchvision_sets(name, cfg.root, cfg.get("augment"))
    raise ConfigError("data.name", f"unknown dataset {name!r}", f"use one of {', '.join(DATASETS)}")


def build_federated_data(cfg_data, num_clients: int, seed: int, device) -> FederatedData:
    train, test, num_classes = load_sets(cfg_data)
    labels = train.labels.numpy()
    parts = partition_mod.partition(labels, num_clients, cfg_data.partition, seed)
    if cfg_data.get("on_device", False):
        train, test = train.to(device), test.to(device)
    return FederatedData(train, test, num_classes, parts, int(cfg_data.batch_size), seed,
                         int(cfg_data.get("eval_batch_size", 1024)))


__all__ = ["FederatedData", "TensorSet", "build_federated_data", "load_sets", "DATASETS"]
