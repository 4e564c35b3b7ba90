"""Tiny-ImageNet (Le & Yang, "Tiny ImageNet Visual Recognition Challenge", Stanford CS231N 2015): 200 classes of
64x64 colour images, 500 training images per class; the labelled validation split (50 per class, 10,000) is the test
set, as seeds 001 and 004 use it (the official test labels are not public: FedPAC App. D.1, Table 7; seed 004's
code tests on val; decision 001/#23 in docs/decisions.md).

Read from the standard folder layout of ``tiny-imagenet-200.zip``, unzipped under ``root``::

    <root>/tiny-imagenet-200/wnids.txt                       class ids, one per line (label = line number)
    <root>/tiny-imagenet-200/train/<wnid>/images/*.JPEG
    <root>/tiny-imagenet-200/val/val_annotations.txt         "<file>\\t<wnid>\\t..." per line
    <root>/tiny-imagenet-200/val/images/<file>

(``root`` may also be the ``tiny-imagenet-200`` folder itself). Images are decoded once into uint8 tensors (grey
images converted to RGB). Training batches get the authors' RandomCrop(64, padding 4) + horizontal flip; both splits
are normalised with the Tiny-ImageNet statistics of seed 004's code, mean (0.4802, 0.4481, 0.3975), std (0.2302,
0.2265, 0.2262) (their test transform used CIFAR's statistics and a random crop, a quirk not copied:
decision 004/AMBIG-21). A missing file is a one-line error naming the file and where it goes. No download.
``fake``: no files, random pixels and labels of the real shapes and sizes (100,000 / 10,000 images of
``image_size``², 200 classes; fixed seeds, as :func:`~fl_lightning.data.vision.cifar10`'s), to try a pipeline offline.
"""
from __future__ import annotations

import os
from typing import Annotated

import numpy as np
import torch

from ..errors import ConfigError
from ..config import Range
from .augment import ImageTransform
from .info import DataInfo
from .tensors import TensorSet
from .vision import Normalize, check_augment, check_fake, fake_images, mean_std

FOLDER = "tiny-imagenet-200"
MEAN_STD = ((0.4802, 0.4481, 0.3975), (0.2302, 0.2265, 0.2262))
_FIX = "download tiny-imagenet-200.zip (cs231n.stanford.edu) on a connected machine and unzip it under data.root"


def _need(path: str, what: str) -> str:
    if not os.path.exists(path):
        raise ConfigError("root", f"Tiny-ImageNet {what} not found: {path}", _FIX)
    return path


def _read_images(paths: list[str], size: int) -> np.ndarray:
    from PIL import Image

    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    for i, p in enumerate(paths):
        try:
            with Image.open(p) as im:
                a = np.asarray(im.convert("RGB"))
        except Exception as err:  # noqa: BLE001 - an unreadable image is the user's to fix
            raise ConfigError("root", f"cannot read Tiny-ImageNet image {p} ({type(err).__name__}: {err})",
                              "re-extract the official archive") from None
        if a.shape != (size, size, 3):
            raise ConfigError("root", f"Tiny-ImageNet image {p} is {a.shape[1]}x{a.shape[0]}, not {size}x{size}",
                              "use the official 64x64 images (or image_size for a resized copy)")
        out[i] = a
    return out


def tiny_imagenet(root: str, augment: bool | None = None, normalize: Normalize = "dataset",
                  image_size: Annotated[int, Range(1, 1 << 12)] = 64, fake: bool = False):
    """(train, test, info) from the folder layout above; ``image_size`` is the side every image must have (64);
    ``fake``: see the module docstring."""
    check_augment(augment)
    check_fake(fake)
    mean, std = mean_std(normalize, MEAN_STD)
    size = int(image_size)
    aug = True if augment is None else augment

    def to_set(x: np.ndarray, labels, a: bool) -> TensorSet:
        x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
        return TensorSet({"x": x, "y": torch.tensor(labels, dtype=torch.long)}, ImageTransform(mean, std, a))

    if fake:
        train, test = (fake_images(n, (size, size, 3), 200, seed) for seed, n in enumerate((100_000, 10_000)))
        return (to_set(train.data, train.targets, aug), to_set(test.data, test.targets, False),
                DataInfo(input_shape=(3, size, size), num_classes=200))
    base = os.path.expanduser(str(root))
    if not os.path.isfile(os.path.join(base, "wnids.txt")):
        base = os.path.join(base, FOLDER)
    with open(_need(os.path.join(base, "wnids.txt"), "class list"), encoding="utf-8") as f:
        wnids = [w.strip() for w in f if w.strip()]
    if not wnids:
        raise ConfigError("root", f"{os.path.join(base, 'wnids.txt')} lists no classes", _FIX)
    label = {w: i for i, w in enumerate(wnids)}

    tr_paths, tr_labels = [], []
    for w in wnids:
        d = _need(os.path.join(base, "train", w, "images"), f"training folder of class {w}")
        files = sorted(f for f in os.listdir(d) if f.lower().endswith((".jpeg", ".jpg", ".png")))
        tr_paths += [os.path.join(d, f) for f in files]
        tr_labels += [label[w]] * len(files)

    ann = _need(os.path.join(base, "val", "val_annotations.txt"), "validation labels (used as the test split)")
    te_paths, te_labels = [], []
    with open(ann, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 2 or cols[1] not in label:
                raise ConfigError("root", f"{ann} line {n}: expected '<file>\\t<wnid>' with a wnid of wnids.txt, "
                                  f"got {line.strip()[:80]!r}", "use the official val_annotations.txt")
            te_paths.append(_need(os.path.join(base, "val", "images", cols[0]), "validation image"))
            te_labels.append(label[cols[1]])
    if not tr_paths or not te_paths:
        raise ConfigError("root", f"no {'training' if not tr_paths else 'validation'} images under {base}", _FIX)
    return (to_set(_read_images(tr_paths, size), tr_labels, aug), to_set(_read_images(te_paths, size), te_labels, False),
            DataInfo(input_shape=(3, size, size), num_classes=len(wnids)))
