"""A run's config hash: the part of the config that changes results, as the keys declare it (``result=False``,
``hashed=``; :func:`.schema.hash_rules`). A resumed run must share it with the run that wrote the checkpoint
(``checkpoint/reader.py``); :func:`result_diff` names the keys that differ. Torch-free."""
from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig, OmegaConf

from .schema import hash_rules, not_result_keys

NOT_RESULT_GROUPS = ("hydra", "logger")  # whole groups that do not change results


def result_view(cfg: DictConfig) -> dict:
    """The part of the config that changes results (what a resumed run must share with the one it continues)."""
    c = OmegaConf.to_container(cfg, resolve=True)
    c = {k: v for k, v in c.items() if k not in NOT_RESULT_GROUPS and not (k in ("server_opt", "dp") and v is None)}
    for name in not_result_keys():
        group, _, leaf = name.rpartition(".")
        node = c.get(group) if group else c
        if isinstance(node, dict):
            node.pop(leaf, None)
            if group and not node and group != "trainer":  # a group of keys that all leave results alone
                del c[group]
    c.setdefault("trainer", {})  # the hash of every checkpoint written so far has it
    for name, hashed in hash_rules().items():  # the keys whose place in the hash depends on a value
        group, _, leaf = name.rpartition(".")
        node = c.get(group) if group else c
        if isinstance(node, dict) and leaf in node and not hashed(node[leaf], c):
            del node[leaf]
    return c


def config_hash(cfg: DictConfig) -> str:
    """16 hex digits of the sha256 of :func:`result_view` (sorted JSON)."""
    return hashlib.sha256(json.dumps(result_view(cfg), sort_keys=True).encode()).hexdigest()[:16]


def _flatten(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def result_diff(old: DictConfig, new: DictConfig) -> list[tuple[str, object, object]]:
    """``(key, old value, new value)`` for every result-relevant key that differs (absent: None), sorted."""
    a, b = _flatten(result_view(old)), _flatten(result_view(new))
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
