"""ClassifierModule: the model wrapper for classification (every model of the seeds).

It owns the forward pass, the loss (cross-entropy) and the evaluation metrics (the mean test loss and the accuracy,
:mod:`.eval_sums`: torchmetrics' arithmetic without importing torchmetrics); the federated loop calls
``training_step`` for local steps and ``validation_step`` + ``compute_eval`` to evaluate the global model, and reads
``primary_metric`` to know which metric is "the" result. Optimizers are built by the federated strategy, not by
``configure_optimizers``. It is a plain ``torch.nn.Module`` with the LightningModule's step methods: the loop needs
nothing more from it (Fabric runs it as it is), and a LightningModule base would import ``lightning.pytorch``, and
through it torchmetrics, transformers and matplotlib, into every run (seconds of start-up; docs/benchmarks.md, W2).
"""
from __future__ import annotations

from typing import Annotated, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.info import DataInfo
from ..errors import ConfigError
from ..config import OneOf
from .eval_sums import AccuracySum, MeanSum


def build_net(net: nn.Module | Callable[[DataInfo], nn.Module], info: DataInfo, key: str = "net") -> nn.Module:
    """``net`` itself if it is a module, else ``net(info)`` (a ``_partial_`` network builder); a ConfigError it
    raises is re-keyed under ``key`` so that it is reported as ``model.net.<arg>``."""
    if isinstance(net, nn.Module):
        return net
    try:
        out = net(info)
    except ConfigError as err:
        raise ConfigError(f"{key}.{err.key}" if err.key else key, err.problem, err.fix) from None
    except TypeError as err:  # a wrong or missing keyword for the builder
        fn = getattr(getattr(net, "func", net), "__qualname__", repr(net))
        raise ConfigError(key, f"could not build {fn} ({' '.join(str(err).split())})",
                          f"give only the keyword arguments {fn} takes") from None
    if not isinstance(out, nn.Module):
        raise ConfigError(f"{key}._target_", f"returned {type(out).__name__}, not a torch.nn.Module",
                          "point it at a function (info, **args) -> nn.Module")
    return out


class ClassifierModule(nn.Module):
    """Cross-entropy classifier around ``net`` (a module, or a builder called with ``info``)."""

    primary_metric: tuple[str, str] = ("test_acc", "max")

    def __init__(self, net: nn.Module | Callable[[DataInfo], nn.Module], info: DataInfo,
                 input_key: Annotated[str, OneOf("x", "input_ids")] = "x"):
        super().__init__()
        if not info.num_classes:
            raise ConfigError("", "a classifier needs a dataset with class labels (its DataInfo.num_classes is None)",
                              "use a classification dataset or another model wrapper")
        self.net = build_net(net, info)
        self.num_classes, self.input_key = int(info.num_classes), input_key
        self.eval_acc, self.eval_loss = AccuracySum(), MeanSum()

    # evaluation sums are summed across processes in compute(): the loop may shard the test set
    syncs_eval_metrics = True

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: dict, batch_idx: int = 0) -> Tensor:
        return F.cross_entropy(self(batch[self.input_key]), batch["y"])

    def sample_losses(self, batch: dict) -> Tensor:
        """Each example's cross-entropy (their mean is :meth:`training_step`'s loss): what a cohort of clients
        (``trainer.cohort``, fl_lightning/cohort/) weighs with each client's row mask."""
        return self.sample_losses_of(self.sample_outputs(batch), batch)

    def sample_outputs(self, batch: dict) -> Tensor:
        """The logits of a batch: the part of :meth:`sample_losses` a cohort runs per client (under ``vmap``)."""
        return self(batch[self.input_key])

    def sample_losses_of(self, logits: Tensor, batch: dict) -> Tensor:
        """Each example's cross-entropy given its logits: the part a cohort runs on all its clients' rows at once."""
        return F.cross_entropy(logits, batch["y"], reduction="none")

    def sampled_label_loss(self, batch: dict, generator: torch.Generator | None = None) -> Tensor:
        """Cross-entropy against labels drawn from the model's own softmax, ŷ ~ softmax(f(x)): the loss whose
        gradient feeds Sophia's Gauss–Newton–Bartlett estimator (Liu et al., "Sophia", ICLR 2024, arXiv 2305.14342,
        Alg. 2, ĥ = B·∇L̂(θ)⊙∇L̂(θ)). ``generator``: e.g. ``client.rng("gnb")``, so the draws are part of the
        (seed, client, round) stream. Its expected gradient is zero (E[onehot(ŷ)] = softmax)."""
        logits = self(batch[self.input_key])
        return F.cross_entropy(logits, self.sampled_labels(logits, generator))

    @staticmethod
    @torch.no_grad()
    def sampled_labels(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """ŷ ~ softmax(logits), one label per row, drawn from ``generator`` (:meth:`sampled_label_loss`'s labels; a
        cohort of clients draws each client's from its own generator over its logits' rows)."""
        probs = torch.softmax(logits.detach().float(), dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    @torch.no_grad()
    def validation_step(self, batch: dict, batch_idx: int = 0) -> Tensor:
        logits = self(batch[self.input_key])
        loss = F.cross_entropy(logits.float(), batch["y"], reduction="none")
        self.eval_loss.update(loss)
        self.eval_acc.update(logits.argmax(-1), batch["y"])
        return loss.mean()

    def compute_eval(self) -> dict[str, float]:
        """Metrics over every ``validation_step`` since the last call; resets them."""
        device = next(self.parameters(), torch.zeros(())).device  # where the sums live if this process saw no batch
        out = {"test_loss": float(self.eval_loss.compute(device)), "test_acc": float(self.eval_acc.compute(device))}
        self.eval_loss.reset()
        self.eval_acc.reset()
        return out

    def configure_optimizers(self):  # pragma: no cover - strategies build the local optimizers
        raise NotImplementedError("fl_lightning strategies build optimizers; see fl_lightning/strategies/parts/local_optimizer.py")
