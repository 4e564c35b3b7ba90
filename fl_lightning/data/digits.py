"""scikit-learn's handwritten digits (Alpaydin & Kaynak 1998): 1,797 8x8 grey images, 10 classes.

It ships inside scikit-learn, so ``python train.py`` runs with no download. A fixed stratified split
(seed 0, independent of the run seed) keeps ``test_size`` (360) images as the global test set.
"""
from __future__ import annotations

from typing import Annotated

import numpy as np
import torch

from ..config import Range
from .info import DataInfo
from .tensors import TensorSet

_TOTAL = 1797


# test_size: stratified, so at least one example of each class on both sides
def digits(test_size: Annotated[int, Range(10, _TOTAL - 10)] = 360) -> tuple[TensorSet, TensorSet, DataInfo]:
    """(train, test, info) for the digits; images scaled from [0, 16] to [-1, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0 - 0.5) / 0.5  # [0,16] -> [-1, 1]
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=int(test_size), random_state=0, stratify=y)

    def mk(a, b):
        return TensorSet({"x": torch.from_numpy(a).unsqueeze(1), "y": torch.from_numpy(b)})

    return mk(x_tr, y_tr), mk(x_te, y_te), DataInfo(input_shape=(1, 8, 8), num_classes=10)
