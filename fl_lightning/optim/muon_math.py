"""Muon's update as pure functions (Keller Jordan's ``muon.py`` shape): the momentum line, the per-matrix scale,
the whole update of one matrix, same-shape matrices orthogonalized as one batch, the decoupled step, and the AdamW
step of the auxiliary parameters. :class:`~fl_lightning.optim.muon.Muon` is these, line by line; parts and server
optimizers call them directly (see ``muon.py``'s docstring for the equations)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .newton_schulz import matrix_shape, orthogonalize

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


def muon_update(grad: Tensor, momentum: Tensor, beta: float = 0.95, *, style: str = "ema_beta",
                nesterov: bool = True, correction: Tensor | None = None, ns_steps: int = 5,
                ns_coeffs: str | tuple = "muon", ns_method: str = "ns", ns_eps: float = 1e-7,
                ns_dtype: torch.dtype | str | None = None, scale_mode: str = "spectral") -> Tensor:
    """The Muon update of one matrix, as a pure function (Keller Jordan's ``muon_update``): updates ``momentum`` in
    place and returns s·orthogonalize(D + correction), to be applied as X ← X − lr·update. ``Muon.step`` is this
    line by line (it folds s into the learning rate); parts and server optimizers reuse it without faking p.grad."""
    d = momentum_update(grad, momentum, style, beta, nesterov)
    if correction is not None:
        d = d + correction
    o = orthogonalize(d, steps=ns_steps, coeffs=ns_coeffs, method=ns_method, eps=ns_eps, dtype=ns_dtype)
    s = update_scale(scale_mode, *matrix_shape(grad))
    return o if s == 1.0 else o * s


def orthogonalize_batched(directions: list[Tensor], **ns) -> list[Tensor]:
    """orthogonalize(D) of each direction, same-shape matrices stacked into one Newton–Schulz run (each matrix is
    normalized on its own, so the result is the per-matrix one up to float rounding); same order as given."""
    out: list[Tensor | None] = [None] * len(directions)
    by_shape: dict[tuple, list[int]] = {}
    for i, d in enumerate(directions):
        by_shape.setdefault((matrix_shape(d), d.dtype, d.device), []).append(i)
    for idx in by_shape.values():
        if len(idx) == 1:
            out[idx[0]] = orthogonalize(directions[idx[0]], **ns)
            continue
        o = orthogonalize(torch.stack([directions[i].reshape(matrix_shape(directions[i])) for i in idx]), **ns)
        for i, o_i in zip(idx, o.unbind(0)):
            out[i] = o_i.reshape(directions[i].shape)
    return out


def decoupled_step(p: Tensor, o: Tensor, lr: float, lr_p: float, weight_decay: float) -> None:
    """X ← X·(1 − lr·wd) − lr_p·O in place: decoupled weight decay at the unscaled lr (as torch.optim.Muon / AdamW),
    then the step (lr_p: lr with Muon's per-matrix scale folded in)."""
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    p.add_(o, alpha=-lr_p)


def adamw_update(p: Tensor, grad: Tensor, state: dict, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float) -> None:
    """torch.optim.AdamW's single-tensor step on ``p`` in place (decoupled weight decay, bias correction); ``state``
    holds ``step``, ``exp_avg``, ``exp_avg_sq`` (created at the first step)."""
    beta1, beta2 = betas
    if "step" not in state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["step"] += 1
    t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
    p.mul_(1 - lr * weight_decay)
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
    p.addcdiv_(m, denom, value=-lr / (1 - beta1**t))
