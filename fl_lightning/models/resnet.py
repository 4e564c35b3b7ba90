"""ResNet-18 (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016, arXiv 1512.03385) with the
normalisations and stems of the seeds, one builder ``resnet18(info, norm=..., stem=...)``:

* ``norm: gn`` — GroupNorm(``groups``) everywhere (seed 000, Sec. 7.1, following Hsieh et al., "The Non-IID Data
  Quagmire", ICML 2020, arXiv 1910.00189; seed 002's ResNet18, whose normalisation FedSMU App. A does not state, is
  FedDyn's with GN(2), Acar et al., ICLR 2021).
* ``norm: bn`` — BatchNorm everywhere (seed 001's "ResNet-18-BN", FedPAC App. D.3; seed 003's CIFAR ResNet, whose
  variant its Sec. 7.1 does not state: the recommended default, decision 003/#13 in docs/decisions.md).
* ``norm: gn_stem_bn_blocks`` — GN(``groups``) after the stem conv, BatchNorm in the blocks and shortcuts (seed 004's
  code, ``models/resnet_bn.py::ResNet18BN``; not stated in the paper, decision 004/AMBIG-12).
* ``stem: cifar`` — 3x3 stride-1 conv, no max-pool (seeds 000, 001, 003, 004); ``stem: imagenet`` — torchvision's
  7x7 stride-2 conv + 3x3 stride-2 max-pool (seed 002's 7x7 first conv, FedSMU App. A).

BatchNorm running statistics (``running_mean``, ``running_var``) are float buffers: the federated loop sends them
with the weights and the server averages them like parameters (seed 001's code does the same, decision 001/#18);
``num_batches_tracked`` is an integer buffer and stays on the device (it is unused with BN's default momentum).
Evaluation uses the averaged statistics (``module.eval()``). PyTorch's default init. 11,220,132 parameters with the
CIFAR stem and 100 classes; 11,181,642 with the ImageNet stem and 10 classes (torchvision's ``resnet18``).
"""
from __future__ import annotations

from typing import Annotated

import torch.nn.functional as F
from torch import nn

from ..data.info import DataInfo
from ..errors import ConfigError
from ..config import OneOf, Range
from ._args import Depth, image_shape, positive_ints

NORMS = ("gn", "bn", "gn_stem_bn_blocks")
STEMS = ("cifar", "imagenet")


def _norm(kind: str, c: int, groups: int) -> nn.Module:
    return nn.GroupNorm(min(groups, c), c) if kind == "gn" else nn.BatchNorm2d(c)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int, norm: str = "gn"):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = _norm(norm, cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = _norm(norm, cout, groups)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(norm, cout, groups))

    def forward(self, x):
        out = F.relu(self.n1(self.conv1(x)))
        return F.relu(self.n2(self.conv2(out)) + self.short(x))


class ResNet18(nn.Module):
    """``stem`` -> 4 stages of 2 BasicBlocks (widths w, 2w, 4w, 8w; strides 1, 2, 2, 2) -> global average pool -> fc."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, groups: int = 2, width: int = 64,
                 norm: str = "gn", stem: str = "cifar"):
        super().__init__()
        w = width
        stem_norm, block_norm = {"gn": ("gn", "gn"), "bn": ("bn", "bn"), "gn_stem_bn_blocks": ("gn", "bn")}[norm]
        if stem == "cifar":
            self.stem = nn.Sequential(nn.Conv2d(in_channels, w, 3, 1, 1, bias=False), _norm(stem_norm, w, groups), nn.ReLU())
        else:
            self.stem = nn.Sequential(nn.Conv2d(in_channels, w, 7, 2, 3, bias=False), _norm(stem_norm, w, groups), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
        cfg, layers, cin = [(w, 1), (2 * w, 2), (4 * w, 2), (8 * w, 2)], [], w
        for cout, stride in cfg:
            layers += [BasicBlock(cin, cout, stride, groups, block_norm), BasicBlock(cout, cout, 1, groups, block_norm)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))




def resnet18(info: DataInfo, norm: Annotated[str, OneOf(*NORMS)] = "gn", stem: Annotated[str, OneOf(*STEMS)] = "cifar",
             groups: Depth = 2, width: Annotated[int, Range(1, 1 << 12)] = 64) -> ResNet18:
    """ResNet-18 for ``info``'s images; ``groups`` is the GroupNorm group count (unused with ``norm: bn``), ``width``
    the first stage's channels (64 in the papers; 8 makes a fast test model)."""
    c, _ = image_shape(info, "resnet18", square=False)
    if norm not in NORMS:
        raise ConfigError("norm", f"must be one of {', '.join(NORMS)}, got {norm!r}",
                          "use gn (seed 000), bn (seed 001) or gn_stem_bn_blocks (seed 004)")
    if stem not in STEMS:
        raise ConfigError("stem", f"must be cifar or imagenet, got {stem!r}",
                          "use cifar (3x3, no max-pool) or imagenet (7x7 stride 2 + max-pool, seed 002)")
    (groups,) = positive_ints(groups, "groups", 1, "2")
    (width,) = positive_ints(width, "width", 1, "64")
    gn_channels = {"gn": (width, 2 * width, 4 * width, 8 * width), "gn_stem_bn_blocks": (width,), "bn": ()}[norm]
    bad = [ch for ch in gn_channels if ch % min(groups, ch)]
    if bad:
        raise ConfigError("groups", f"GroupNorm({groups}) cannot split {bad[0]} channels (width={width})",
                          "use a groups value that divides width, e.g. 2")
    return ResNet18(c, info.num_classes, groups, width, norm, stem)


def resnet18_gn(info: DataInfo, groups: Depth = 2, width: Annotated[int, Range(1, 1 << 12)] = 64) -> ResNet18:
    """``resnet18`` with ``norm: gn, stem: cifar`` (the builder of ``model=resnet18_gn`` before the options)."""
    return resnet18(info, "gn", "cifar", groups, width)
