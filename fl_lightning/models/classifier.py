"""ClassifierModule: the LightningModule every classification model of the seeds is wrapped in.

It owns the forward pass, the loss (cross-entropy) and the evaluation metrics (torchmetrics); the federated loop
calls ``training_step`` for local steps and ``validation_step`` + ``compute_eval`` to evaluate the global model.
Optimizers are built by the federated strategy, not by ``configure_optimizers``.
"""
from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy


class ClassifierModule(L.LightningModule):
    def __init__(self, net: nn.Module, num_classes: int, input_key: str = "x"):
        super().__init__()
        self.net, self.num_classes, self.input_key = net, num_classes, input_key
        self.eval_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.eval_loss = MeanMetric()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: dict, batch_idx: int = 0) -> Tensor:
        return F.cross_entropy(self(batch[self.input_key]), batch["y"])

    @torch.no_grad()
    def validation_step(self, batch: dict, batch_idx: int = 0) -> Tensor:
        logits = self(batch[self.input_key])
        loss = F.cross_entropy(logits.float(), batch["y"], reduction="none")
        self.eval_loss.update(loss)
        self.eval_acc.update(logits.argmax(-1), batch["y"])
        return loss.mean()

    def compute_eval(self) -> dict[str, float]:
        """Metrics over every ``validation_step`` since the last call; resets them."""
        out = {"test_loss": float(self.eval_loss.compute()), "test_acc": float(self.eval_acc.compute())}
        self.eval_loss.reset()
        self.eval_acc.reset()
        return out

    def configure_optimizers(self):  # pragma: no cover - strategies build the local optimizers
        raise NotImplementedError("fl_lightning strategies build optimizers; see fl_lightning/strategies/parts/local_optimizer.py")
