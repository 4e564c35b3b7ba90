"""A round's clients trained K at a time in one batched step (``trainer.cohort=K``): the engine (``engine.py``: the
stacked parameters, the vmapped step, the parts' stacked state, the checks and the automatic K), each client's
dropout masks from its own stream (``dropout.py``) and the optimizer stepped client by client where it has no
batched form (``optimizer.py``). docs/design.md, "A cohort of clients", draws it."""
from __future__ import annotations

from .auto import auto_cohort
from .context import CohortContext
from .engine import (AUTO_FRACTION, KEY, STACKED_COPIES, Cohort, CohortRun, check_cohort, check_cohort_memory,
                     load_rows)
from .forward import CohortServices

__all__ = ["AUTO_FRACTION", "KEY", "STACKED_COPIES", "Cohort", "CohortContext", "CohortRun", "CohortServices",
           "auto_cohort", "check_cohort", "check_cohort_memory", "load_rows"]
