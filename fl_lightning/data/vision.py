"""torchvision image datasets read from a local root: CIFAR-10/100, FashionMNIST, MNIST.

Each public function is a dataset builder (``_target_`` of ``conf/data/<name>.yaml``) returning
``(train, test, DataInfo)``. Images are held as uint8 tensors; augmentation and normalization run batched (see
``augment.py``). A missing dataset is a one-line :class:`ConfigError` on ``root`` that names the directory
torchvision expects and how to fill it. Nothing is downloaded unless the run says ``download=true`` (top-level;
the old ``data.download: true`` still works with a deprecation line), once per node under a file lock.

``normalize`` (the colour sets): ``dataset`` (the dataset's own per-channel mean/std, the default), ``imagenet``
(ImageNet's, for pretrained weights such as ``model=swin_t``) or ``{mean: [...], std: [...]}`` (a paper's own
figures, e.g. seed 004's CIFAR std (0.2023, 0.1994, 0.2010)).
"""
from __future__ import annotations

import os
import re
from typing import Annotated, NamedTuple

import numpy as np
import torch

from ..errors import ConfigError
from ..config import OneOf
from .augment import ImageTransform
from .info import DataInfo
from .tensors import TensorSet

Normalize = Annotated[str | dict, OneOf("dataset", "imagenet")]  # or {mean: [..], std: [..]}


class _Spec(NamedTuple):
    cls_name: str          # torchvision.datasets class
    mean: tuple
    std: tuple
    num_classes: int
    folder: str            # what torchvision looks for under root
    augment: bool          # default: crop + flip (the seeds' CIFAR recipe)
    sizes: tuple           # (train, test) images
    shape: tuple           # one image as torchvision holds it: (H, W, C), (H, W) for grey


_CIFAR10 = _Spec("CIFAR10", (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 10, "cifar-10-batches-py", True,
                 (50_000, 10_000), (32, 32, 3))
_CIFAR100 = _Spec("CIFAR100", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 100, "cifar-100-python", True,
                  (50_000, 10_000), (32, 32, 3))
_FASHION_MNIST = _Spec("FashionMNIST", (0.2860,), (0.3530,), 10, "FashionMNIST/raw", False, (60_000, 10_000), (28, 28))
_MNIST = _Spec("MNIST", (0.1307,), (0.3081,), 10, "MNIST/raw", False, (60_000, 10_000), (28, 28))


IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def cifar10(root: str, augment: bool | None = None, normalize: Normalize = "dataset", download: bool = False,
            fake: bool = False):
    """CIFAR-10 (Krizhevsky 2009): 50,000 / 10,000 32x32 colour images, 10 classes; crop + flip by default.
    ``fake``: random pixels and labels of the same shapes and sizes (fixed seed), no files: to try an experiment's
    pipeline offline; its accuracies mean nothing."""
    return _load(_CIFAR10, root, augment, normalize, download, fake)


def cifar100(root: str, augment: bool | None = None, normalize: Normalize = "dataset", download: bool = False,
             fake: bool = False):
    """CIFAR-100 (Krizhevsky 2009): 50,000 / 10,000 32x32 colour images, 100 fine classes; crop + flip by default.
    ``fake``: as for :func:`cifar10`."""
    return _load(_CIFAR100, root, augment, normalize, download, fake)


def fake_images(n: int, shape: tuple, num_classes: int, seed: int):
    """A stand-in for an image set (``data.fake``): ``n`` random uint8 images of ``shape`` and their labels (uniform
    over ``num_classes``) from ``seed``, as a torchvision set holds them (``.data``, ``.targets``)."""
    from types import SimpleNamespace

    rng = np.random.default_rng(seed)
    return SimpleNamespace(data=rng.integers(0, 256, (n, *shape), dtype=np.uint8),
                           targets=rng.integers(0, num_classes, n).tolist())


def check_fake(fake) -> None:
    if not isinstance(fake, bool):
        raise ConfigError("fake", f"must be true or false, got {fake!r}", "leave it false (the real files)")


def fashion_mnist(root: str, augment: bool | None = None, download: bool = False, fake: bool = False):
    """Fashion-MNIST (Xiao et al. 2017): 60,000 / 10,000 28x28 grey images, 10 classes; no augmentation by default.
    ``fake``: as for :func:`cifar10`."""
    return _load(_FASHION_MNIST, root, augment, "dataset", download, fake)


def mnist(root: str, augment: bool | None = None, download: bool = False, fake: bool = False):
    """MNIST (LeCun et al. 1998): 60,000 / 10,000 28x28 grey images, 10 classes; no augmentation by default.
    ``fake``: as for :func:`cifar10`."""
    return _load(_MNIST, root, augment, "dataset", download, fake)


def mean_std(normalize, own: tuple[tuple, tuple]) -> tuple[tuple, tuple]:
    """``normalize`` (dataset | imagenet | {mean, std}) as (mean, std) tuples for ``len(own[0])`` channels."""
    c = len(own[0])
    if normalize == "dataset":
        return own
    if normalize == "imagenet" and c == 3:
        return IMAGENET_MEAN_STD
    try:
        mean, std = (tuple(float(v) for v in normalize[k]) for k in ("mean", "std"))
        ok = len(mean) == len(std) == c and all(v > 0 for v in std)
    except (TypeError, KeyError, ValueError, IndexError):
        ok = False
    if not ok:
        raise ConfigError("normalize", f"must be dataset, imagenet (3 channels) or {{mean: [{c} floats], std: [{c} "
                          f"positive floats]}}, got {normalize!r}", "use dataset (the default)")
    return mean, std


# torchvision's own advice in its miss message (its download argument, not the run's download=true): left out
_TORCHVISION_HINT = re.compile(r"\s*You can use download=True to download it\.?", re.IGNORECASE)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def check_augment(augment) -> None:
    if augment is not None and not isinstance(augment, bool):
        raise ConfigError("augment", f"must be true, false or null, got {augment!r}", "null uses the dataset's default")


def _load(spec: _Spec, root: str, augment: bool | None, normalize="dataset", download: bool = False,
          fake: bool = False):
    import torchvision.datasets as tvd

    check_augment(augment)
    if not isinstance(download, bool):
        raise ConfigError("download", f"must be true or false, got {download!r}", "leave it false (the files are read from root)")
    check_fake(fake)
    from . import hub

    download = hub.allow_fetch("data.download", download, lambda v: v is True)  # download=true, or the old key
    mean, std = mean_std(normalize, (spec.mean, spec.std))
    root = os.path.expanduser(str(root))
    cls = getattr(tvd, spec.cls_name)
    if hasattr(cls, "train_list"):  # CIFAR: check the files by presence, not by the official archive's md5
        cls = type(spec.cls_name, (cls,), {"train_list": [[f, None] for f, _ in cls.train_list],
                                           "test_list": [[f, None] for f, _ in cls.test_list],
                                           "meta": {**cls.meta, "md5": None}})
    try:
        if fake:  # no files: the pipeline end to end on random images of the real shapes and sizes
            train, test = (fake_images(n, spec.shape, spec.num_classes, seed) for seed, n in enumerate(spec.sizes))
        elif download:  # one download per node: the others wait on the lock, then read the files
            from filelock import FileLock

            from .cache import cache_root, lock_path

            final = os.path.join(cache_root(), "downloads", f"{spec.cls_name}-{os.path.abspath(root).replace(os.sep, '_')}")
            os.makedirs(os.path.dirname(lock_path(final)), exist_ok=True)
            with FileLock(lock_path(final)):
                train, test = cls(root, train=True, download=True), cls(root, train=False, download=True)
        else:
            train, test = cls(root, train=True, download=False), cls(root, train=False, download=False)
    except RuntimeError as err:  # torchvision's "Dataset not found ... You can use download=True ...": our fix only
        found = _TORCHVISION_HINT.sub("", _one_line(err)).strip().rstrip(".")
        fix = (f"add download=true to this command on a connected machine (it fetches {spec.cls_name} into "
               f"{os.path.join(root, spec.folder)}) and copy that folder here, or point data.root at the directory "
               f"that holds {spec.folder}")
        if download:  # it already said download=true: torchvision fetched, then could not read what it fetched
            fix = (f"delete {os.path.join(root, spec.folder)} and run again with download=true, or point data.root at "
                   f"the directory that holds {spec.folder}")
        raise ConfigError(
            "root", f"{spec.cls_name} not found under {root!r} (torchvision looks for "
                    f"{os.path.join(root, spec.folder)}{': ' + found if found else ''})", fix) from None
    except (OSError if download else ()) as err:  # download=true without a network (URLError is an OSError)
        raise ConfigError("download", f"could not download {spec.cls_name} into {root!r} ({_one_line(err)})",
                          "download on a connected machine and copy the folder, then run without download=true") from None
    except Exception as err:  # present but unreadable: say which files and what format is expected
        raise ConfigError(
            "root", f"could not read {spec.cls_name} from {os.path.join(root, spec.folder)} ({type(err).__name__}: {_one_line(err)})",
            "it must hold the official files (for CIFAR the python-version archive, extracted)") from None

    def to_set(ds, aug: bool) -> TensorSet:
        x = torch.as_tensor(np.asarray(ds.data))
        x = x.permute(0, 3, 1, 2).contiguous() if x.ndim == 4 else x.unsqueeze(1)  # NHWC -> NCHW; NHW -> N1HW
        y = torch.as_tensor(np.asarray(ds.targets), dtype=torch.long)
        return TensorSet({"x": x, "y": y}, ImageTransform(mean, std, aug))

    aug = spec.augment if augment is None else augment
    tr, te = to_set(train, aug), to_set(test, False)
    return tr, te, DataInfo(input_shape=tuple(tr.tensors["x"].shape[1:]), num_classes=spec.num_classes)
