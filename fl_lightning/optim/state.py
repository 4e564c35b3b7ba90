"""Optimizer state as a flat ``{name: tensor}`` dict, complete or refused: what a client keeps between rounds.

``export_optimizer_state(opt)`` walks ``opt.state_dict()``:

* per-parameter state (``<param index>/<key>``): tensors as they are; Python numbers as 0-d tensors (suffix
  ``#py``); lists/tuples of tensors or numbers element by element (``#<i>``, with the length under ``#len``), as
  SOAP keeps its ``GG`` and ``Q`` (Vyas et al., ICLR 2025, arXiv 2409.11321);
* param-group counters (``group<g>/<key>``): numeric group entries that are not hyperparameters (not in
  ``opt.defaults``), e.g. a group-level ``step``. Hyperparameters are not stored: each round builds them afresh
  (with that round's learning rate).

Anything else (a dict, a string, an object) cannot be stored as tensors: exporting it raises a one-line
:class:`~fl_lightning.errors.ConfigError` instead of silently dropping it. ``import_optimizer_state`` is the inverse
and goes through ``opt.load_state_dict`` (so the optimizer's own casting and checks apply).
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError

_PY, _LEN = "#py", "#len"
PY = _PY  # the suffix of an exported Python number (a counter): ``<param>/<entry>#py``
_ZEROED: "weakref.WeakKeyDictionary[torch.optim.Optimizer, bool]" = weakref.WeakKeyDictionary()


def fresh_entry(opt: torch.optim.Optimizer, p: Tensor, key: str) -> bool:
    """Whether ``opt``'s entry ``key`` of ``p`` is what a fresh optimizer holds at a client's start: absent, or
    zeroed by :func:`reset_in_place` (or made by :func:`allocate`) with no state imported since (ask before the
    client's first step)."""
    return key not in opt.state.get(p, {}) or _ZEROED.get(opt, False)


def is_fresh(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` holds what a fresh optimizer holds: no state, or state zeroed by :func:`reset_in_place` (or made
    by :func:`allocate`) with nothing imported since."""
    from .adapters import TOUCHED

    return not any(opt.state.values()) or (_ZEROED.get(opt, False) and not TOUCHED.get(opt, False))


def _put(out: dict[str, Tensor], key: str, v: Any, opt) -> None:
    if isinstance(v, Tensor):
        out[key] = v.detach()
    elif isinstance(v, (bool, int, float)):
        out[key + _PY] = torch.tensor(v)
    elif isinstance(v, (list, tuple)):
        out[key + _LEN] = torch.tensor(len(v))
        for i, x in enumerate(v):
            if isinstance(x, (list, tuple, dict)):
                _refuse(key, x, opt)
            _put(out, f"{key}#{i}", x, opt)
    else:
        _refuse(key, v, opt)


def _refuse(key: str, v: Any, opt) -> None:
    raise ConfigError("state", f"{type(opt).__name__} keeps a {type(v).__name__} under {key!r}, which a client's "
                      "persistent state cannot hold as tensors", "use state: reset, or give the optimizer tensor state")


def export_optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Tensor]:
    sd = opt.state_dict()
    out: dict[str, Tensor] = {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            _put(out, f"{idx}/{k}", v, opt)
    for g, group in enumerate(sd["param_groups"]):
        for k, v in group.items():
            if k != "params" and k not in opt.defaults and isinstance(v, (bool, int, float, Tensor)):
                _put(out, f"group{g}/{k}", v, opt)
    return out


def _take(flat: dict[str, Tensor], key: str) -> Any:
    if key in flat:
        return flat[key]
    if key + _PY in flat:
        return flat[key + _PY].item()
    n = int(flat[key + _LEN])
    return [_take(flat, f"{key}#{i}") for i in range(n)]


def import_optimizer_state(opt: torch.optim.Optimizer, flat: dict[str, Tensor]) -> None:
    sd = opt.state_dict()
    entries: dict[str, set[str]] = {}
    for key in flat:
        head, k = key.split("/", 1)
        entries.setdefault(head, set()).add(k.split("#", 1)[0])
    state: dict[int, dict[str, Any]] = {}
    for head, keys in entries.items():
        values = {k: _take(flat, f"{head}/{k}") for k in keys}
        if head.startswith("group"):
            sd["param_groups"][int(head[5:])].update(values)
        else:
            state[int(head)] = values
    sd["state"] = state
    if not _import_in_place(opt, sd):
        opt.load_state_dict(sd)
    _ZEROED.pop(opt, None)


def mark_imported(opt: torch.optim.Optimizer) -> None:
    """``opt`` now holds a state given from outside (not a fresh one): :func:`is_fresh` says no, as after
    :func:`import_optimizer_state`."""
    _ZEROED.pop(opt, None)


def _import_in_place(opt: torch.optim.Optimizer, sd: dict) -> bool:
    """``opt.load_state_dict(sd)`` written into the state ``opt`` holds (:func:`allocate`, :func:`reset_in_place`):
    each tensor copied into the tensor already there, the values those of the tensors ``load_state_dict`` would keep
    (its own per-parameter cast), so a client's state imported for each of its rounds leaves the run's state tensors
    the same objects (a compiled step guards on them: ``torch.optim.Adam``'s ``step`` tensor by its identity, a
    recompile per client imported). Only where that is the same: an optimizer whose adapter allocates its state
    (``zero_is_fresh``), with ``torch.optim.Optimizer``'s own ``load_state_dict`` and no hooks, and a state of the same
    entries, shapes, dtypes and devices; False (nothing written) otherwise."""
    from .adapters import adapter_for

    if (not adapter_for(opt).zero_is_fresh or type(opt).load_state_dict is not torch.optim.Optimizer.load_state_dict
            or opt._optimizer_load_state_dict_pre_hooks or opt._optimizer_load_state_dict_post_hooks):
        return False
    params = [p for g in opt.param_groups for p in g["params"]]
    if {i for i, p in enumerate(params) if opt.state.get(p)} != set(sd["state"]):
        return False
    writes: list[tuple[dict, str, Any]] = []
    for i, values in sd["state"].items():
        st = opt.state[params[i]]
        if set(st) != set(values):
            return False
        for k, v in values.items():
            cur = st[k]
            if isinstance(v, Tensor):
                want = torch.optim.Optimizer._process_value_according_to_param_policy(
                    params[i], v, i, sd["param_groups"], k)
                if not (isinstance(cur, Tensor) and cur.shape == want.shape and cur.dtype == want.dtype
                        and cur.device == want.device):
                    return False
                writes.append((st, k, want))
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(cur, (int, float)):
                writes.append((st, k, v))
            else:
                return False
    copies = [(st[k], v) for st, k, v in writes if isinstance(v, Tensor)]
    if copies:
        with torch.no_grad():
            torch._foreach_copy_([d for d, _ in copies], [v for _, v in copies])  # one op per device and dtype
    for st, k, v in writes:
        if not isinstance(v, Tensor):
            st[k] = v
    for group, saved in zip(opt.param_groups, sd["param_groups"]):
        group.update({k: v for k, v in saved.items() if k not in ("params", "param_names")})
    return True


def reset_in_place(opt: torch.optim.Optimizer, fresh: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Make ``opt`` what ``fresh`` (a new optimizer over the same parameters, groups in the same order) is: every
    group's hyperparameters, an empty state, and the other public attributes (e.g. Muon's corrections), while the
    object, its group dicts and its state dict stay the same objects. One optimizer object then serves every client
    of a run, so a compiled step (``trainer.compile``) that guards on the optimizer is reused, not recompiled for
    each client; each client's values equal a fresh optimizer's bit for bit.

    Static state: where the optimizer's adapter says a state of zeros is what it creates afresh (``zero_is_fresh``:
    Adam(W), Muon, Sophia, Lion), the state's tensors stay allocated for the run and are zeroed in place (one
    multi-tensor op) and its numbers set to 0, instead of being dropped and rebuilt tensor by tensor at the first
    step; SGD (whose first step copies the gradient) and SOAP (whose first step initialises its bases) start empty."""
    if len(opt.param_groups) != len(fresh.param_groups):
        raise ValueError(f"{type(opt).__name__}: {len(fresh.param_groups)} param groups, was {len(opt.param_groups)}")
    for group, new in zip(opt.param_groups, fresh.param_groups):
        if len(group["params"]) != len(new["params"]) or any(a is not b for a, b in zip(group["params"], new["params"])):
            raise ValueError(f"{type(opt).__name__}: the param groups hold other parameters than before")
        for k, v in new.items():
            if k != "params":
                group[k] = v
        for k in [k for k in group if k not in new]:
            del group[k]
    from .adapters import TOUCHED, adapter_for

    if adapter_for(opt).zero_is_fresh:
        tensors = []
        for st in opt.state.values():
            for k, v in st.items():
                if isinstance(v, Tensor):
                    tensors.append(v)
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    st[k] = type(v)(0)
                else:
                    raise TypeError(f"{type(opt).__name__} keeps a {type(v).__name__} under {k!r}: not zero_is_fresh")
        if tensors:
            torch._foreach_zero_(tensors)
        _ZEROED[opt] = True
    else:
        opt.state.clear()
    TOUCHED.pop(opt, None)
    for k, v in vars(fresh).items():
        if k not in ("param_groups", "state", "defaults") and not k.startswith("_"):
            setattr(opt, k, v)
    return opt


def allocate(opt: torch.optim.Optimizer) -> None:
    """Give every parameter of ``opt`` its fresh state now (the adapter's ``init_state``), where a state of zeros is
    the fresh one (``zero_is_fresh``), instead of at its first step: the state's tensors exist, and are the same
    objects, from the first step of a run on (a compiled step finds no empty state to guard on; a run's memory is
    allocated up front). Other optimizers are left to create theirs."""
    from .adapters import TOUCHED, adapter_for

    adapter = adapter_for(opt)
    if not adapter.zero_is_fresh:
        return
    for group in opt.param_groups:
        for p in group["params"]:
            if not opt.state.get(p):
                opt.state[p].update(adapter.init_state(p))
    _ZEROED[opt] = True
    TOUCHED.pop(opt, None)
