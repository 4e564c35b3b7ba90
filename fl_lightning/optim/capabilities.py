"""What parts ask of a local optimizer or a model beyond ``torch.optim.Optimizer`` / ``nn.Module``, as named
protocols (checked with ``isinstance``, each in one place), instead of attribute probes spread over the parts."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from torch import Generator, Tensor


@runtime_checkable
class TakesHessianEstimates(Protocol):
    """An optimizer with a curvature EMA fed from outside (Sophia: ``update_hessian({param: ĥ})``), what
    ``SophiaHessian`` feeds."""

    def update_hessian(self, estimates: Mapping[Tensor, Tensor]) -> None: ...


@runtime_checkable
class StepsAlongDirection(Protocol):
    """An optimizer that takes a step along a given direction without touching its momentum (Muon:
    ``apply_direction(p, d)`` and its ``momentum_buffer(p)``), what ``MuonStepOrder`` uses."""

    def apply_direction(self, p: Tensor, d: Tensor) -> None: ...

    def momentum_buffer(self, p: Tensor) -> Tensor: ...


@runtime_checkable
class SampledLabelLoss(Protocol):
    """A model with the loss against labels drawn from its own softmax (``ClassifierModule.sampled_label_loss``),
    what Sophia's Gauss–Newton–Bartlett estimator differentiates."""

    def sampled_label_loss(self, batch: dict, generator: Generator | None = None) -> Tensor: ...
