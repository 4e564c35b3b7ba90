"""The local step, once: one step sequence and one K-step loop (``local.py``) that a client and a cohort of clients
both run, and one capture wrapper around any step (``capture.py``: eager, ``torch.compile`` in ``compiled.py``, CUDA
graphs in ``graphed.py``). docs/design.md, "The local step", draws the path."""
from __future__ import annotations

from .capture import MODES, Capture, counts
from .local import ClientStep, LocalStep, check_finite, mean_losses, run_steps

__all__ = ["MODES", "Capture", "ClientStep", "LocalStep", "check_finite", "counts", "mean_losses", "run_steps"]
