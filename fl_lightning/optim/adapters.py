"""State adapters: how a federated part reads and writes one optimizer's per-parameter state.

A part that moves optimizer state between clients and the server (averaged momenta, Sophia's h, SOAP's L and R,
Adam's v) never pokes ``opt.state[p]`` itself; it asks the optimizer's adapter (``adapter_for(opt)``):

    param_kind(p)            how p is updated ("muon", "sgd", "adamw", "adam", ...): parts select params by kind
    entries(p)               the complete list of state entries the optimizer keeps for p (None: unknown)
    export_state(p)          {entry: tensor} of what p holds now; numbers (Adam's ``step``) as 0-d float64 tensors
    import_state(p, values)  write some entries; the missing ones are completed from ``init_state(p)`` (a partial
                             state never reaches the optimizer: torch.optim.Adam would raise ``KeyError:
                             'exp_avg'``), numbers are cast back to the optimizer's own type, then ``refresh(p)``
    refresh(p, imported)     post-load hook (SOAP recomputes its eigenbases from the aligned L, R: decision 001/#5)
    theta(p)                 the entries of the preconditioner Θ that FedPAC aligns (FedPAC paper, Sec. 3.2), or None
    set_correction(...)      a per-parameter term added to the direction (only optimizers that support it)

Adapters are found by the optimizer class's ``state_adapter`` attribute (an optimizer of this package names its
own), then by the registry (``register_adapter``, MRO order), else :class:`StateAdapter`, which exports whatever
tensors and numbers are there and imports entries as given. Writing an entry the adapter cannot represent (a
dict, a string) is an error, never a silent drop.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError

# optimizers into which an adapter imported entries since optim.state zeroed them (optim.state.is_fresh)
TOUCHED: "weakref.WeakKeyDictionary[torch.optim.Optimizer, bool]" = weakref.WeakKeyDictionary()

__all__ = ["StateAdapter", "SGDAdapter", "AdamAdapter", "adapter_for", "register_adapter"]

_REGISTRY: dict[type, type] = {}


def register_adapter(*optimizer_classes: type):
    """Class decorator: ``@register_adapter(torch.optim.Adam)`` makes the adapter serve that class and subclasses."""
    def deco(adapter_cls: type) -> type:
        for cls in optimizer_classes:
            _REGISTRY[cls] = adapter_cls
        return adapter_cls
    return deco


def adapter_for(opt: torch.optim.Optimizer) -> "StateAdapter":
    """The adapter of ``opt`` (see the module docstring for the lookup order)."""
    cls = getattr(type(opt), "state_adapter", None)
    if cls is None:
        cls = next((_REGISTRY[k] for k in type(opt).__mro__ if k in _REGISTRY), StateAdapter)
    return cls(opt)


def _scalar_dtype() -> torch.dtype:
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class StateAdapter:
    """The generic adapter: any ``torch.optim.Optimizer`` whose per-parameter state is tensors and numbers."""

    supports_correction = False
    # whether a state of zeros (numbers 0) is what the optimizer would create afresh: then a client's state is reset
    # in place (one multi-tensor zero over the run's tensors, ``optim.state.reset_in_place``) instead of rebuilt
    zero_is_fresh = False
    # whether the ``step`` counters may be 0-d device tensors instead of Python numbers (a compiled step's)
    device_steps = False

    def __init__(self, opt: torch.optim.Optimizer):
        self.opt = opt

    def plan_step(self, first: bool) -> bool:
        """Called before each step of a compiled run, outside the traced frame (``first``: a client's first step):
        whether the coming step is the optimizer's regular one, the code every step runs. An optimizer whose step
        branches on its counts (SOAP: a fresh state's initialisation, a refresh every f steps) decides here, on the
        host, and the irregular steps run eagerly, so the compiled graph holds one variant and guards on no count."""
        return True

    # ------------------------------------------------------------------ queries
    def group_of(self, p: Tensor) -> dict:
        for group in self.opt.param_groups:
            if any(q is p for q in group["params"]):
                return group
        raise KeyError("parameter is not managed by this optimizer")

    def param_kind(self, p: Tensor) -> str:
        return type(self.opt).__name__.lower()

    def entries(self, p: Tensor) -> tuple[str, ...] | None:
        return None

    def init_state(self, p: Tensor) -> dict[str, Any]:
        """A complete fresh state for p (what the optimizer would create at its first step)."""
        return {}

    # ------------------------------------------------------------------ export / import
    def export_state(self, p: Tensor) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for k, v in self.opt.state.get(p, {}).items():
            if isinstance(v, Tensor) and v.ndim > 0:
                out[k] = v
            elif isinstance(v, (Tensor, bool, int, float)):
                out[k] = torch.tensor(float(v), dtype=torch.float64, device=p.device)
            else:
                raise ConfigError("state", f"{type(self.opt).__name__} keeps a {type(v).__name__} under {k!r}, which "
                                  "cannot travel as a tensor", "give the optimizer an adapter (fl_lightning.optim."
                                  "adapters.register_adapter) or do not move this entry")
        return out

    def _cast_scalar(self, p: Tensor, key: str, v: Tensor, like: Any):
        """A received 0-d value in the type the optimizer keeps for this entry (``like``: its fresh value)."""
        if isinstance(like, Tensor):
            return v.detach().to(dtype=like.dtype, device=like.device).clone()
        if isinstance(like, bool):
            return bool(v)
        if isinstance(like, int):
            return int(round(float(v)))
        return float(v)

    @torch.no_grad()
    def import_state(self, p: Tensor, values: Mapping[str, Tensor]) -> None:
        if not values:
            return
        TOUCHED[self.opt] = True
        state = self.opt.state[p]
        if not state:
            state.update(self.init_state(p))
        fresh = None
        for k, v in values.items():
            if not isinstance(v, Tensor):
                raise ConfigError("state", f"entry {k!r} for {type(self.opt).__name__} is a {type(v).__name__}, "
                                  "not a tensor", "send optimizer state as tensors")
            cur = state.get(k)
            if v.ndim == 0 and not (isinstance(cur, Tensor) and cur.ndim > 0):
                if cur is None:
                    fresh = self.init_state(p) if fresh is None else fresh
                    cur = fresh.get(k, torch.zeros((), dtype=_scalar_dtype()))
                if isinstance(cur, Tensor) and k in state and type(self)._cast_scalar is StateAdapter._cast_scalar:
                    cur.copy_(v)  # _cast_scalar's value into the same tensor (Adam's step: a compiled step
                else:             # guards on its identity, one recompile per client it was replaced for)
                    state[k] = self._cast_scalar(p, k, v, cur)
            elif isinstance(cur, Tensor) and cur.shape == v.shape:
                cur.copy_(v)
            else:
                state[k] = v.detach().to(device=p.device, dtype=p.dtype).clone()
        self.refresh(p, set(values))

    def theta(self, p: Tensor) -> tuple[str, ...] | None:
        """The entries that make up the preconditioner Θ (FedPAC paper, Sec. 3.2: SOAP's L, R; Sophia's h; Muon's m),
        the state FedPAC aligns; None when the optimizer has no such notion."""
        return None

    def refresh(self, p: Tensor, imported=()) -> None:
        """Recompute derived state after an import of the entries ``imported`` (nothing for first-order
        optimizers; SOAP recomputes the eigenbases of imported factors)."""

    def set_correction(self, corrections) -> None:
        raise ConfigError("optimizer", f"{type(self.opt).__name__} cannot add a correction to its direction",
                          "use an optimizer whose adapter supports corrections (fl_lightning.optim.Muon)")


@register_adapter(torch.optim.SGD)
class SGDAdapter(StateAdapter):
    """torch.optim.SGD: ``momentum_buffer`` when the group's momentum is non-zero."""

    def param_kind(self, p: Tensor) -> str:
        return "sgd"

    def entries(self, p: Tensor) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.group_of(p)["momentum"] != 0 else ()

    def init_state(self, p: Tensor) -> dict[str, Any]:
        return {k: torch.zeros_like(p, memory_format=torch.preserve_format) for k in self.entries(p)}


@register_adapter(torch.optim.Adam, torch.optim.AdamW)
class AdamAdapter(StateAdapter):
    """torch.optim.Adam / AdamW: ``step`` (a 0-d tensor, on the device when fused or capturable), ``exp_avg``,
    ``exp_avg_sq`` and, with amsgrad, ``max_exp_avg_sq``."""

    zero_is_fresh = True  # torch creates step 0 and zero moments

    def param_kind(self, p: Tensor) -> str:
        return "adamw" if isinstance(self.opt, torch.optim.AdamW) else "adam"

    def entries(self, p: Tensor) -> tuple[str, ...]:
        base = ("step", "exp_avg", "exp_avg_sq")
        return base + ("max_exp_avg_sq",) if self.group_of(p).get("amsgrad") else base

    def init_state(self, p: Tensor) -> dict[str, Any]:
        group = self.group_of(p)
        on_device = group.get("fused") or group.get("capturable")
        step = torch.zeros((), dtype=_scalar_dtype(), device=p.device if on_device else None)
        out: dict[str, Any] = {"step": step}
        for k in self.entries(p)[1:]:
            out[k] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return out
