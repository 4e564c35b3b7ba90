"""The classic FedAvg CNN (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, arXiv 1602.05629, Sec. 3 "CNN"): Conv(C, 32, 5x5) -> ReLU -> MaxPool 2 -> Conv(32, 64, 5x5)
-> ReLU -> MaxPool 2 -> Linear(-> 512) -> ReLU -> Linear(512 -> classes).

``padding: 0`` (default) gives 878,538 parameters on CIFAR-10 (32x32x3: 64*5*5 features), the form used
on CIFAR; ``padding: 2`` ("same" convolutions) gives the paper's 1,663,370 on MNIST
(28x28x1: 64*7*7 features) and also fits the 8x8 digits.
"""
from __future__ import annotations

from typing import Annotated

from torch import nn

from ..data.info import DataInfo
from ..errors import ConfigError
from ..config import Range
from ._args import Width, image_shape, positive_ints


class FedAvgCNN(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, hw: tuple[int, int], padding: int = 0, hidden: int = 512):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=padding), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=padding), nn.ReLU(), nn.MaxPool2d(2),
        )
        fh, fw = (_out(_out(s, padding), padding) for s in hw)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * fh * fw, hidden), nn.ReLU(),
                                        nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def _out(side: int, padding: int) -> int:
    """Side after a 5x5 conv with ``padding`` and a 2x2 max-pool."""
    return (side + 2 * padding - 4) // 2


def cnn_fedavg(info: DataInfo, padding: Annotated[int, Range(0, 2)] = 0, hidden: Width = 512) -> FedAvgCNN:
    """McMahan et al.'s CNN for ``info``'s images; ``padding`` 0 (CIFAR count) or 2 ("same", MNIST count)."""
    c, _ = image_shape(info, "cnn_fedavg", square=False)
    if padding not in (0, 1, 2) or isinstance(padding, bool):
        raise ConfigError("padding", f"must be 0, 1 or 2, got {padding!r}", "use 0 (CIFAR-10 count) or 2 (the paper's MNIST)")
    (hidden,) = positive_ints(hidden, "hidden", 1, "512")
    h, w = info.input_shape[1:]
    if min(_out(_out(h, padding), padding), _out(_out(w, padding), padding)) < 1:
        raise ConfigError("padding", f"{padding} leaves no features of the {h}x{w} images after two conv+pool stages",
                          "use padding=2 (sides >= 4) or a dataset with sides >= 16")
    return FedAvgCNN(c, info.num_classes, (h, w), padding, hidden)
