"""The classifier's evaluation sums without torchmetrics: the mean loss and the accuracy, with torchmetrics' arithmetic.

:class:`MeanSum` is ``torchmetrics.MeanMetric`` (NaN values dropped with a warning, then the values and a weight of
ones summed in the dtype that was torch's default when it was built: float32, float64 under ``64-true`` precision)
and :class:`AccuracySum` is ``torchmetrics.classification.MulticlassAccuracy(average="micro")`` (int64 counts of
correct and of all predictions, their float32 quotient, 0 without predictions). With several processes both sum
their states as torchmetrics syncs a ``"sum"`` state: gathered from every process in rank order, stacked, summed.
The values a run reports are therefore the same bits as before (tests/unit/models/test_eval_sums.py compares
them with torchmetrics). torchmetrics is not imported here: importing it imports all of it, and through it
transformers, matplotlib, scipy and torchvision's detection ops (with ``torch._dynamo``): most of a CNN run's
start-up (docs/benchmarks.md, W2).
"""
from __future__ import annotations

import warnings

import torch
from torch import Tensor


def _summed(t: Tensor) -> Tensor:
    """``t`` summed over the processes, as torchmetrics syncs a sum state (all_gather, stack, sum over dim 0);
    ``t`` itself in a single process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return t
    gathered = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t.contiguous())
    return torch.stack(gathered).sum(dim=0)


class MeanSum:
    """The mean of every value given to :meth:`update` since the last :meth:`reset` (``MeanMetric``)."""

    def __init__(self):
        self.dtype = torch.get_default_dtype()  # MeanMetric's state dtype: the default when it is built
        self.reset()

    def reset(self) -> None:
        self.total: Tensor | None = None
        self.weight: Tensor | None = None

    def update(self, value: Tensor) -> None:
        nans = torch.isnan(value)
        if nans.any():
            warnings.warn("Encountered `nan` values in tensor. Will be removed.", UserWarning, stacklevel=2)
            value = value[~nans]
        value = value.to(self.dtype)
        if value.numel() == 0:
            return
        if self.total is None:
            self.total = torch.zeros((), dtype=self.dtype, device=value.device)
            self.weight = torch.zeros((), dtype=self.dtype, device=value.device)
        self.total += value.sum()  # MeanMetric: (value * ones).sum(), the same bits (x * 1 == x)
        self.weight += torch.ones_like(value).sum()

    def compute(self, device: torch.device) -> Tensor:
        """The mean over every process; ``device``: where the states live when this process saw no values."""
        zero = torch.zeros((), dtype=self.dtype, device=device)
        total = _summed(zero if self.total is None else self.total)
        weight = _summed(zero if self.weight is None else self.weight)
        return total / weight


class AccuracySum:
    """The fraction of predictions equal to their targets since the last :meth:`reset` (``MulticlassAccuracy`` with
    ``average="micro"``, on class indices: the caller's ``argmax``)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.correct: Tensor | None = None
        self.count: Tensor | None = None

    def update(self, preds: Tensor, target: Tensor) -> None:
        if preds.shape != target.shape:
            raise ValueError(f"predictions of shape {tuple(preds.shape)} for targets of shape {tuple(target.shape)}")
        if self.correct is None:
            self.correct = torch.zeros((), dtype=torch.long, device=preds.device)
            self.count = torch.zeros((), dtype=torch.long, device=preds.device)
        self.correct += (preds == target).sum()
        self.count += preds.numel()

    def compute(self, device: torch.device) -> Tensor:
        zero = torch.zeros((), dtype=torch.long, device=device)
        correct = _summed(zero if self.correct is None else self.correct).float()
        count = _summed(zero if self.count is None else self.count).float()
        return torch.where(count != 0, correct / count, torch.zeros((), dtype=correct.dtype, device=correct.device))
