"""Muon's update as pure functions (Keller Jordan's ``muon.py`` shape): the momentum line, the direction with the
strategy's correction, the LMO with the per-matrix scale (the matrices orthogonalized in as few batches as
``ns_batching`` allows), the whole update of a list of matrices, the decoupled step, and the AdamW step of the
auxiliary parameters, each on many tensors with multi-tensor ops (``*_foreach``; equal bits to one tensor at a time).
:class:`~fl_lightning.optim.muon.Muon` is a thin class over them and the only caller outside the tests: ``Muon.step``
runs :func:`muon_update` on each group of Muon params, :func:`momentum_update_foreach` on aux momentum-SGD params and
:func:`adamw_update_foreach` on aux AdamW params, each followed by :func:`decoupled_step_foreach` (AdamW's is inside
it), and ``Muon.apply_direction`` runs :func:`lmo_update` (one tensor, with :func:`decoupled_step`). Strategy parts reach this math through the optimizer
(``Muon.apply_direction``, the momentum buffers); see ``muon.py``'s docstring for the equations."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .newton_schulz import as_matrix, matrix_shape, orthogonalize
from .scalars import add_scaled_, foreach_add_scaled_

MOMENTUM_STYLES = ("ema", "ema_beta", "heavy_ball")
STYLE_ALIASES = {"lerp": "ema_beta", "torch": "ema_beta", "ema_alpha": "ema", "sum": "heavy_ball"}
SCALE_MODES = ("spectral", "moonlight", "none")
LMOS = ("spectral", "neg_identity")
AUX = ("sgd", "adamw")
EXCLUDABLE = ("embedding", "first", "classifier")


def momentum_coeffs(style: str, momentum: float) -> tuple[float, float]:
    """(decay, gain) with M ← decay·M + gain·g for a momentum style (see module docstring)."""
    style = STYLE_ALIASES.get(style, style)
    if style == "ema":
        return 1.0 - momentum, momentum
    if style == "ema_beta":
        return momentum, 1.0 - momentum
    if style == "heavy_ball":
        return momentum, 1.0
    raise ValueError(f"momentum_style must be one of {MOMENTUM_STYLES}, got {style!r}")


def update_scale(mode: str, rows: int, cols: int) -> float:
    """Per-matrix multiplier on the orthogonalized update (seed 000 Sec. 7.1; decision 000/A1 in docs/decisions.md)."""
    if mode == "spectral":
        return math.sqrt(max(1.0, rows / cols))
    if mode == "moonlight":
        return 0.2 * math.sqrt(max(rows, cols))
    if mode == "none":
        return 1.0
    raise ValueError(f"scale_mode must be one of {SCALE_MODES}, got {mode!r}")


def momentum_update(grad: Tensor, buf: Tensor, style: str, momentum: float, nesterov: bool) -> Tensor:
    """The momentum line, in place on ``buf``, and the direction: M ← decay·M + gain·g (``momentum_coeffs``), then
    D = gain·g + decay·M with Nesterov, else D = M. Heavy-ball is torch.optim.SGD's arithmetic, the EMA styles
    torch.optim.Muon's (``buf.lerp_``), bit for bit. ``grad`` is not modified."""
    style = STYLE_ALIASES.get(style, style)
    decay, gain = momentum_coeffs(style, momentum)
    if style == "heavy_ball":
        buf.mul_(decay).add_(grad)
        return grad.add(buf, alpha=decay) if nesterov else buf
    buf.lerp_(grad, gain)
    return grad.lerp(buf, decay) if nesterov else buf


def momentum_update_foreach(grads: Sequence[Tensor], bufs: Sequence[Tensor], style: str, momentum: float,
                            nesterov: bool) -> list[Tensor]:
    """:func:`momentum_update` on many tensors with multi-tensor ops, the same arithmetic in the same order (equal
    bits); returns the directions."""
    style = STYLE_ALIASES.get(style, style)
    decay, gain = momentum_coeffs(style, momentum)
    grads, bufs = list(grads), list(bufs)
    if style == "heavy_ball":
        torch._foreach_mul_(bufs, decay)
        torch._foreach_add_(bufs, grads)
        return list(torch._foreach_add(grads, bufs, alpha=decay)) if nesterov else bufs
    torch._foreach_lerp_(bufs, grads, gain)
    return list(torch._foreach_lerp(grads, bufs, decay)) if nesterov else bufs


def with_corrections(directions: list[Tensor], corrections: Sequence[Tensor | None]) -> list[Tensor]:
    """D + C for each direction that has a correction (one multi-tensor add), the others as they are."""
    idx = [i for i, c in enumerate(corrections) if c is not None]
    if not idx:
        return list(directions)
    out = list(directions)
    for i, d in zip(idx, torch._foreach_add([directions[i] for i in idx], [corrections[i] for i in idx])):
        out[i] = d
    return out


def with_correction(d: Tensor, correction: Tensor | None) -> Tensor:
    """D + C out of place (the stored momentum never holds C); D itself when there is no correction."""
    return d if correction is None else d + correction


def lmo_update(directions: Sequence[Tensor], *, lmo: str = "spectral", scale_mode: str = "spectral",
               ns_steps: int = 5, ns_coeffs: str | tuple = "muon", ns_method: str = "ns", ns_eps: float = 1e-7,
               ns_dtype: torch.dtype | str | None = None, ns_batching: str = "auto") -> list[tuple[Tensor, float]]:
    """(O, s) for each direction D of a Muon param, in the given order: O = orthogonalize(D) (in as few batches as
    ``ns_batching`` allows, :func:`orthogonalize_batched`), or O = D with ``lmo="neg_identity"``; s =
    :func:`update_scale` of D's matrix shape. The step is X ← X·(1 − lr·wd) − (lr·s)·O, i.e. ``decoupled_step(p, O, lr, lr * s, wd)``."""
    if lmo == "spectral":
        outs = orthogonalize_batched(list(directions), ns_batching, steps=ns_steps, coeffs=ns_coeffs,
                                     method=ns_method, eps=ns_eps, dtype=ns_dtype)
    elif lmo == "neg_identity":
        outs = list(directions)
    else:
        raise ValueError(f"lmo must be one of {LMOS}, got {lmo!r}")
    return [(o, update_scale(scale_mode, *matrix_shape(d))) for o, d in zip(outs, directions)]


def muon_update(grads: Sequence[Tensor], momenta: Sequence[Tensor], beta: float = 0.95, *, style: str = "ema_beta",
                nesterov: bool = True, corrections: Sequence[Tensor | None] | None = None, lmo: str = "spectral",
                scale_mode: str = "spectral", ns_steps: int = 5, ns_coeffs: str | tuple = "muon", ns_method: str = "ns",
                ns_eps: float = 1e-7, ns_dtype: torch.dtype | str | None = None,
                ns_batching: str = "auto") -> list[tuple[Tensor, float]]:
    """The Muon update of a list of matrices (Keller Jordan's ``muon_update``, for many matrices at once): updates
    each of ``momenta`` in place (:func:`momentum_update_foreach`, then ``corrections[i]`` added to the i-th
    direction) and returns (O, s) per matrix (:func:`lmo_update`), applied as X ← X·(1 − lr·wd) − (lr·s)·O:
    ``decoupled_step(p, O, lr, lr * s, wd)``. The scale s is folded into the learning rate rather than multiplied
    into O. ``Muon.step`` calls this once per group of Muon params; ``grads`` are not modified."""
    if corrections is None:
        corrections = [None] * len(grads)
    if not (len(grads) == len(momenta) == len(corrections)):
        raise ValueError(f"{len(grads)} gradients, {len(momenta)} momenta and {len(corrections)} corrections")
    # the momentum line and the corrections for all matrices at once (momentum_update's arithmetic, equal bits)
    directions = with_corrections(momentum_update_foreach(grads, momenta, style, beta, nesterov), corrections)
    return lmo_update(directions, lmo=lmo, scale_mode=scale_mode, ns_steps=ns_steps, ns_coeffs=ns_coeffs,
                      ns_method=ns_method, ns_eps=ns_eps, ns_dtype=ns_dtype, ns_batching=ns_batching)


NS_BATCHING = ("auto", "shape", "pad")
PAD_DEVICES = {"cuda"}  # where ``batching="auto"`` pads: launch-bound devices (tools/opcount.py adds "cpu" to count)


def orthogonalize_batched(directions: list[Tensor], batching: str = "auto", **ns) -> list[Tensor]:
    """orthogonalize(D) of each direction in as few Newton–Schulz runs as ``batching`` allows, same order as given;
    each matrix is normalized on its own, so the result is the per-matrix one up to float rounding.

    ``"shape"``: same-shape matrices stacked into one run; a 3-D direction (already a batch) runs on its own.
    ``"pad"``: every matrix of a dtype and device in ONE run (:func:`orthogonalize_padded`): the GPU's way, where a
    step is bound by kernel launches, not arithmetic (as Keller Jordan's and Dion's batched Muon). ``"auto"``: pad on
    the devices of :data:`PAD_DEVICES` (CUDA), per shape elsewhere (on a CPU the padding's extra arithmetic costs
    1.6–1.8x for ViT-Tiny's matrices, and the digests recorded there stay as they are)."""
    if batching not in NS_BATCHING:
        raise ValueError(f"Newton-Schulz batching must be one of {NS_BATCHING}, got {batching!r}")
    if not directions:
        return []
    if ns.get("method", "ns") == "ns" and (
            batching == "pad" or (batching == "auto" and directions[0].device.type in PAD_DEVICES)):
        return orthogonalize_padded(directions, **ns)
    out: list[Tensor | None] = [None] * len(directions)
    by_shape: dict[tuple, list[int]] = {}
    for i, d in enumerate(directions):
        by_shape.setdefault((matrix_shape(d), d.dtype, d.device) if d.ndim != 3 else ("3-D", i), []).append(i)
    for idx in by_shape.values():
        if len(idx) == 1:
            out[idx[0]] = orthogonalize(directions[idx[0]], **ns)
            continue
        o = orthogonalize(torch.stack([directions[i].reshape(matrix_shape(directions[i])) for i in idx]), **ns)
        for i, o_i in zip(idx, o.unbind(0)):
            out[i] = o_i.reshape(directions[i].shape)
    return out


def orthogonalize_padded(directions: list[Tensor], **ns) -> list[Tensor]:
    """orthogonalize(D) of every direction (of one dtype and device) in one Newton–Schulz run, by zero-padding.

    Each matrix is taken in its wide orientation (r ≤ c; a tall one transposed, which is exact: (G Gᵀ)^j G =
    G (Gᵀ G)^j) and placed in the top-left corner of an (R, C) block of zeros, R and C the largest r and c. Padding
    with zeros changes nothing but float rounding: X = [[G, 0], [0, 0]] has the Frobenius norm of G, X Xᵀ =
    [[G Gᵀ, 0], [0, 0]], so every Newton–Schulz iterate keeps the block form and its corner is G's iterate (exactly
    zero elsewhere, in bf16 too). A 3-D direction contributes its matrices as consecutive entries. The results are
    views into the one output batch (its corners), reshaped to each direction's shape. Two multi-tensor ops bring
    the matrices in (``zeros``, ``_foreach_copy_``), one Newton–Schulz run of 3 matmuls per iteration follows."""
    out: list[Tensor | None] = [None] * len(directions)
    by_kind: dict[tuple, list[int]] = {}
    for i, d in enumerate(directions):
        by_kind.setdefault((d.dtype, d.device), []).append(i)
    for idx in by_kind.values():
        mats = []  # (direction index, wide 3-D view (b, r, c), transposed)
        for i in idx:
            m = as_matrix(directions[i])
            m = m.unsqueeze(0) if m.ndim == 2 else m
            tall = m.size(-2) > m.size(-1)
            mats.append((i, m.mT if tall else m, tall))
        R = max(m.size(-2) for _, m, _ in mats)
        C = max(m.size(-1) for _, m, _ in mats)
        X = directions[idx[0]].new_zeros(sum(m.size(0) for _, m, _ in mats), R, C)
        corners, at = [], 0
        for _, m, _ in mats:
            corners.append(X[at:at + m.size(0), :m.size(-2), :m.size(-1)])
            at += m.size(0)
        torch._foreach_copy_(corners, [m for _, m, _ in mats])
        O = orthogonalize(X, **ns)
        at = 0
        for i, m, tall in mats:
            o = O[at:at + m.size(0), :m.size(-2), :m.size(-1)]
            at += m.size(0)
            o = o.mT if tall else o
            out[i] = o.reshape(directions[i].shape)
    return out


def decoupled_step_foreach(params: Sequence[Tensor], updates: Sequence[tuple[Tensor, float]], lr,
                           weight_decay: float) -> None:
    """:func:`decoupled_step` for many matrices, ``updates`` their (O, s): the weight decay in one multi-tensor op,
    the step in one per distinct scale s (same-shape matrices share it); equal bits."""
    params = list(params)
    if weight_decay != 0:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    by_scale: dict[float, tuple[list[Tensor], list[Tensor]]] = {}
    for p, (o, s) in zip(params, updates, strict=True):
        ps, os_ = by_scale.setdefault(s, ([], []))
        ps.append(p)
        os_.append(o)
    for s, (ps, os_) in by_scale.items():
        foreach_add_scaled_(ps, os_, -(lr * s))


def decoupled_step(p: Tensor, o: Tensor, lr: float, lr_p: float, weight_decay: float) -> None:
    """X ← X·(1 − lr·wd) − lr_p·O in place: decoupled weight decay at the unscaled lr (as torch.optim.Muon / AdamW),
    then the step (lr_p: lr with Muon's per-matrix scale folded in)."""
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    add_scaled_(p, o, -lr_p)


def adamw_update_foreach(params: list[Tensor], grads: list[Tensor], states: list[dict], lr,
                         betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """torch.optim.AdamW's step (decoupled weight decay, bias correction) on many tensors in place, with multi-tensor
    ops (``torch._foreach_*``: one launch per op for the group on a GPU instead of one per tensor); equal bits to
    torch's one-tensor loop. ``states[i]`` holds ``step``, ``exp_avg``, ``exp_avg_sq`` (created at the first step);
    tensors are taken in runs of one step count (all of a group, in practice). Step counters that are 0-d tensors
    (a compiled step's: ``compiled_step.steps_as_tensors``) are counted and read on the device, as torch's
    ``capturable`` AdamW does: one graph for every step, no guard on the count."""
    beta1, beta2 = betas
    if states and isinstance(states[0].get("step"), Tensor):
        return _adamw_tensor_steps(params, grads, states, lr, betas, eps, weight_decay)
    for st, p in zip(states, params):
        if "step" not in st:
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        st["step"] += 1
    by_step: dict[int, list[int]] = {}
    for i, st in enumerate(states):
        by_step.setdefault(st["step"], []).append(i)
    for t, idx in by_step.items():
        ps, gs = [params[i] for i in idx], [grads[i] for i in idx]
        ms, vs = [states[i]["exp_avg"] for i in idx], [states[i]["exp_avg_sq"] for i in idx]
        torch._foreach_mul_(ps, 1 - lr * weight_decay)
        torch._foreach_lerp_(ms, gs, 1 - beta1)
        torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, gs, gs, value=1 - beta2)
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, math.sqrt(1 - beta2**t))
        torch._foreach_add_(denom, eps)
        a = -lr / (1 - beta1**t)
        if isinstance(a, Tensor):
            torch._foreach_add_(ps, torch._foreach_mul(torch._foreach_div(ms, denom), a))
        else:
            torch._foreach_addcdiv_(ps, ms, denom, value=a)


def _adamw_tensor_steps(params, grads, states, lr, betas, eps, weight_decay) -> None:
    """:func:`adamw_update_foreach` with 0-d tensor step counters: the bias corrections 1 − βᵗ computed on the
    device (torch's capturable AdamW arithmetic)."""
    beta1, beta2 = betas
    steps = [st["step"] for st in states]
    ms, vs = [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states]
    torch._foreach_add_(steps, 1)
    torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_lerp_(ms, grads, 1 - beta1)
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
    bc1 = torch._foreach_pow(beta1, steps)
    torch._foreach_sub_(bc1, 1)  # βᵗ − 1 = −(1 − βᵗ)
    bc2 = torch._foreach_pow(beta2, steps)
    torch._foreach_sub_(bc2, 1)
    torch._foreach_neg_(bc2)
    torch._foreach_sqrt_(bc2)  # sqrt(1 − β2ᵗ)
    torch._foreach_div_(bc1, lr)  # −(1 − β1ᵗ)/lr = 1 / step size (negative: the step descends)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_div_(denom, bc2)
    torch._foreach_add_(denom, eps)
    torch._foreach_mul_(denom, bc1)
    torch._foreach_addcdiv_(params, ms, denom)
