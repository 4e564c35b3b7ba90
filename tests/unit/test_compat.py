"""The private torch / Lightning APIs behind fl_lightning/_compat.py still exist and behave as the package assumes;
a failure names the installed versions (the wrappers were written for torch 2.14 and lightning 2.6)."""
from __future__ import annotations

import lightning
import torch

from fl_lightning import _compat

VERSIONS = f"torch {torch.__version__}, lightning {lightning.__version__}"


def test_storage_use_count_sees_views():
    t = torch.zeros(8)
    alone = _compat.storage_use_count(t)
    assert alone is not None, f"torch._C._storage_Use_Count is gone ({VERSIONS}): client buffers are never reused"
    view = t[2:]
    assert _compat.storage_use_count(t) == alone + 1, VERSIONS
    del view
    assert _compat.storage_use_count(t) == alone, VERSIONS


def test_function_launcher_is_recognised():
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
    assert _compat.starts_processes_from_a_function(fabric.strategy.launcher), \
        f"Lightning's {_compat.FUNCTION_LAUNCHER} was renamed ({VERSIONS}): trainer.strategy=ddp_spawn is not refused"
    ddp = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    assert not _compat.starts_processes_from_a_function(ddp.strategy.launcher), VERSIONS
