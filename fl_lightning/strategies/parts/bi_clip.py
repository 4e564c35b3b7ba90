"""BiClip: coordinate-wise two-sided clipping of the client's gradients (Lee, Zaheer & Li, "Efficient Distributed
Optimization under Heavy-Tailed Noise" (TailOPT), 2025, arXiv 2502.04164; the client side of Adam-BiClip, one of the
baselines seed 003 (Zhang & Gao) names in Sec. 7).

Every local step, before the local optimizer (SGD, lr η_l):

    g_j ← sign(g_j) · clamp(|g_j|, d_t, u_t),     d_t = d · t^γ,   u_t = u · t^ζ,   t = round + 1

clipped from BELOW to d_t (small coordinates are raised, so the step is partly sign-like) and from ABOVE to u_t
(heavy-tailed coordinates are cut). An exactly zero coordinate stays zero (sign 0). The schedules t^γ, t^ζ follow a
public re-implementation of the official code (BiClipSGD_Full: thresholds × global_epoch^exponent, t ≥ 1;
docs/decisions.md, seed 003 baselines, BiClip rows); the paper gives no threshold values: d, u (and γ, ζ) are TUNED
values. That re-implementation's lr ∝ t^ν is not here: the run's learning-rate schedule (``fl.lr_schedule``) plays
that role. The "Adam" outer optimizer is the server's (``ModelAverage(server_opt=Adam)``, as FedAdam).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch

from ...config import Range, Validate
from ..base import ClientContext, Part
from ..round_state import RoundState, shared


def lower_below_upper(lower, upper) -> bool:
    """The lower threshold d may not exceed the upper one u (a rule tying two arguments: on both, so the refusal
    names the one set away from its default)."""
    return float(lower) <= float(upper)


ORDERED = Validate(lower_below_upper, "need 0 <= lower <= upper, got lower={lower}, upper={upper}",
                   "set lower below upper (e.g. lower=1e-4 upper=1)")
Threshold = Annotated[float, Range(0.0), ORDERED]


class BiClip(Part):
    reads = ("grads",)  # what its hooks read of the client's training tensors
    writes = ("grads",)  # what its hooks change of the client's training tensors
    # its step: elementwise ops on the gradients (one client's or a cohort's stacked alike), reading the round's two
    # thresholds (a captured step's constants, captured again when a schedule moves them: once a round)
    step_plan = ("thresholds",)

    def __init__(self, lower: Threshold = 1e-4, upper: Threshold = 1.0,
                 lower_exponent: Annotated[float, Range(-16.0, 16.0)] = 0.0,
                 upper_exponent: Annotated[float, Range(-16.0, 16.0)] = 0.0):
        self.d, self.u = float(lower), float(upper)
        self.gamma, self.zeta = float(lower_exponent), float(upper_exponent)

    def thresholds(self, round_idx: int) -> tuple[float, float]:
        t = round_idx + 1
        return self.d * t ** self.gamma, self.u * t ** self.zeta

    @dataclass
    class Round(RoundState):
        # the round's thresholds (d_r, u_r), host numbers: a compiled step reads two numbers that stay the same over a
        # run with constant thresholds (the exponents 0), and never the round (a guard that fails every round)
        thresholds: tuple = shared()

    def client_start(self, client: ClientContext) -> None:
        client.start_state(self, self.Round(self.thresholds(client.round)))

    @staticmethod
    @torch.no_grad()
    def clip_(grads: list, lo: float, hi: float) -> None:
        """sign(g) · clip(|g|, lo, hi), in place, all tensors at once."""
        signs = torch._foreach_sign(grads)
        torch._foreach_abs_(grads)
        torch._foreach_clamp_min_(grads, lo)
        torch._foreach_clamp_max_(grads, hi)
        torch._foreach_mul_(grads, signs)

    def after_backward(self, client: ClientContext) -> None:
        """One client's gradients or a cohort's (K, ...) alike: elementwise."""
        self.clip_([p.grad for p in client.params.values() if p.grad is not None], *client.state_of(self).thresholds)
