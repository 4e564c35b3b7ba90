"""Small convolutional nets: ``SmallCNN`` (the default model on 8x8 digits, and seed 002's two-conv CNN shape
for 32x32 inputs: conv-pool-conv-pool-fc-fc), ``LeNet5`` (seed 000's FashionMNIST model, "LeNet (Lecun et al.,
1998)" in its Sec. 7.1, layout not given: decision 000/A13 in docs/decisions.md) and an ``MLP``. The lower-case
functions are their builders (``model.net._target_``): ``fn(info, **args)``.
"""
from __future__ import annotations

import math
from typing import Annotated

from torch import nn

from ..data.info import DataInfo
from ..errors import ConfigError
from ..config import Range
from ._args import Width, Widths, image_shape, positive_ints


class SmallCNN(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, image_size: int, channels=(32, 64), hidden: int = 128):
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        side = image_size // 4
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(c2 * side * side, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class LeNet5(nn.Module):
    """conv(6,5x5,pad 2)-relu-pool-conv(16,5x5)-relu-pool-fc120-fc84-fc (LeCun et al. 1998) for 28x28 inputs;
    for other sizes the first FC adapts to the flattened feature size."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int = 28):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        side = (image_size // 2 - 4) // 2
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * side * side, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_classes)
        )

    def forward(self, x):
        return self.classifier(self.features(x))


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden=(128,)):
        super().__init__()
        layers, d = [nn.Flatten()], in_features
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def small_cnn(info: DataInfo, channels: Annotated[tuple[int, int], Range(1, 1 << 16)] = (32, 64),
              hidden: Width = 128) -> SmallCNN:
    """SmallCNN for ``info``'s images (side >= 4: two 2x2 max-pools)."""
    c, side = image_shape(info, "small_cnn", min_side=4)
    channels = positive_ints(channels, "channels", 2, "[32, 64]")
    (hidden,) = positive_ints(hidden, "hidden", 1, "128")
    return SmallCNN(c, info.num_classes, side, channels, hidden)


def lenet5(info: DataInfo) -> LeNet5:
    """LeNet-5 for ``info``'s images (side >= 12, e.g. 28x28 FashionMNIST)."""
    c, side = image_shape(info, "lenet5", min_side=12)
    return LeNet5(c, info.num_classes, side)


def mlp(info: DataInfo, hidden: Width | Widths = (128,)) -> MLP:
    """MLP on the flattened input, ReLU between ``hidden`` layers."""
    if info.input_shape is None:
        raise ConfigError("", "mlp needs the dataset's input_shape", "use a dataset whose builder reports input_shape")
    hidden = positive_ints(hidden, "hidden", None, "[128]")
    return MLP(math.prod(info.input_shape), info.num_classes, hidden)
