"""SOAP: Adam in the eigenbasis of Shampoo's preconditioner (Vyas, Morwani, Zhao, Kwun, Shapira, Brandfonbrener,
Janson, Kakade, "SOAP: Improving and Stabilizing Shampoo using Adam", ICLR 2025, arXiv 2409.11321, Alg. 3; seed 001
FedPAC, Liu et al., "Taming Preconditioner Drift", ICML submission: Alg. 4 "Local SOAP", Table 8, and the values of
the authors' code).

Per parameter W with gradient G (a matrix: L is m×m, R is n×n; a tensor of any order: one factor per dimension of
size ≤ ``max_precond_dim``, conv weights (out, in, kh, kw) get four; 1-D params none unless ``precondition_1d``):

    G' = Q_Lᵀ G Q_R                          project into the eigenbasis (one ``tensordot`` per factored dimension)
    M ← β1 M + (1−β1) G                       first moment, kept in the original space
    V ← β2 V + (1−β2) G'⊙G'                   second moment, in the eigenbasis
    N = Q_L [ (Q_Lᵀ M Q_R) / (sqrt(V) + ε) ] Q_Rᵀ
    W ← W − η·sqrt(1−β2ᵗ)/(1−β1ᵗ)·N, then W ← W·(1 − η·λ)     bias correction (``correct_bias``), decoupled decay
    L ← β_s L + (1−β_s) G Gᵀ,  R ← β_s R + (1−β_s) Gᵀ G        after the step (decision 001/#9: the reference
                                                              order; the current gradient never enters its own step)
    every f steps: Q ← QR(L·Q) with Q's columns sorted by the estimated eigenvalues diag(Qᵀ L Q), V's entries
                   permuted alike (one power iteration, as the reference code; decision 001/#7)

``first_step``: ``init_only`` (default; the reference implementation's quirk: the first ``step()`` on a fresh state
only sets L ← (1−β_s)GGᵀ, R likewise and Q ← eigh, without moving W, so a round of K steps makes K−1 updates:
the FedPAC authors' code) | ``adam`` (the first step is an Adam step in the identity basis, then L, R, Q are initialised
from that gradient). State that arrives from outside (the aligned L, R of FedPAC) goes through :class:`SOAPAdapter`,
whose ``refresh`` recomputes Q = eigh(L), eigh(R) (descending eigenvalues, as the FedPAC authors' code; Q is never
averaged, decision 001/#5 in docs/decisions.md); a state with L, R already present takes a full step at once.

State per parameter (all tensors or ints, so it persists and travels): ``step``, ``exp_avg`` (M), ``exp_avg_sq``
(V), ``GG<i>`` (the factor of dimension i: GG0 = L, GG1 = R for a matrix) and ``Q<i>``. Defaults are seed 001's
(lr 3e-3, betas (0.95, 0.95), shampoo β 0.95, ε 1e-8, λ 0.01, f = 10, max_precond_dim 10000, no 1-D factors). Pure
functions (``project``, ``eigenbasis``, ``power_qr``) are exported for parts that reuse the math.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Annotated

import torch
from torch import Tensor

from ..ranges import Betas, Fraction, LearningRate, NonNegative, OneOf, Range
from .adapters import StateAdapter
from .scalars import add_scaled_

__all__ = ["SOAP", "SOAPAdapter", "eigenbasis", "factored_dims", "power_qr", "project"]

FIRST_STEPS = ("init_only", "adam")


def factored_dims(shape: tuple[int, ...], max_precond_dim: int, precondition_1d: bool) -> list[bool]:
    """Which dimensions of a parameter of this shape get a Kronecker factor."""
    if len(shape) == 1 and not precondition_1d:
        return [False]
    return [0 < s <= max_precond_dim for s in shape]


def project(x: Tensor, Qs: list[Tensor | None], back: bool = False) -> Tensor:
    """x in the eigenbasis (Q_iᵀ along every factored dimension i) or, with ``back``, back to the original space
    (Q_i along i). Unfactored dimensions are carried through unchanged."""
    for Q in Qs:
        if Q is not None:
            x = torch.tensordot(x, Q, dims=[[0], [1 if back else 0]])
        else:
            x = x.permute(*range(1, x.dim()), 0)
    return x


def eigenbasis(GG: Tensor) -> Tensor:
    """Eigenvectors of a symmetric factor, columns by descending eigenvalue (``torch.linalg.eigh`` of GG + 1e-30·I,
    flipped; float64 if float32 fails to converge), as the reference implementation initialises Q."""
    eye = 1e-30 * torch.eye(GG.shape[0], device=GG.device, dtype=GG.dtype)
    try:
        Q = torch.linalg.eigh(GG + eye).eigenvectors
    except RuntimeError:
        Q = torch.linalg.eigh((GG + eye).double()).eigenvectors.to(GG.dtype)
    return torch.flip(Q, dims=[1])


def power_qr(GG: Tensor, Q: Tensor) -> tuple[Tensor, Tensor]:
    """One power iteration and QR: (new Q, the column order applied), columns sorted by the estimated eigenvalues
    diag(Qᵀ GG Q), descending."""
    mp = GG @ Q
    order = torch.argsort((Q * mp).sum(dim=0), descending=True)
    mp = mp.index_select(1, order)
    low = mp.dtype in (torch.float16, torch.bfloat16)  # QR needs at least float32 (float64 stays float64)
    Qn, _ = torch.linalg.qr(mp.float() if low else mp)
    return Qn.to(GG.dtype), order


class SOAP(torch.optim.Optimizer):
    """SOAP (see the module docstring)."""

    def __init__(self, params: Iterable, lr: LearningRate = 3e-3, betas: Betas = (0.95, 0.95),
                 shampoo_beta: Fraction | None = 0.95, eps: NonNegative = 1e-8, weight_decay: NonNegative = 0.01,
                 precondition_frequency: Annotated[int, Range(1, 10**9)] = 10,
                 max_precond_dim: Annotated[int, Range(1)] = 10000, precondition_1d: bool = False,
                 correct_bias: bool = True, first_step: Annotated[str, OneOf(*FIRST_STEPS)] = "init_only"):
        betas = tuple(betas)
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError("lr, eps and weight_decay must be >= 0")
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas}")
        if shampoo_beta is not None and not 0 <= shampoo_beta < 1:
            raise ValueError(f"shampoo_beta must be in [0, 1) (or null for beta2), got {shampoo_beta}")
        if int(precondition_frequency) < 1 or int(max_precond_dim) < 1:
            raise ValueError("precondition_frequency and max_precond_dim must be >= 1")
        if first_step not in FIRST_STEPS:
            raise ValueError(f"first_step must be one of {FIRST_STEPS}, got {first_step!r}")
        defaults = dict(lr=lr, betas=betas, shampoo_beta=shampoo_beta, eps=eps, weight_decay=weight_decay,
                        precondition_frequency=int(precondition_frequency), max_precond_dim=int(max_precond_dim),
                        precondition_1d=precondition_1d, correct_bias=correct_bias, first_step=first_step)
        super().__init__(params, defaults)

    # ----------------------------------------------------------------- helpers on one parameter's state
    @staticmethod
    def _dims(p: Tensor, group: dict) -> list[bool]:
        return factored_dims(tuple(p.shape), group["max_precond_dim"], group["precondition_1d"])

    def _Qs(self, p: Tensor, group: dict) -> list[Tensor | None]:
        st = self.state[p]
        return [st[f"Q{i}"] if f else None for i, f in enumerate(self._dims(p, group))]

    @staticmethod
    def _shampoo_beta(group: dict) -> float:
        return group["shampoo_beta"] if group["shampoo_beta"] is not None else group["betas"][1]

    def _fresh(self, p: Tensor, group: dict) -> dict:
        """A fresh state for p: M = V = 0, step 0, zero factors, identity bases."""
        st: dict = {}
        st["step"] = 0
        st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        dt = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
        for i, f in enumerate(self._dims(p, group)):
            if f:
                n = p.shape[i]
                st[f"GG{i}"] = torch.zeros(n, n, device=p.device, dtype=dt)
                st[f"Q{i}"] = torch.eye(n, device=p.device, dtype=dt)
        return st

    def _update_factors(self, p: Tensor, g: Tensor, group: dict) -> None:
        st, beta = self.state[p], self._shampoo_beta(group)
        for i, f in enumerate(self._dims(p, group)):
            if f:
                GG = st[f"GG{i}"]
                others = [d for d in range(g.dim()) if d != i]
                gg = g.to(GG.dtype)
                GG.lerp_(torch.tensordot(gg, gg, dims=[others, others]), 1 - beta)

    def _refresh_eigh(self, p: Tensor, group: dict) -> None:
        st = self.state[p]
        for i, f in enumerate(self._dims(p, group)):
            if f:
                st[f"Q{i}"] = eigenbasis(st[f"GG{i}"])

    def _refresh_qr(self, p: Tensor, group: dict) -> None:
        st = self.state[p]
        V = st["exp_avg_sq"]
        for i, f in enumerate(self._dims(p, group)):
            if f:
                st[f"Q{i}"], order = power_qr(st[f"GG{i}"], st[f"Q{i}"])
                V = V.index_select(i, order)
        st["exp_avg_sq"] = V

    # ----------------------------------------------------------------- the step
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("SOAP does not support sparse gradients")
                g = p.grad
                st = self.state[p]
                if "exp_avg" not in st:
                    st.update(self._fresh(p, group))
                    if group["first_step"] == "init_only":
                        self._update_factors(p, g, group)
                        self._refresh_eigh(p, group)
                        continue  # the reference code's first step: initialise L, R, Q only
                st["step"] += 1
                t = st["step"]
                Qs = self._Qs(p, group)
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.lerp_(g, 1 - beta1)
                v.lerp_(project(g, Qs).square(), 1 - beta2)
                denom = v.sqrt().add_(eps)
                n = project(project(m, Qs) / denom, Qs, back=True)
                step_size = lr
                if group["correct_bias"]:
                    step_size = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
                add_scaled_(p, n, -step_size)
                if wd > 0:
                    p.mul_(1 - lr * wd)
                self._update_factors(p, g, group)
                if group["first_step"] == "adam" and t == 1:
                    self._refresh_eigh(p, group)
                elif t % group["precondition_frequency"] == 0:
                    self._refresh_qr(p, group)
        return loss


class SOAPAdapter(StateAdapter):
    """SOAP's state for federated parts. ``theta`` (FedPAC paper, Sec. 3.2, Θ = {L, R}) are the factors ``GG<i>``;
    importing factors without their ``Q<i>`` recomputes Q by eigh (``refresh``), and a fresh state is completed around
    them (M = V = 0, step 0) so the first step is a full step in the received basis."""

    def param_kind(self, p: Tensor) -> str:
        return "soap"

    def entries(self, p: Tensor) -> tuple[str, ...]:
        dims = SOAP._dims(p, self.group_of(p))
        return (("step", "exp_avg", "exp_avg_sq") + tuple(f"GG{i}" for i, f in enumerate(dims) if f)
                + tuple(f"Q{i}" for i, f in enumerate(dims) if f))

    def theta(self, p: Tensor) -> tuple[str, ...]:
        return tuple(k for k in self.entries(p) if k.startswith("GG"))

    def init_state(self, p: Tensor) -> dict:
        return self.opt._fresh(p, self.group_of(p))

    def refresh(self, p: Tensor, imported=()) -> None:
        st, group = self.opt.state[p], self.group_of(p)
        for i, f in enumerate(SOAP._dims(p, group)):
            if f and f"GG{i}" in imported and f"Q{i}" not in imported:
                st[f"Q{i}"] = eigenbasis(st[f"GG{i}"])


SOAP.state_adapter = SOAPAdapter
