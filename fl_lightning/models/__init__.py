"""Models: LightningModules wrapping the networks the seeds train. ``build_model(cfg, data)`` picks by name."""
from __future__ import annotations

from ..errors import ConfigError
from .classifier import ClassifierModule

MODELS = ("cnn", "lenet5", "mlp", "resnet18_gn")


def build_model(cfg, in_shape: tuple[int, ...], num_classes: int) -> ClassifierModule:
    name = cfg.name
    c, h = in_shape[0], in_shape[-1]
    if name == "cnn":
        from .cnn import SmallCNN

        net = SmallCNN(c, num_classes, h, tuple(cfg.get("channels", (32, 64))), int(cfg.get("hidden", 128)))
    elif name == "lenet5":
        from .cnn import LeNet5

        net = LeNet5(c, num_classes, h)
    elif name == "mlp":
        from .cnn import MLP

        d = 1
        for s in in_shape:
            d *= s
        net = MLP(d, num_classes, tuple(cfg.get("hidden", (128,))))
    elif name == "resnet18_gn":
        from .resnet_gn import ResNet18GN

        net = ResNet18GN(c, num_classes, int(cfg.get("groups", 2)), int(cfg.get("width", 64)))
    else:
        raise ConfigError("model.name", f"unknown model {name!r}", f"use one of {', '.join(MODELS)}")
    return ClassifierModule(net, num_classes)
