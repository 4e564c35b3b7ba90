"""CausalLMModule: the LightningModule wrapper for next-token language modelling (LLaMA on C4, as seed 001 trains
it: FedPAC Sec. 6.3, Table 3).

A batch holds ``input_ids`` (B, T) of packed token sequences; with a ``y`` column too (the character-window sets
``pydoc_chars`` / ``shakespeare``: a window and its next character) the sequence is the window followed by ``y``.
The loss is the mean next-token cross-entropy over every position (position t predicts token t + 1, T − 1 targets
per sequence). Evaluation sums the token NLL, the token count and the correct argmax predictions over held-out
sequences as torchmetrics sum states (summed across processes in ``compute``, so the loop may shard the test set)
and reports ``test_loss`` (mean token NLL, nats), ``test_ppl`` = exp(mean token NLL) (the primary metric,
minimised) and ``test_acc`` (next-token accuracy).
"""
from __future__ import annotations

from typing import Callable

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import SumMetric

from ..data.info import DataInfo
from ..errors import ConfigError
from .classifier import build_net


def sequence(batch: dict) -> Tensor:
    """The token sequences of a batch: ``input_ids``, followed by ``y`` when the set holds (window, next token)."""
    ids = batch["input_ids"].long()
    return torch.cat([ids, batch["y"].long().view(-1, 1)], 1) if "y" in batch else ids


class CausalLMModule(L.LightningModule):
    """Next-token prediction around ``net`` (``net(input_ids=...)`` returns ``.logits`` or a logits tensor)."""

    primary_metric: tuple[str, str] = ("test_ppl", "min")
    # evaluation metrics are torchmetrics sums, gathered across processes in compute(): the loop may shard the test set
    syncs_eval_metrics = True

    def __init__(self, net: nn.Module | Callable[[DataInfo], nn.Module], info: DataInfo):
        super().__init__()
        if not info.vocab_size:
            raise ConfigError("", "a language model needs a dataset with a vocabulary (DataInfo.vocab_size is None)",
                              "use data=pydoc_chars, data=c4 or data=shakespeare")
        self.net = build_net(net, info)
        self.eval_nll, self.eval_tokens, self.eval_correct = (SumMetric().set_dtype(torch.float64) for _ in range(3))

    def logits(self, ids: Tensor) -> Tensor:
        out = self.net(input_ids=ids)
        return out if isinstance(out, Tensor) else out.logits

    def _predict(self, batch: dict) -> tuple[Tensor, Tensor]:
        """(logits of positions 0..T-2 as (N, V), their targets: tokens 1..T-1 as (N,))."""
        ids = sequence(batch)
        return self.logits(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()

    def training_step(self, batch: dict, batch_idx: int = 0) -> Tensor:
        logits, target = self._predict(batch)
        return F.cross_entropy(logits.float(), target)

    def sampled_label_loss(self, batch: dict, generator: torch.Generator | None = None) -> Tensor:
        """Cross-entropy against next tokens drawn from the model's own softmax at every position (Sophia's
        Gauss–Newton–Bartlett estimator; Liu et al., ICLR 2024, arXiv 2305.14342, Alg. 2), as
        :meth:`ClassifierModule.sampled_label_loss`."""
        logits, _ = self._predict(batch)
        with torch.no_grad():
            y_hat = torch.multinomial(torch.softmax(logits.detach().float(), -1), 1, generator=generator).squeeze(-1)
        return F.cross_entropy(logits.float(), y_hat)

    @torch.no_grad()
    def validation_step(self, batch: dict, batch_idx: int = 0) -> Tensor:
        logits, target = self._predict(batch)
        nll = F.cross_entropy(logits.float(), target, reduction="none")
        self.eval_nll.update(nll.double().sum())
        self.eval_tokens.update(torch.tensor(float(target.numel()), dtype=torch.float64, device=nll.device))
        self.eval_correct.update((logits.argmax(-1) == target).double().sum())
        return nll.mean()

    def compute_eval(self) -> dict[str, float]:
        """Metrics over every ``validation_step`` since the last call; resets them."""
        count = float(self.eval_tokens.compute())
        loss = float(self.eval_nll.compute()) / max(count, 1.0)
        out = {"test_loss": loss, "test_ppl": float(torch.tensor(loss, dtype=torch.float64).exp()),
               "test_acc": float(self.eval_correct.compute()) / max(count, 1.0)}
        for m in (self.eval_nll, self.eval_tokens, self.eval_correct):
            m.reset()
        return out

    def configure_optimizers(self):  # pragma: no cover - strategies build the local optimizers
        raise NotImplementedError("fl_lightning strategies build optimizers; see fl_lightning/strategies/parts/local_optimizer.py")
