"""The federated loop: rounds, sampling, the clients' state swapped in and out (``loop.py``), what a part may ask of
it for one client (``services.py``: LoopServices) and the clients' private state off the device
(``client_store.py``). A round's clients train one at a time or as a cohort (``fl_lightning/cohort/``), each
through the one local step (``fl_lightning/step/``)."""
from __future__ import annotations

from ..errors import StopRequested
from .loop import FederatedLoop, LoopConfig, assign_clients

__all__ = ["FederatedLoop", "LoopConfig", "StopRequested", "assign_clients"]
