"""Which parameters Muon takes, and its param groups (Muon groups of matrices, auxiliary groups of the rest)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated

from torch import Tensor, nn

from ..config import OneOf
from .muon_math import AUX, EXCLUDABLE, LMOS, NS_BATCHING, MOMENTUM_STYLES, SCALE_MODES, STYLE_ALIASES
from .newton_schulz import resolve_coeffs

def build_groups(params: Iterable, defaults: dict, aux_args: dict) -> list[dict]:
    """Normalize params into groups with an explicit ``use_muon`` flag (see Muon's docstring)."""
    if isinstance(params, Tensor):
        params = [params]
    groups = list(params)
    if not groups:
        raise ValueError("Muon got an empty parameter list")
    if not isinstance(groups[0], Mapping):
        groups = [{"params": groups}]
    out = []
    for group in groups:
        group = dict(group)
        ps = group.pop("params")
        ps = [ps] if isinstance(ps, Tensor) else list(ps)
        aux_keys = {k: group.pop("aux_" + k) for k in aux_args if "aux_" + k in group}
        if "use_muon" in group:
            halves = [(bool(group["use_muon"]), ps)]
        else:
            halves = [(True, [p for p in ps if p.ndim >= 2]), (False, [p for p in ps if p.ndim < 2])]
        for use_muon, sub in halves:
            if not sub:
                continue
            g = {**group, "params": sub, "use_muon": use_muon}
            if not use_muon:
                for k, ctor in aux_args.items():
                    # group aux_k > (explicit aux group's own k) > constructor aux_k > Muon value
                    if k in aux_keys:
                        g[k] = aux_keys[k]
                    elif "use_muon" in group and k in group:
                        g[k] = group[k]
                    elif ctor is not None:
                        g[k] = ctor
                    else:
                        g[k] = group.get(k, defaults[k])
            out.append(g)
    return out


def check_group(group: dict) -> None:
    style = STYLE_ALIASES.get(group["momentum_style"], group["momentum_style"])
    if style not in MOMENTUM_STYLES:
        raise ValueError(f"momentum_style must be one of {MOMENTUM_STYLES}, got {group['momentum_style']!r}")
    for key, allowed in (("scale_mode", SCALE_MODES), ("lmo", LMOS), ("aux", AUX), ("ns_method", ("ns", "svd")),
                         ("ns_batching", NS_BATCHING)):
        if group[key] not in allowed:
            raise ValueError(f"{key} must be one of {allowed}, got {group[key]!r}")
    resolve_coeffs(group["ns_coeffs"])
    if group["lr"] < 0 or group["weight_decay"] < 0 or group["ns_steps"] < 0 or group["momentum"] < 0:
        raise ValueError("lr, weight_decay, momentum and ns_steps must be >= 0")
    if group["use_muon"]:
        bad = [tuple(p.shape) for p in group["params"] if p.ndim < 2]
        if bad:
            raise ValueError(f"Muon groups need ndim >= 2 params; got shapes {bad} (use a use_muon=False group)")


def muon_param_names(model: nn.Module, exclude: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(muon_names, aux_names) of the trainable params: every ndim ≥ 2 param goes to Muon (seeds 000/004
    default, decision 000/A5) except the kinds in ``exclude`` ⊆ {"embedding", "first", "classifier"}: nn.Embedding
    weights, the first ndim ≥ 2 param in registration order (e.g. the stem conv) and the last nn.Linear's weight.
    """
    exclude = set(exclude)
    if not exclude <= set(EXCLUDABLE):
        raise ValueError(f"exclude must be a subset of {EXCLUDABLE}, got {sorted(exclude)}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    skip: set[int] = set()
    if "embedding" in exclude:
        skip |= {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    if "first" in exclude:
        skip |= {id(p) for _, p in [np for np in named if np[1].ndim >= 2][:1]}
    if "classifier" in exclude:
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        if linears:
            skip.add(id(linears[-1].weight))
    muon = [n for n, p in named if p.ndim >= 2 and id(p) not in skip]
    aux = [n for n, p in named if not (p.ndim >= 2 and id(p) not in skip)]
    return muon, aux


def split_muon_params(model: nn.Module, exclude: Annotated[list[str], OneOf(*EXCLUDABLE)] = (),
                      **aux_group_options) -> list[dict]:
    """Param groups for :class:`Muon`: ``[{"params": [...], "use_muon": True}, {"params": [...], "use_muon": False,
    **aux_group_options}]`` (empty groups dropped) using :func:`muon_param_names`'s rule."""
    params = dict(model.named_parameters())
    muon, aux = muon_param_names(model, exclude)
    groups = []
    if muon:
        groups.append({"params": [params[n] for n in muon], "use_muon": True})
    if aux:
        groups.append({"params": [params[n] for n in aux], "use_muon": False, **aux_group_options})
    return groups
