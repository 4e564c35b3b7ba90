"""Muon for a whole model: orthogonalized momentum on matrices, momentum SGD or AdamW on the rest.

One ``torch.optim.Optimizer`` holds both kinds of parameter groups (flag ``use_muon``), in the style of Keller
Jordan's ``MuonWithAuxAdam``. Per step, for a Muon parameter X with gradient g (seed 000 = FedMuon, anonymous,
under review: Sec. 2 and Alg. 1 lines 8-9; seed 003 = Zhang & Gao, "On Provable Benefits of Muon in Federated
Learning", Eq. (4.1); seed 004 = Liu, Shang et al., "FedMuon: Accelerating Federated Learning with Matrix
Orthogonalization", Eq. (2); docs/decisions.md lists the seeds; the arithmetic is the pure functions of
``muon_math.py``, which ``step`` calls, each on all tensors of a group at once: ``muon_update`` on Muon params,
``momentum_update_foreach`` or ``adamw_update_foreach`` on the aux params, ``decoupled_step_foreach``):

    M ← decay·M + gain·g                                   momentum (``momentum_style``, table below)
    D ← M            or, with nesterov, gain·g + decay·M   the direction
    D ← D + C        C = the strategy's correction for X (``set_correction``; e.g. C_glob - C_i in seed 000)
    O ← orthogonalize(D)   ≈ U Vᵀ  (or O ← D when ``lmo="neg_identity"``, i.e. "remove the LMO", seed 000 Sec. 4)
    X ← X·(1 - lr·wd) - lr·scale(rows, cols)·O             decoupled weight decay, then the step X + lr·s·lmo(D)

Auxiliary (non-Muon) groups: ``aux="sgd"`` uses the same momentum/direction/correction lines and then
X ← X·(1 - lr·wd) - lr·D; ``aux="adamw"`` is torch.optim.AdamW (decoupled wd, bias correction; a correction
is added to the gradient before the moments, SCAFFOLD style).

momentum_style (``momentum`` is the coefficient *in that style's own notation*):

    "ema"        α: M ← (1-α)M + α g       seed 000 (α = 0.05 ≈ Muon's β = 0.95; α = 1 means no momentum); seed 003
                                           Eq. (4.1) with α = its β
    "ema_beta"   β: M ← βM + (1-β) g       Keller Jordan / torch.optim.Muon (``buf.lerp_(g, 1-β)``); alias "lerp"
    "heavy_ball" β: M ← βM + g             seed 004 paper (Eq. (2)), torch.optim.SGD(momentum=β)
    nesterov:  D = gain·g + decay·M (after the update), i.e. g.lerp(M, β) for "ema_beta" (torch.optim.Muon),
               g + βM for "heavy_ball" (torch.optim.SGD), g.lerp(M, 1-α) for "ema".

The styles differ for Muon params only by a positive factor on M, which orthogonalization removes (scale
invariance), but they differ for SGD params and whenever a correction or ``neg_identity`` is used.

scale_mode (rows, cols = the matrix view; conv (out, in, kh, kw) → (out, in·kh·kw); 3-D → last two dims):
"spectral" = sqrt(max(1, rows/cols)) (Keller Jordan; torch "original"), "moonlight" = 0.2·sqrt(max(rows, cols))
(Liu et al. 2025, "Muon is scalable", arXiv 2502.16982; torch "match_rms_adamw"; seed 000's default: its Sec. 7.1
follows Liu et al. without the formula, decision 000/A1), "none" = 1 (seed 003 Alg. 1).

Hooks for federated strategies (all per parameter, keyed by the Parameter object):
* momentum: ``opt.state[p]["momentum_buffer"]`` (Muon and aux-SGD params; same shape/dtype/device as p, created
  as zeros at the first step). Read it, overwrite it, or ``opt.set_momentum({p: M})`` to copy values in
  (e.g. warm start from the server average M̄, seeds 003/004). AdamW params keep "exp_avg", "exp_avg_sq", "step".
* correction: ``opt.set_correction({p: C})`` adds C to the direction before the LMO (and before the SGD step)
  without touching the stored momentum; persists across steps until replaced / ``set_correction(None)``.
  Seed 000 FedMuon: C = C_glob - C_i gives lmo(M_i - C_i + C_glob). Tensors are kept by reference, not copied.
* ``lmo="neg_identity"`` replaces orthogonalize(D) by D (with ``momentum_style="ema"``, α = 1, ``scale_mode="none"``
  and a correction, FedMuon becomes the SCAFFOLD variant of seed 000 Sec. 4, decision 000/A20); ``ns_steps=0`` gives
  D/||D||_F.
p.grad is never modified. Corrections are not part of ``state_dict()`` (they belong to the strategy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated

import torch
from torch import Tensor

from ..config import Betas, LearningRate, NonNegative, OneOf, Range
from .adapters import StateAdapter
from .muon_groups import build_groups, check_group, muon_param_names, split_muon_params
from .muon_math import (NS_BATCHING, adamw_update_foreach, decoupled_step, decoupled_step_foreach, lmo_update,
                        momentum_coeffs, momentum_update, momentum_update_foreach, muon_update, update_scale,
                        with_correction, with_corrections)
from .newton_schulz import NS_COEFFS

__all__ = ["Muon", "MuonAdapter", "split_muon_params", "muon_param_names", "momentum_coeffs", "momentum_update",
           "muon_update", "update_scale"]


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al. 2024) with an auxiliary SGD/AdamW for non-matrix params; see the module docstring.

    params: an iterable of tensors, or of param-group dicts. A group with ``use_muon`` is taken as is (Muon
    groups must hold only ndim ≥ 2 tensors); a group without it is split by ndim (≥ 2 → Muon, else aux).
    Aux groups take ``lr``/``momentum``/``weight_decay``/``nesterov`` from ``aux_*`` (group key, then constructor
    argument) and fall back to the Muon values when those are None. Defaults follow torch.optim.Muon (except
    weight_decay = 0); paper settings come from the configs (e.g. seed 000: momentum_style="ema", momentum=0.05,
    nesterov=False, ns_coeffs="polar_express", scale_mode="moonlight"). ``ns_batching``: how the matrices of a group
    meet in Newton–Schulz (``muon_math.orthogonalize_batched``): ``auto`` = all in one zero-padded batch on CUDA, per
    shape elsewhere; ``pad``; ``shape``.
    """

    def __init__(
        self,
        params: Iterable,
        lr: LearningRate = 1e-3,
        momentum: Annotated[float, Range(0.0, 1.0)] = 0.95,
        momentum_style: str = "ema_beta",
        nesterov: bool = True,
        ns_steps: Annotated[int, Range(0, 1000)] = 5,
        ns_coeffs: Annotated[str | tuple[float, float, float], Range(words=tuple(NS_COEFFS))] = "muon",
        ns_method: str = "ns",
        ns_dtype: Annotated[torch.dtype | str | None, OneOf("auto", "float32", "bfloat16", "float16", "float64")] = None,
        ns_eps: NonNegative = 1e-7,
        ns_batching: Annotated[str, OneOf(*NS_BATCHING)] = "auto",
        scale_mode: str = "spectral",
        weight_decay: NonNegative = 0.0,
        lmo: str = "spectral",
        aux: str = "sgd",
        aux_lr: LearningRate | None = None,
        aux_momentum: Annotated[float, Range(0.0, 1.0)] | None = None,
        aux_nesterov: bool | None = None,
        aux_weight_decay: NonNegative | None = None,
        aux_betas: Betas = (0.9, 0.999),
        aux_eps: NonNegative = 1e-8,
    ):
        defaults = dict(lr=lr, momentum=momentum, momentum_style=momentum_style, nesterov=nesterov,
                        weight_decay=weight_decay, ns_steps=ns_steps, ns_coeffs=ns_coeffs, ns_method=ns_method,
                        ns_dtype=ns_dtype, ns_eps=ns_eps, ns_batching=ns_batching, scale_mode=scale_mode, lmo=lmo,
                        aux=aux, betas=tuple(aux_betas), eps=aux_eps)
        aux_args = dict(lr=aux_lr, momentum=aux_momentum, nesterov=aux_nesterov, weight_decay=aux_weight_decay)
        super().__init__(build_groups(params, defaults, aux_args), defaults)
        for group in self.param_groups:
            check_group(group)
        self.corrections: dict[Tensor, Tensor] = {}
        self.rows = 0  # trainer.cohort: K > 0 when each param stacks K clients' tensors (fl_lightning/cohort/)

    # trainer.cohort: the orthogonalized matrices are each client's own rows (``rows``); the rest is elementwise
    cohort_form = "rows"

    # ----------------------------------------------------------------- strategy hooks
    def set_correction(self, corrections: Mapping[Tensor, Tensor] | None) -> None:
        """Replace the per-param corrections added to the direction before the LMO (None or {} clears them)."""
        corrections = dict(corrections or {})
        for p, c in corrections.items():
            if c.shape != p.shape:
                raise ValueError(f"correction of shape {tuple(c.shape)} for a param of shape {tuple(p.shape)}")
        self.corrections = corrections

    def momentum_buffer(self, p: Tensor) -> Tensor:
        """The live momentum tensor of p (created as zeros if absent); in-place edits change the optimizer."""
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state["momentum_buffer"]

    def set_momentum(self, buffers: Mapping[Tensor, Tensor]) -> None:
        """Copy values into the momentum buffers of the given params (e.g. the server's M̄ at round start)."""
        with torch.no_grad():
            for p, m in buffers.items():
                self.momentum_buffer(p).copy_(m)

    def param_kind(self, p: Tensor) -> str:
        """'muon', 'sgd' or 'adamw': how p is updated."""
        group = self._group_of(p)
        return "muon" if group["use_muon"] else group["aux"]

    # ----------------------------------------------------------------- the step (muon_math's pure functions)
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("Muon does not support sparse gradients")
            lr, wd = group["lr"], group["weight_decay"]
            if group["use_muon"]:  # same-shape matrices are orthogonalized as one batch
                grads, bufs = [p.grad for p in params], [self.momentum_buffer(p) for p in params]
                corrs = [self.corrections.get(p) for p in params]
                if self.rows:  # a cohort: each client's matrix on its own, all in the same batches
                    params, grads, bufs, corrs = (_rows(ts, self.rows) for ts in (params, grads, bufs, corrs))
                updates = muon_update(grads, bufs, group["momentum"], corrections=corrs,
                                      **_direction_args(group), **_lmo_args(group))
                decoupled_step_foreach(params, updates, lr, wd)
            elif group["aux"] == "adamw":  # a correction enters the gradient (SCAFFOLD style); all tensors at once
                adamw_update_foreach(params, [with_correction(p.grad, self.corrections.get(p)) for p in params],
                                     [self.state[p] for p in params], lr, group["betas"], group["eps"], wd)
            else:  # momentum SGD: the same direction, no LMO, the plain lr; all tensors at once (equal bits)
                directions = with_corrections(
                    momentum_update_foreach([p.grad for p in params], [self.momentum_buffer(p) for p in params],
                                            _direction_args(group)["style"], group["momentum"], group["nesterov"]),
                    [self.corrections.get(p) for p in params])
                decoupled_step_foreach(params, [(d, 1.0) for d in directions], lr, wd)
        return loss

    @torch.no_grad()
    def apply_direction(self, p: Tensor, d: Tensor) -> None:
        """One step of p along a given direction D (e.g. the momentum as received, seed 003 Alg. 1 line 4): the
        correction, the LMO, weight decay and the scaled step, exactly as in ``step`` after the momentum line (a
        non-Muon param: D + C at the plain lr); the stored momentum is not touched."""
        group = self._group_of(p)
        lr, wd = group["lr"], group["weight_decay"]
        d = with_correction(d, self.corrections.get(p))
        if group["use_muon"]:
            [(o, s)] = lmo_update([d], **_lmo_args(group))
            decoupled_step(p, o, lr, lr * s, wd)
        else:
            decoupled_step(p, d, lr, lr, wd)

    def _group_of(self, p: Tensor) -> dict:
        for group in self.param_groups:
            if any(q is p for q in group["params"]):
                return group
        raise KeyError("parameter is not managed by this optimizer")


def _rows(ts: list, k: int) -> list:
    """Each stacked tensor's K rows (views), client-major within a tensor; None stays None for every row."""
    return [None if t is None else t[i] for t in ts for i in range(k)]


def _direction_args(group: dict) -> dict:
    return dict(style=group["momentum_style"], nesterov=group["nesterov"])


def _lmo_args(group: dict) -> dict:
    return dict(lmo=group["lmo"], scale_mode=group["scale_mode"], ns_steps=group["ns_steps"],
                ns_coeffs=group["ns_coeffs"], ns_method=group["ns_method"], ns_eps=group["ns_eps"],
                ns_dtype=group["ns_dtype"], ns_batching=group.get("ns_batching", "auto"))


class MuonAdapter(StateAdapter):
    """Muon's state for federated parts: ``momentum_buffer`` for Muon and aux-SGD params; ``step`` (an int),
    ``exp_avg``, ``exp_avg_sq`` for aux-AdamW params; corrections enter the direction (``set_correction``)."""

    supports_correction = True
    zero_is_fresh = True  # momenta created as zeros; AdamW's step 0 and zero moments
    device_steps = True  # muon_math.adamw_update_foreach takes 0-d tensor counts

    def param_kind(self, p: Tensor) -> str:
        return self.opt.param_kind(p)

    def entries(self, p: Tensor) -> tuple[str, ...]:
        return ("step", "exp_avg", "exp_avg_sq") if self.param_kind(p) == "adamw" else ("momentum_buffer",)

    def theta(self, p: Tensor) -> tuple[str, ...]:
        """Θ = {m} (FedPAC paper, Sec. 3.2): the momentum of Muon (and aux-SGD) params; aux-AdamW params have none."""
        return () if self.param_kind(p) == "adamw" else ("momentum_buffer",)

    def init_state(self, p: Tensor) -> dict:
        zeros = lambda: torch.zeros_like(p, memory_format=torch.preserve_format)  # noqa: E731
        if self.param_kind(p) == "adamw":
            return {"step": 0, "exp_avg": zeros(), "exp_avg_sq": zeros()}
        return {"momentum_buffer": zeros()}

    def set_correction(self, corrections) -> None:
        self.opt.set_correction(corrections)


Muon.state_adapter = MuonAdapter
