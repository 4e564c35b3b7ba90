"""Seed 002's small CNN (FedSMU, anonymous ICLR-style submission, App. A), laid out as the FedDyn
``client_model('cifar10')`` of Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021, arXiv
2111.04263 (the paper describes it in words only):

Conv(C, f, 5x5, no padding) -> ReLU -> MaxPool 2 -> Conv(f, f, 5x5) -> ReLU -> MaxPool 2 -> Linear(f*5*5 -> 384)
-> ReLU -> Linear(384 -> 192) -> ReLU -> Linear(192 -> classes), no normalisation layers.

The paper's counts are of **weights without biases** (App. E.4): ``filters: 64`` has 797,248 for 10 classes (d1;
797,962 with biases), ``filters: 128`` ("larger CNN", Table 9) 1,723,648 (d2). Needs sides >= 16 (CIFAR: 32).
"""
from __future__ import annotations

from typing import Annotated

from torch import nn

from ..data.info import DataInfo
from ..config import Range
from ._args import Width, image_shape, positive_ints


class FedSMUCNN(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, hw: tuple[int, int], filters: int = 64,
                 hidden=(384, 192)):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, filters, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(filters, filters, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        fh, fw = ((hw[0] - 4) // 2 - 4) // 2, ((hw[1] - 4) // 2 - 4) // 2
        h1, h2 = hidden
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(filters * fh * fw, h1), nn.ReLU(), nn.Linear(h1, h2),
                                        nn.ReLU(), nn.Linear(h2, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def cnn_fedsmu(info: DataInfo, filters: Width = 64,
               hidden: Annotated[tuple[int, int], Range(1, 1 << 16)] = (384, 192)) -> FedSMUCNN:
    """Seed 002's CNN for ``info``'s images; ``filters`` 64 (the paper's main model) or 128 (Table 9's d2)."""
    c, _ = image_shape(info, "cnn_fedsmu", min_side=16, square=False)
    (filters,) = positive_ints(filters, "filters", 1, "64 (or 128, Table 9)")
    hidden = positive_ints(hidden, "hidden", 2, "[384, 192]")
    return FedSMUCNN(c, info.num_classes, tuple(info.input_shape[1:]), filters, hidden)
