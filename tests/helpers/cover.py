"""The methods the fast subset (``-m "not slow"``) runs where a test is parametrized over every method: together
they hold every part class, every local optimizer class and every (part, optimizer) pairing of the package's methods
(a greedy cover, 22 of 54). The others, which repeat those with other settings, run with the whole suite (marked
``slow``): CI runs every method. tests/unit/test_cover.py checks the cover is still one as methods are added."""
from __future__ import annotations

import pytest

FAST = frozenset({"adam_biclip", "dlion", "ef21", "fafed", "fed_locallion", "fedavg_vr", "fedavgm", "fedlada",
                  "fedlion", "fedmuon_avg", "fedmuon_bc", "fedpac_muon", "fedpac_soap", "fedpac_sophia", "fedpm",
                  "fedprox", "fedsmum", "fedsmumc", "local_adamw", "scaffold", "scaffold_adam", "scallion"})


def cases(methods) -> list:
    """``methods`` as parametrize cases: the cover's as they are, the others marked ``slow``."""
    return [m if m in FAST else pytest.param(m, marks=pytest.mark.slow) for m in methods]


def signature(cfg) -> set[str]:
    """What a method's composed config runs: its parts' classes, its local optimizer's class, and each pairing."""
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=False)
    parts = (tree.get("method") or {}).get("parts") or {}
    classes = {str(v.get("_target_")) for v in parts.values() if isinstance(v, dict)}
    opt = str((tree.get("optimizer") or {}).get("_target_"))
    return {f"part:{c}" for c in classes} | {f"optimizer:{opt}"} | {f"pair:{c}+{opt}" for c in classes}
