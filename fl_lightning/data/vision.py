"""torchvision image datasets read from a local root (no download): CIFAR-10/100, FashionMNIST, MNIST.

Images are held as uint8 tensors; augmentation and normalization run batched (see ``augment.py``).
A missing dataset raises a :class:`DataError` that names the directory torchvision expects and how to fill it.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from ..errors import DataError
from .augment import ImageTransform
from .tensors import TensorSet

# name -> (torchvision class, mean, std, num_classes, folder torchvision looks for, augment)
_SPECS = {
    "cifar10": ("CIFAR10", (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 10, "cifar-10-batches-py", True),
    "cifar100": ("CIFAR100", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 100, "cifar-100-python", True),
    "fashion_mnist": ("FashionMNIST", (0.2860,), (0.3530,), 10, "FashionMNIST/raw", False),
    "mnist": ("MNIST", (0.1307,), (0.3081,), 10, "MNIST/raw", False),
}


def load_torchvision_sets(name: str, root: str, augment: bool | None = None) -> tuple[TensorSet, TensorSet, int]:
    import torchvision.datasets as tvd

    cls_name, mean, std, num_classes, folder, default_aug = _SPECS[name]
    root = os.path.expanduser(str(root))
    cls = getattr(tvd, cls_name)
    if hasattr(cls, "train_list"):  # CIFAR: check the files by presence, not by the official archive's md5
        cls = type(cls_name, (cls,), {"train_list": [[f, None] for f, _ in cls.train_list],
                                      "test_list": [[f, None] for f, _ in cls.test_list],
                                      "meta": {**cls.meta, "md5": None}})
    try:
        train, test = cls(root, train=True, download=False), cls(root, train=False, download=False)
    except RuntimeError as err:
        raise DataError(
            f"data.root: {cls_name} not found under {root!r} (torchvision looks for {os.path.join(root, folder)}); "
            f"download it on a connected machine with torchvision.datasets.{cls_name}(root, download=True) and copy "
            f"the folder there, or set data.root=<dir> ({err})"
        ) from None
    except Exception as err:  # present but unreadable: say which files and what format is expected
        raise DataError(
            f"data.root: could not read {cls_name} from {os.path.join(root, folder)} ({type(err).__name__}: {err}); "
            f"it must hold the official files (for CIFAR the python-version archive, extracted)"
        ) from None

    def to_set(ds, aug: bool) -> TensorSet:
        x = torch.as_tensor(np.asarray(ds.data))
        x = x.permute(0, 3, 1, 2).contiguous() if x.ndim == 4 else x.unsqueeze(1)  # NHWC -> NCHW; NHW -> N1HW
        y = torch.as_tensor(np.asarray(ds.targets), dtype=torch.long)
        return TensorSet({"x": x, "y": y}, ImageTransform(mean, std, aug))

    aug = default_aug if augment is None else augment
    return to_set(train, aug), to_set(test, False), num_classes
