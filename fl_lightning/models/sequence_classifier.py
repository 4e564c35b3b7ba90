"""SequenceClassifierModule: the LightningModule wrapper for text classification with a Hugging Face model.

Batches are ``{"input_ids", "attention_mask", "y"}`` (the text datasets' tensors); the loss is the one the Hugging
Face model computes from ``labels`` (cross-entropy), and the logits of ``validation_step`` feed torchmetrics. The
metrics are the dataset's (``DataInfo.metrics``, e.g. GLUE's per task, primary first) unless the config names
them: ``acc`` (accuracy), ``f1`` (binary F1 of class 1, GLUE's MRPC/QQP), ``mcc`` (Matthews correlation, GLUE's
CoLA). They reach ``metrics.csv`` as ``test_<name>``; ``primary_metric`` is the first.

When the network carries a ``backbone_fingerprint`` (a hash of its frozen pretrained weights, set by
:func:`~fl_lightning.models.roberta_lora.roberta_lora`), the checkpoint stores it with the tokenizer's, and a
resume onto another base model or tokenizer is refused (those tensors are frozen, so they never travel and are not
in the checkpoint themselves).
"""
from __future__ import annotations

from typing import Annotated, Callable, Mapping

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import BinaryF1Score, MulticlassAccuracy, MulticlassMatthewsCorrCoef

from ..data.info import DataInfo
from ..errors import ConfigError, ResumeError
from ..config import OneOf
from .classifier import build_net

METRICS = ("acc", "f1", "mcc")


class BaseModelFingerprint:
    """Stateful checkpoint object: the frozen backbone's and the tokenizer's fingerprints; loading refuses others."""

    def __init__(self, backbone: str, tokenizer: str):
        self.backbone, self.tokenizer = backbone, tokenizer

    def state_dict(self) -> dict[str, str]:
        return {"backbone": self.backbone, "tokenizer": self.tokenizer}

    def load_state_dict(self, state: Mapping) -> None:
        for what, mine in (("backbone", self.backbone), ("tokenizer", self.tokenizer)):
            saved = state[what]
            if saved != mine:
                raise ResumeError(f"resume: the checkpoint was trained on another {what} (fingerprint {saved} != "
                                  f"{mine} of this run's model.net.pretrained_path / tokenizer); resume with the base "
                                  "model and tokenizer it was written with")


class SequenceClassifierModule(L.LightningModule):
    """Text classifier around a Hugging Face ``*ForSequenceClassification`` network (see the module docstring)."""

    def __init__(self, net: nn.Module | Callable[[DataInfo], nn.Module], info: DataInfo,
                 metrics: Annotated[str | list[str], OneOf(*METRICS)] | None = None):
        super().__init__()
        if not info.num_classes:
            raise ConfigError("", "a sequence classifier needs a dataset with class labels (DataInfo.num_classes)",
                              "use a text classification dataset (data=glue, data=pydoc_topics)")
        names = metrics if metrics is not None else (info.metrics or ("acc",))
        names = [names] if isinstance(names, str) else list(names)
        bad = [m for m in names if m not in METRICS] or (["f1 (binary)"] if "f1" in names and info.num_classes != 2 else [])
        if bad or not names:
            raise ConfigError("metrics", f"unknown or unusable metric {bad[0] if bad else names!r} for "
                              f"{info.num_classes} classes", f"use a list of {', '.join(METRICS)} (f1 needs 2 classes)")
        self.net = build_net(net, info)
        self.num_classes = int(info.num_classes)
        self.metric_names = names
        self.primary_metric = (f"test_{names[0]}", "max")
        make = {"acc": lambda: MulticlassAccuracy(num_classes=self.num_classes, average="micro"),
                "f1": lambda: BinaryF1Score(), "mcc": lambda: MulticlassMatthewsCorrCoef(num_classes=self.num_classes)}
        self.eval_metrics = nn.ModuleDict({m: make[m]() for m in names})
        self.eval_loss = MeanMetric()
        fp = getattr(self.net, "backbone_fingerprint", None)
        tok = dict(info.provenance or ()).get("tokenizer_sha256", "")
        self._fingerprint = BaseModelFingerprint(fp, tok) if fp else None

    # evaluation metrics are torchmetrics states, summed across processes in compute(): the loop may shard the test set
    syncs_eval_metrics = True

    def checkpoint_objects(self) -> dict:
        """Extra objects the checkpoint carries (read by the loop): the base-model fingerprint."""
        return {"base_model": self._fingerprint} if self._fingerprint is not None else {}

    def forward(self, batch: dict, labels: Tensor | None = None):
        mask = batch.get("attention_mask")
        return self.net(input_ids=batch["input_ids"].long(), attention_mask=None if mask is None else mask.long(),
                        labels=labels)

    def training_step(self, batch: dict, batch_idx: int = 0) -> Tensor:
        return self(batch, labels=batch["y"]).loss

    def sampled_label_loss(self, batch: dict, generator: torch.Generator | None = None) -> Tensor:
        """Cross-entropy against ŷ ~ softmax(logits) (Sophia's Gauss–Newton–Bartlett estimator; Liu et al., ICLR
        2024, arXiv 2305.14342, Alg. 2), as :meth:`ClassifierModule.sampled_label_loss`."""
        logits = self(batch).logits
        with torch.no_grad():
            y_hat = torch.multinomial(torch.softmax(logits.detach().float(), -1), 1, generator=generator).squeeze(-1)
        return F.cross_entropy(logits, y_hat)

    @torch.no_grad()
    def validation_step(self, batch: dict, batch_idx: int = 0) -> Tensor:
        logits = self(batch).logits.float()
        loss = F.cross_entropy(logits, batch["y"], reduction="none")
        self.eval_loss.update(loss)
        pred = logits.argmax(-1)
        for m in self.eval_metrics.values():
            m.update(pred, batch["y"])
        return loss.mean()

    def compute_eval(self) -> dict[str, float]:
        """Metrics over every ``validation_step`` since the last call; resets them."""
        out = {"test_loss": float(self.eval_loss.compute())}
        out.update({f"test_{k}": float(m.compute()) for k, m in self.eval_metrics.items()})
        self.eval_loss.reset()
        for m in self.eval_metrics.values():
            m.reset()
        return out

    def configure_optimizers(self):  # pragma: no cover - strategies build the local optimizers
        raise NotImplementedError("fl_lightning strategies build optimizers; see fl_lightning/strategies/parts/local_optimizer.py")
