"""What a cohort of K clients holds per client, counted before it is allocated: the refusal of a K that does not fit
(``check_cohort_memory``) and what ``trainer.cohort=auto``'s memory bound (``cohort/auto.py``) counts.

Per client (:func:`client_bytes`): its stacked weights and gradients; its optimizer state as the optimizer's adapter
makes it fresh (``init_state``, on the meta device: nothing allocated), so SOAP's Kronecker factors and eigenbases
count, whether one optimizer holds them stacked or each client's own does (``ClientByClient``); Muon's corrections
where a part writes them; the parts' per-client round tensors (their ``Round``'s ``rows`` fields, ``Part.cohort_rows``);
and the (K, P) buffer per-client clipping scales the gradients in (``cohort/rows.py``). The activations of K batches
come on top (``auto_cohort`` measures one client's).
"""
from __future__ import annotations

import copy
from types import SimpleNamespace

import torch
from torch import nn

from ..errors import ConfigError
from ..step.plan import in_step

KEY = "trainer.cohort"  # the key a cohort's refusals name

# a guess for an optimizer whose adapter cannot say its state: two moments per parameter (Adam's)
UNKNOWN_STATE_COPIES = 2
# per client without a strategy to count from: weights, gradients and two optimizer-state tensors per parameter
STACKED_COPIES = 4
AUTO_FRACTION = 0.8  # trainer.cohort=auto: the share of the device's free memory the stacked clients may take


def _trainable_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _meta_copy(module: nn.Module) -> nn.Module:
    """``module`` with its parameters and buffers on the meta device (shapes and dtypes only; nothing copied)."""
    memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
            for p in module.parameters()}
    memo.update({id(b): torch.empty_like(b, device="meta") for b in module.buffers()})
    return copy.deepcopy(module, memo)


def optimizer_state_bytes(opt_part, module: nn.Module) -> int | None:
    """One client's fresh optimizer state in bytes (its adapter's ``init_state`` of every parameter, on the meta
    device), or None where the optimizer part builds no optimizer this way or its adapter cannot say."""
    from ..optim.adapters import StateAdapter, adapter_for

    new = getattr(opt_part, "new_optimizer", None)
    if new is None:
        return None
    meta = _meta_copy(module)
    params = {n: p for n, p in meta.named_parameters() if p.requires_grad}
    try:
        opt = new(SimpleNamespace(module=meta, params=params, lr_factor=1.0))
        adapter = adapter_for(opt)
        if type(adapter) is StateAdapter:  # the generic adapter knows no state: unknown (stateless SGD has its own)
            return None
        total = 0
        for g in opt.param_groups:
            for p in g["params"]:
                for v in adapter.init_state(p).values():
                    if isinstance(v, torch.Tensor):
                        total += v.numel() * v.element_size()
        return total
    except Exception:  # noqa: BLE001 - an optimizer that cannot be built on the meta device: the guess
        return None


def client_bytes(strategy, module: nn.Module) -> int:
    """The bytes a cohort holds for each of its clients (the module docstring)."""
    model = _trainable_bytes(module)
    opt_part = strategy.optimizer_part()
    state = optimizer_state_bytes(opt_part, module)
    copies = 2  # the stacked weights and their gradients
    copies += sum(p.cohort_rows() for p in strategy.parts if p is not opt_part and in_step(p))
    if any("optimizer.corrections" in p.writes for p in strategy.parts if p is not opt_part):
        copies += 1  # Muon's corrections, one per client
    if strategy.grad_clip:
        copies += 1  # per-client clipping's (K, P) buffer
    return copies * model + (state if state is not None else UNKNOWN_STATE_COPIES * model)


def check_cohort_memory(size: int, module: nn.Module, available: int | None, strategy=None) -> None:
    """Refuse, in one line with the memory it would need, a cohort whose K clients' stacked tensors
    (:func:`client_bytes`; without ``strategy``, :data:`STACKED_COPIES` copies of the trainable parameters) do not fit
    the memory free on the device (``available`` bytes; None: unknown). The activations of K batches come on top."""
    if size <= 1 or available is None:
        return
    per_client = client_bytes(strategy, module) if strategy is not None else STACKED_COPIES * _trainable_bytes(module)
    if size * per_client > available:
        fit = max(1, available // max(1, per_client))
        raise ConfigError(KEY, f"{size} clients stacked need about {_gib(size * per_client)} for their weights, "
                          f"gradients, optimizer and round state, and {_gib(available)} is free",
                          f"use trainer.cohort={min(fit, size - 1)} or less")
