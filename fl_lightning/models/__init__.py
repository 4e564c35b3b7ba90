"""Models: a wrapper module around a network, both chosen by the model config.

``conf/model/<name>.yaml`` is one node: its ``_target_`` is the wrapper (``ClassifierModule`` for the image
models and the RNNs; ``SequenceClassifierModule`` for Hugging Face text classifiers; ``CausalLMModule`` for language
models, LLaMA; ``matrix_quadratic.MatrixQuadraticModule``, the bare matrix of seed 003's synthetic testbed, with no
``net``) and ``net`` is a network builder
``fn(info, **args) -> nn.Module`` with ``_partial_: true`` (``cnn.small_cnn``, ``resnet.resnet18``,
``vit.vit_tiny``, ...), which the wrapper calls with the dataset's :class:`~fl_lightning.data.info.DataInfo`. A wrapper provides
``training_step(batch)``, ``validation_step(batch)``, ``compute_eval() -> dict`` and
``primary_metric = (key of compute_eval, "max" | "min")``.
"""
from __future__ import annotations

import importlib

from ..config import instantiate
from ..data.info import DataInfo
from ..errors import ConfigError
from .classifier import ClassifierModule, build_net

WRAPPER_API = ("training_step", "validation_step", "compute_eval", "primary_metric")

# imported when first asked for: these wrappers are LightningModules with torchmetrics metrics, and importing
# lightning.pytorch and torchmetrics loads transformers, matplotlib and scipy (seconds of every run's start-up)
_LAZY = {"CausalLMModule": ".causal_lm", "SequenceClassifierModule": ".sequence_classifier"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_model(cfg_model, info: DataInfo):
    """Instantiate the ``model`` node with ``info``; errors name ``model.<key>`` (e.g. ``model.net.channels``)."""
    module = instantiate(cfg_model, "model", info=info)
    target = cfg_model.get("_target_")
    missing = [a for a in WRAPPER_API if not hasattr(module, a)]
    if missing:
        raise ConfigError("model._target_", f"{target} returned {type(module).__name__}, which has no {', '.join(missing)}",
                          "return a model wrapper such as fl_lightning.models.ClassifierModule (docs/extending.md)")
    pm = module.primary_metric
    if not (isinstance(pm, tuple) and len(pm) == 2 and isinstance(pm[0], str) and pm[1] in ("max", "min")):
        raise ConfigError("model._target_", f"{type(module).__name__}.primary_metric is {pm!r}",
                          "declare primary_metric = (metric key of compute_eval(), 'max' or 'min')")
    return module


__all__ = ["CausalLMModule", "ClassifierModule", "DataInfo", "SequenceClassifierModule", "build_model", "build_net"]
