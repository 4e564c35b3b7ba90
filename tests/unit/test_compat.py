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


def test_collective_timeout_reaches_the_strategy():
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    assert _compat.set_collective_timeout(fabric.strategy, 42), f"Fabric's DDP strategy has no _timeout ({VERSIONS})"
    assert fabric.strategy._timeout.total_seconds() == 42
    one = Fabric(accelerator="cpu", devices=1)
    assert not _compat.set_collective_timeout(one.strategy, 42)


def test_default_store_is_the_groups_store():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        store = _compat.default_store()
        assert store.add("fl/beat/0", 1) == 1 and store.add("fl/beat/0", 0) == 1, VERSIONS
    finally:
        dist.destroy_process_group()


def test_lightnings_child_observer_is_found_and_polls_through_run():
    import inspect

    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    observer = _ChildProcessObserver(main_pid=-1, child_processes=[])
    assert observer.name == _compat.OBSERVER_THREAD, f"Lightning renamed its observer thread ({VERSIONS})"
    assert "self._run()" in inspect.getsource(type(observer).run), VERSIONS


def test_lazy_lightning_knows_every_name_of_lightnings_init():
    """fl_lightning._compat.lazy_lightning stands in for lightning/__init__.py: it must provide the same names
    (read from that file's ``__all__``, not imported) from the modules that define them."""
    import ast
    import importlib
    import os

    init = os.path.join(os.path.dirname(lightning.__spec__.origin), "__init__.py")
    tree = ast.parse(open(init).read())
    names = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in n.targets))
    assert set(names) - {"__version__"} == set(_compat.LIGHTNING_NAMES), \
        f"lightning/__init__.py exports {sorted(names)} ({VERSIONS}): update _compat.LIGHTNING_NAMES"
    for name, module in _compat.LIGHTNING_NAMES.items():
        assert getattr(importlib.import_module(module), name) is getattr(lightning, name), (name, VERSIONS)


def test_fabrics_torchmetrics_flag_is_where_import_fabric_puts_it_back():
    """import_fabric hides torchmetrics while lightning.fabric asks for its version, then sets the flag again:
    the flag must still be that module's, computed by compare_version on torchmetrics."""
    import inspect

    from lightning.fabric.utilities import imports

    assert _compat._FLAG in vars(imports), f"lightning.fabric.utilities.imports has no {_compat._FLAG} ({VERSIONS})"
    assert f'{_compat._FLAG} = compare_version("torchmetrics"' in inspect.getsource(imports), VERSIONS
    assert bool(getattr(imports, _compat._FLAG)), VERSIONS
