"""ClassifierModule's evaluation sums (fl_lightning/models/eval_sums.py) give torchmetrics' values bit for bit:
``MeanMetric`` for the test loss, ``MulticlassAccuracy(average="micro")`` for the accuracy (what the classifier used
before; the golden digests' test_loss and test_acc depend on it)."""
from __future__ import annotations

import pytest
import torch
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from fl_lightning.data.info import DataInfo
from fl_lightning.models import ClassifierModule
from fl_lightning.models.eval_sums import AccuracySum, MeanSum

CPU = torch.device("cpu")


def _batches(seed: int, sizes, classes: int = 10, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    for n in sizes:
        logits = torch.randn(n, classes, generator=g) * scale
        y = torch.randint(0, classes, (n,), generator=g)
        yield logits, y, torch.nn.functional.cross_entropy(logits, y, reduction="none")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sizes", [[1024] * 9 + [784], [7, 1, 300], [1]])
def test_same_bits_as_torchmetrics(dtype, sizes):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # the state dtype both take from the default when built (64-true precision)
    try:
        ref_loss, ref_acc, loss, acc = MeanMetric(), MulticlassAccuracy(num_classes=10, average="micro"), MeanSum(), AccuracySum()
    finally:
        torch.set_default_dtype(old)
    for rounds in range(2):  # and again after a reset
        for logits, y, nll in _batches(rounds, sizes):
            ref_loss.update(nll)
            ref_acc.update(logits.argmax(-1), y)
            loss.update(nll)
            acc.update(logits.argmax(-1), y)
        a, b = ref_loss.compute(), loss.compute(CPU)
        assert a.dtype == b.dtype and a.item() == b.item() and float(a) == float(b)
        assert float(ref_acc.compute()) == float(acc.compute(CPU))
        for m in (ref_loss, ref_acc, loss, acc):
            m.reset()


def test_nan_losses_are_dropped_with_a_warning_as_meanmetric_does():
    ref, mine = MeanMetric(), MeanSum()
    v = torch.tensor([1.0, float("nan"), 2.5, float("inf") * 0, 4.0])
    with pytest.warns(UserWarning, match="nan"):
        ref.update(v)
    with pytest.warns(UserWarning, match="nan"):
        mine.update(v)
    assert float(ref.compute()) == float(mine.compute(CPU)) == 2.5


def test_nothing_seen():
    """No batch on this process: the mean is NaN (0/0) and the accuracy 0, as torchmetrics gives them."""
    assert torch.isnan(MeanSum().compute(CPU)) and float(AccuracySum().compute(CPU)) == 0.0


def test_classifier_reports_the_same_metrics_as_with_torchmetrics():
    torch.manual_seed(0)
    module = ClassifierModule(torch.nn.Linear(6, 4), DataInfo(input_shape=(6,), num_classes=4))
    ref_loss, ref_acc = MeanMetric(), MulticlassAccuracy(num_classes=4, average="micro")
    g = torch.Generator().manual_seed(1)
    for i in range(5):
        batch = {"x": torch.randn(33, 6, generator=g), "y": torch.randint(0, 4, (33,), generator=g)}
        module.validation_step(batch, i)
        with torch.no_grad():
            logits = module(batch["x"])
        ref_loss.update(torch.nn.functional.cross_entropy(logits.float(), batch["y"], reduction="none"))
        ref_acc.update(logits.argmax(-1), batch["y"])
    assert module.compute_eval() == {"test_loss": float(ref_loss.compute()), "test_acc": float(ref_acc.compute())}
    assert torch.isnan(torch.tensor(module.compute_eval()["test_loss"]))  # reset: nothing seen since
