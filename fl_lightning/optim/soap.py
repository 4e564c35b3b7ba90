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

from ..config import Betas, Fraction, LearningRate, NonNegative, OneOf, Range
from .adapters import StateAdapter
from .scalars import foreach_add_scaled_

__all__ = ["SOAP", "SOAPAdapter", "eigenbasis", "factored_dims", "power_qr", "project", "project_many",
           "eigenbases"]

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


def eigenbases(GGs: list[Tensor]) -> list[Tensor]:
    """:func:`eigenbasis` of each factor, same-shape factors in one batched ``eigh`` (LAPACK solves each matrix of a
    batch on its own on a CPU; on a GPU small ones go to a batched solver, equal up to rounding and the
    eigenvectors' signs); a batch that fails to converge is redone one factor at a time."""
    out: list[Tensor | None] = [None] * len(GGs)
    by_shape: dict[tuple, list[int]] = {}
    for i, GG in enumerate(GGs):
        by_shape.setdefault((tuple(GG.shape), GG.dtype, GG.device), []).append(i)
    for idx in by_shape.values():
        if len(idx) == 1:
            out[idx[0]] = eigenbasis(GGs[idx[0]])
            continue
        G = torch.stack([GGs[i] for i in idx])
        eye = 1e-30 * torch.eye(G.shape[-1], device=G.device, dtype=G.dtype)
        try:
            Q = torch.flip(torch.linalg.eigh(G + eye).eigenvectors, dims=[-1])
        except RuntimeError:
            Q = torch.stack([eigenbasis(GGs[i]) for i in idx])
        for i, q in zip(idx, Q.unbind(0)):
            out[i] = q
    return out


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
        # None: an eager run (Python counts, refreshes decided in the step); a compiled run's plan of the coming step
        # ({param: "eigh" | "qr"}, empty at a regular step), made on the host by SOAPAdapter.plan_step
        self._planned: dict | None = None

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
        """One step of every param: the moments, the scaled step, decay and the factors with multi-tensor ops
        (``torch._foreach_*``), the projections of same-shape matrices as batched matmuls (:func:`project_many`),
        the eigenbasis refreshes one param at a time (every f steps); the arithmetic of one param at a time, in the
        same order."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            live, fresh = [], []  # the params that take a full step; those whose first step only sets L, R, Q
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("SOAP does not support sparse gradients")
                st = self.state[p]
                if "exp_avg" not in st:
                    st.update(self._fresh(p, group))
                    if group["first_step"] == "init_only":
                        fresh.append(p)
                        continue  # the reference code's first step: initialise L, R, Q only
                live.append(p)
            if fresh:
                self._update_factors_many(fresh, [p.grad for p in fresh], group)
                self._refresh_eigh_many(fresh, group)
            if not live:
                continue
            sts = [self.state[p] for p in live]
            planned = self._planned
            if planned is None:
                for st in sts:
                    st["step"] += 1
            else:  # a compiled run's counts, on the device (a fresh state's made at this eager step: moved there)
                for p, st in zip(live, sts):
                    if not isinstance(st["step"], Tensor):
                        st["step"] = torch.tensor(float(st["step"]), dtype=torch.float32, device=p.device)
                torch._foreach_add_([st["step"] for st in sts], 1)
            gs, ms, vs = [p.grad for p in live], [st["exp_avg"] for st in sts], [st["exp_avg_sq"] for st in sts]
            Qss = [self._Qs(p, group) for p in live]
            torch._foreach_lerp_(ms, gs, 1 - beta1)  # M ← β1 M + (1−β1) G
            torch._foreach_lerp_(vs, torch._foreach_pow(project_many(gs, Qss), 2), 1 - beta2)  # V ← .. + G'⊙G'
            denom = torch._foreach_sqrt(vs)
            torch._foreach_add_(denom, eps)
            ns = project_many(torch._foreach_div(project_many(ms, Qss), denom), Qss, back=True)
            if not group["correct_bias"]:
                foreach_add_scaled_(live, ns, -lr)
            elif planned is None:
                by_step: dict[int, list[int]] = {}
                for i, st in enumerate(sts):
                    by_step.setdefault(st["step"], []).append(i)
                for t, idx in by_step.items():
                    step_size = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
                    foreach_add_scaled_([live[i] for i in idx], [ns[i] for i in idx], -step_size)
            else:
                torch._foreach_add_(live, torch._foreach_mul(ns, _step_sizes([st["step"] for st in sts], lr, beta1,
                                                                              beta2)))
            if wd > 0:
                torch._foreach_mul_(live, 1 - lr * wd)
            self._update_factors_many(live, gs, group)
            if planned is None:
                t1 = [p for p, st in zip(live, sts) if st["step"] == 1]
                qr = [p for p, st in zip(live, sts) if self._refresh_due(st["step"], group)]
            else:  # decided on the host before the step (SOAPAdapter.plan_step): nothing at a compiled step
                t1 = [p for p in live if planned.get(p) == "eigh"] if planned else []
                qr = [p for p in live if planned.get(p) == "qr"] if planned else []
            if group["first_step"] == "adam":
                self._refresh_eigh_many(t1, group)
            for p in qr:
                self._refresh_qr(p, group)
        return loss

    @staticmethod
    def _refresh_due(t: int, group: dict) -> bool:
        """Whether the bases are refreshed (one power iteration and QR) after the step that made the count ``t``."""
        return t % group["precondition_frequency"] == 0 and not (group["first_step"] == "adam" and t == 1)

    def _refresh_eigh_many(self, ps: list[Tensor], group: dict) -> None:
        """Q ← eigh of each factor of each param, same-shape factors in one batched ``eigh`` (:func:`eigenbases`)."""
        slots = [(self.state[p], f"Q{i}", f"GG{i}") for p in ps for i, f in enumerate(self._dims(p, group)) if f]
        for (st, q, _), Q in zip(slots, eigenbases([st[gg] for st, _, gg in slots])):
            st[q] = Q

    def _update_factors_many(self, ps: list[Tensor], gs: list[Tensor], group: dict) -> None:
        """L ← β_s L + (1−β_s) G Gᵀ, R likewise (each factor of each param), same-shape matrices' G Gᵀ and
        Gᵀ G as batched matmuls, every lerp in one multi-tensor op."""
        beta = self._shampoo_beta(group)
        factors, products = [], []
        for idx in batch_groups(gs, [self._Qs(p, group) for p in ps]):
            sts = [self.state[ps[i]] for i in idx]
            if len(idx) > 1:  # same-shape matrices with both factors: one bmm for each of G Gᵀ and Gᵀ G
                X = torch.stack([gs[i].to(sts[0]["GG0"].dtype) for i in idx])
                for k, prod in ((0, torch.bmm(X, X.mT)), (1, torch.bmm(X.mT, X))):
                    factors += [st[f"GG{k}"] for st in sts]
                    products += list(prod.unbind(0))
                continue
            p, g, st = ps[idx[0]], gs[idx[0]], sts[0]
            for i, f in enumerate(self._dims(p, group)):
                if f:
                    others = [d for d in range(g.dim()) if d != i]
                    gg = g.to(st[f"GG{i}"].dtype)
                    factors.append(st[f"GG{i}"])
                    products.append(torch.tensordot(gg, gg, dims=[others, others]))
        if factors:
            torch._foreach_lerp_(factors, products, 1 - beta)


def _step_sizes(steps: list[Tensor], lr, beta1: float, beta2: float) -> list[Tensor]:
    """−lr·sqrt(1 − β2ᵗ)/(1 − β1ᵗ) for each 0-d count t on the device (a compiled run's), in float64 and in the
    eager run's order of operations (its host arithmetic), as views of one vector."""
    t = torch.stack(steps).double()
    size = lr * torch.sqrt(1 - beta2**t) / (1 - beta1**t)
    return list(torch.neg_(size).unbind(0))


def batch_groups(xs: list[Tensor], Qss: list[list[Tensor | None]]) -> list[list[int]]:
    """Indices of ``xs`` in batches: same-shape matrices with both factors (of one dtype and device) together, every
    other tensor alone."""
    out: dict[tuple, list[int]] = {}
    for i, (x, Qs) in enumerate(zip(xs, Qss)):
        whole = x.dim() == 2 and all(Q is not None for Q in Qs) and Qs[0].dtype == Qs[1].dtype
        key = (tuple(x.shape), x.dtype, x.device, Qs[0].dtype) if whole else ("one", i)
        out.setdefault(key, []).append(i)
    return list(out.values())


def project_many(xs: list[Tensor], Qss: list[list[Tensor | None]], back: bool = False) -> list[Tensor]:
    """:func:`project` of each x with its bases, same-shape matrices with both factors as batched matmuls: Q_Lᵀ X Q_R
    (``back``: Q_L X Q_Rᵀ) with the operands in :func:`project`'s order (``tensordot`` multiplies xᵀ by Q, then
    the result's transpose by the next Q), so one batch's matrices equal the one-at-a-time results."""
    out: list[Tensor | None] = [None] * len(xs)
    for idx in batch_groups(xs, Qss):
        if len(idx) == 1:
            out[idx[0]] = project(xs[idx[0]], Qss[idx[0]], back)
            continue
        X = torch.stack([xs[i] for i in idx])
        for k in (0, 1):
            Q = torch.stack([Qss[i][k] for i in idx])
            X = torch.bmm(X.mT, Q.mT if back else Q)
        out_b = X.unbind(0)
        for j, i in enumerate(idx):
            out[i] = out_b[j]
    return out


class SOAPAdapter(StateAdapter):
    """SOAP's state for federated parts. ``theta`` (FedPAC paper, Sec. 3.2, Θ = {L, R}) are the factors ``GG<i>``;
    importing factors without their ``Q<i>`` recomputes Q by eigh (``refresh``), and a fresh state is completed around
    them (M = V = 0, step 0) so the first step is a full step in the received basis."""

    device_steps = True  # a compiled run's counts on the device; its refreshes planned on the host (plan_step)

    def param_kind(self, p: Tensor) -> str:
        return "soap"

    def plan_step(self, first: bool) -> bool:
        """Before each step of a compiled run, outside the traced frame: each parameter's count kept on the host
        (read from the state at a client's ``first`` step, then counted here), what the coming step does besides
        the update (``"eigh"``: a fresh state's bases; ``"qr"``: a refresh every f steps), and whether it is the
        regular step, the same code at every step (no state initialised, nothing refreshed), which the compiled
        graph holds; the others run eagerly. So the compiled step reads no count and guards on no branch."""
        opt = self.opt
        order = [p for group in opt.param_groups for p in group["params"] if p in opt.state]
        if len(order) != len(opt.state) or any(a is not b for a, b in zip(order, opt.state)):
            for p in order:  # the params' order (imports fill the state in theirs): the compiled step guards on it
                opt.state[p] = opt.state.pop(p)
        counts = opt.__dict__.setdefault("_host_steps", {})
        if first:
            counts.clear()
        planned, regular = {}, True
        for group in opt.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                st = opt.state.get(p, {})
                factored = any(SOAP._dims(p, group))
                if "exp_avg" not in st:  # initialised at this step
                    regular = False
                    t = 0 if group["first_step"] == "init_only" else 1
                    if t == 1 and factored:
                        planned[p] = "eigh"
                else:
                    t = counts[p] + 1 if p in counts else int(st["step"]) + 1  # int(): a count saved on the device
                    if factored and group["first_step"] == "adam" and t == 1:
                        planned[p], regular = "eigh", False
                    elif factored and SOAP._refresh_due(t, group):
                        planned[p], regular = "qr", False
                counts[p] = t
        opt._planned = planned
        return regular

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
