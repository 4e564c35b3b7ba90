"""State a part keeps but does not save: found at each checkpoint, before it is written.

A part's state that is missing from its ``state_dict`` breaks exact resume without a word: the resumed run starts
that state afresh. So, once the strategy is set up, every tensor and number reachable from each part's attributes
(through dicts, lists and tuples, three levels deep) is fingerprinted (its shape and three float64 sums, kept on its
device: no copy of the state); at each checkpoint, those that changed since (or
appeared) must be covered by what the part's ``state_dict`` returns (the same tensor, or equal values; a number equal
to a 0-d value). Any that is not stops the run before the checkpoint, in one line naming ``part.attribute``.

Attributes a resume does not need (a buffer refilled for each client, a value recomputed each round from the saved
state) are listed in the part's ``scratch`` (``Part.scratch``). The check costs one pass over the parts' attributes
per checkpoint.
"""
from __future__ import annotations

import numbers
from typing import Any

import torch

from ..errors import ConfigError

_SKIP = ("server", "name")  # the server context (the module, the global model) and the part's own name


def _leaves(obj: Any, path: str, out: dict, depth: int = 0) -> None:
    if isinstance(obj, torch.Tensor):
        out[path] = obj
    elif isinstance(obj, bool) or obj is None:
        return
    elif isinstance(obj, numbers.Number):
        out[path] = obj
    elif depth < 3 and isinstance(obj, dict):
        for k, v in obj.items():
            _leaves(v, f"{path}[{k!r}]", out, depth + 1)
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _leaves(v, f"{path}[{i}]", out, depth + 1)


def attributes(part) -> dict[str, Any]:
    """``{attribute path: tensor or number}`` of the part's state-like attributes, less its ``scratch``."""
    out: dict[str, Any] = {}
    scratch = set(getattr(part, "scratch", ()))
    for k, v in vars(part).items():
        if k not in _SKIP and k not in scratch:
            _leaves(v, k, out)
    return out


def _fingerprint(t: torch.Tensor) -> tuple:
    d = t.detach().double()
    return tuple(t.shape), t.dtype, torch.stack([d.sum(), d.abs().sum(), d.square().sum()])


def snapshot(parts) -> dict[str, dict[str, Any]]:
    """Fingerprints of every part's state-like attributes (after set-up)."""
    return {p.name: {k: _fingerprint(v) if isinstance(v, torch.Tensor) else v for k, v in attributes(p).items()}
            for p in parts}


def _changed(old: Any, new: Any) -> bool:
    if isinstance(new, torch.Tensor):
        if not isinstance(old, tuple):
            return True
        shape, dtype, sums = old
        new_shape, new_dtype, new_sums = _fingerprint(new)
        return shape != new_shape or dtype != new_dtype or not bool(torch.equal(sums, new_sums.to(sums.device)))
    return isinstance(old, tuple) or old != new


def _covered(v: Any, saved: list[torch.Tensor]) -> bool:
    if isinstance(v, torch.Tensor):
        return any(t is v or (t.shape == v.shape and t.dtype == v.dtype and t.device == v.device
                              and bool(torch.equal(t, v))) for t in saved)
    return any(t.numel() == 1 and float(t) == float(v) for t in saved)


def unsaved(parts, baseline: dict[str, dict[str, Any]]) -> list[str]:
    """``part.attribute`` of every state-like attribute that changed since ``baseline`` and is not in the part's
    ``state_dict``."""
    out = []
    for p in parts:
        base = baseline.get(p.name, {})
        now = attributes(p)
        changed = [k for k, v in now.items() if k not in base or _changed(base[k], v)]
        if not changed:
            continue
        saved = [t.detach() for t in (p.state_dict() or {}).values() if isinstance(t, torch.Tensor)]
        out += [f"{p.name}.{k}" for k in changed if not _covered(now[k], saved)]
    return out


def check(parts, baseline: dict[str, dict[str, Any]]) -> None:
    """One line naming the first unsaved attribute (the checkpoint is not written)."""
    missing = unsaved(parts, baseline)
    if missing:
        name, _, attr = missing[0].partition(".")
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(f"method.parts.{name}", f"its attribute {attr} changed during the run and is not in its "
                          f"state_dict(){more}, so a resume from this checkpoint would not continue exactly; the "
                          "checkpoint was not written",
                          "return it from state_dict() and restore it in load_state_dict() (docs/extending.md), or "
                          "name it in the part's scratch if a resume does not need it")
