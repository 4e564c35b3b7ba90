"""One capture wrapper around any local step (``trainer.compile``): ``none`` runs it as it is, ``step`` through
``torch.compile`` (:mod:`fl_lightning.step.compiled`), ``graphs`` captured and replayed as a CUDA graph
(:mod:`fl_lightning.step.graphed`; Dion's ``cuda_graph.py`` is the model: one helper, any step).

The wrapper takes the step object (:class:`~fl_lightning.step.local.LocalStep`: a client's or a cohort's) and reads
the strategy and the parameters from it explicitly, so {client, cohort} × {none, step, graphs} needs no code of its
own for any combination. The loop builds it from the resolved ``trainer.compile`` (:class:`Capture`), and the run's
summary reports the counts of the wrapper that actually ran (:func:`counts`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

MODES = ("none", "step", "graphs")


@dataclass(frozen=True)
class Capture:
    """How the run's local step is run: ``mode`` (the resolved ``trainer.compile``), the compiler's ``backend``,
    ``lr_tensors`` (the groups' learning rates change between rounds: inputs of a compiled graph, not constants),
    ``dynamic_batch`` (``fl.local_epochs``: a pass's short last batch has any size) and the method's name (for the
    lines that say why a step is not replayed)."""

    mode: str = "none"
    backend: str = "inductor"
    lr_tensors: bool = False
    dynamic_batch: bool = False
    method: str = ""

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"capture mode {self.mode!r}: one of {', '.join(MODES)}")

    def wrap(self, step: Callable) -> Callable:
        """``step`` (``step(ctx, batch, k) -> loss``, with ``strategy`` and ``params``) as this mode runs it."""
        if self.mode == "step":
            from .compiled import CompiledStep

            return CompiledStep(step, self.mode, backend=self.backend, lr_tensors=self.lr_tensors,
                                dynamic_batch=self.dynamic_batch)
        if self.mode == "graphs":
            from .graphed import GraphedStep

            return GraphedStep(step, method=self.method, strategy=step.strategy, params=step.params)
        return step


def counts(wrapped) -> dict | None:
    """What the wrapper compiled, captured and replayed (its ``log_counts``, logged once), or None for an eager step."""
    log_counts = getattr(wrapped, "log_counts", None)
    return log_counts() if callable(log_counts) else None
