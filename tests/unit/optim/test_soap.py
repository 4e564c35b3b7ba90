"""SOAP (fl_lightning/optim/soap.py) step by step: against a direct transcription of Vyas et al. Alg. 3 / spec 001
Alg. 4 for a matrix, against pytorch-optimizer's SOAP where installed, the reference first-step quirk, and the state
that travels (Θ = {L, R}, eigenbases recomputed on import)."""
from __future__ import annotations

import importlib

import math

import pytest
import torch
from torch import nn

from fl_lightning.optim import SOAP, adapter_for
from fl_lightning.optim.state import export_optimizer_state, import_optimizer_state


def _grads(shape, steps, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(steps)]


def _hand_soap(W, grads, lr, b1, b2, bs, eps, wd, f):
    """Alg. 3 written out for one m×n matrix with explicit L, R, Q_L, Q_R (reference order: the first step only
    initialises; the update, then the decay, then L, R, then every f updates one power iteration + QR with the
    columns sorted by diag(QᵀLQ) and V permuted alike)."""
    W = W.clone()
    m, n = W.shape
    L, R = torch.zeros(m, m, dtype=W.dtype), torch.zeros(n, n, dtype=W.dtype)
    M, V = torch.zeros_like(W), torch.zeros_like(W)
    G0 = grads[0]
    L = bs * L + (1 - bs) * G0 @ G0.T
    R = bs * R + (1 - bs) * G0.T @ G0
    QL = torch.flip(torch.linalg.eigh(L).eigenvectors, [1])
    QR = torch.flip(torch.linalg.eigh(R).eigenvectors, [1])
    for t, G in enumerate(grads[1:], start=1):
        Gp = QL.T @ G @ QR
        M = b1 * M + (1 - b1) * G
        V = b2 * V + (1 - b2) * Gp * Gp
        N = QL @ ((QL.T @ M @ QR) / (V.sqrt() + eps)) @ QR.T
        W = W - lr * math.sqrt(1 - b2**t) / (1 - b1**t) * N
        W = W * (1 - lr * wd)
        L = bs * L + (1 - bs) * G @ G.T
        R = bs * R + (1 - bs) * G.T @ G
        if t % f == 0:
            oL = torch.argsort(torch.diag(QL.T @ L @ QL), descending=True)
            oR = torch.argsort(torch.diag(QR.T @ R @ QR), descending=True)
            QL = torch.linalg.qr(L @ QL[:, oL]).Q
            QR = torch.linalg.qr(R @ QR[:, oR]).Q
            V = V[oL][:, oR]
    return W


def test_matches_the_algorithm_written_out():
    """Square, so that the first gradient already makes L and R full rank: with a rank-deficient factor the
    eigenbasis of its null space is arbitrary (rounding decides it) and Adam's per-coordinate step depends on it."""
    W0 = torch.randn(4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads = _grads((4, 4), 9)
    kw = dict(lr=0.01, b1=0.9, b2=0.95, bs=0.9, eps=1e-8, wd=0.01, f=3)
    expected = _hand_soap(W0, grads, **kw)
    p = nn.Parameter(W0.clone())
    opt = SOAP([p], lr=0.01, betas=(0.9, 0.95), shampoo_beta=0.9, eps=1e-8, weight_decay=0.01,
               precondition_frequency=3)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    # QR's column signs are not unique, but the step is invariant to them: compare the iterates
    torch.testing.assert_close(p.detach(), expected, rtol=1e-9, atol=1e-12)


def test_matches_pytorch_optimizer_soap():
    """An independent implementation (pytorch-optimizer's SOAP, the reference code's current form) on a matrix, a
    conv weight (a factor per dimension) and a bias (no factor: Adam), through two eigenbasis refreshes."""
    ref_mod = importlib.import_module("pytorch_optimizer")
    shapes = [(6, 4), (5, 3, 3, 2), (7,)]

    def params():
        g = torch.Generator().manual_seed(1)
        return [nn.Parameter(torch.randn(s, generator=g, dtype=torch.float64)) for s in shapes]

    ours, theirs = params(), params()
    o = SOAP(ours, lr=0.01, precondition_frequency=3, weight_decay=0.01)
    r = ref_mod.SOAP(theirs, lr=0.01, precondition_frequency=3, weight_decay=0.01, shampoo_beta=0.95)
    gen = torch.Generator().manual_seed(2)
    for _ in range(8):
        for a, b in zip(ours, theirs):
            g = torch.randn(a.shape, generator=gen, dtype=torch.float64)
            a.grad, b.grad = g.clone(), g.clone()
        o.step()
        r.step()
    for a, b in zip(ours, theirs):  # pytorch-optimizer runs its QR in float32 even for float64 params
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_first_step_only_initialises_by_default():
    p = nn.Parameter(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)))
    x0 = p.detach().clone()
    opt = SOAP([p], shampoo_beta=0.9)
    g = _grads((4, 3), 1)[0].float()
    p.grad = g.clone()
    opt.step()
    assert torch.equal(p.detach(), x0)
    st = opt.state[p]
    torch.testing.assert_close(st["GG0"], 0.1 * g @ g.T)
    torch.testing.assert_close(st["GG1"], 0.1 * g.T @ g)
    assert st["step"] == 0 and set(st) == {"step", "exp_avg", "exp_avg_sq", "GG0", "GG1", "Q0", "Q1"}

    q = nn.Parameter(x0.clone())  # first_step=adam: an Adam step in the identity basis at once
    opt2 = SOAP([q], shampoo_beta=0.9, first_step="adam", weight_decay=0.0)
    q.grad = g.clone()
    opt2.step()
    torch.testing.assert_close(q.detach(), x0 - 3e-3 * g / (g.abs() + 1e-8), rtol=1e-5, atol=1e-7)


def test_aligned_factors_import_recomputes_eigenbases_and_steps_at_once():
    """FedPAC's alignment (spec 001 §4.1): L, R arrive into a fresh state; Q = eigh(L), eigh(R) (descending),
    M = V = 0, and the first step is a full step in that basis."""
    p = nn.Parameter(torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    opt = SOAP([p])
    a = adapter_for(opt)
    assert a.theta(p) == ("GG0", "GG1")
    A, B = torch.randn(4, 4, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    L, R = A @ A.T, B @ B.T
    a.import_state(p, {"GG0": L, "GG1": R})
    st = opt.state[p]
    for Q, F in ((st["Q0"], L), (st["Q1"], R)):
        ev = torch.diag(Q.T @ F @ Q)
        torch.testing.assert_close(Q @ torch.diag(ev) @ Q.T, F)
        assert (ev[:-1] >= ev[1:]).all()
    x0 = p.detach().clone()
    p.grad = torch.ones_like(p)
    opt.step()
    assert not torch.equal(p.detach(), x0) and st["step"] == 1


def test_persistent_state_round_trips_exactly():
    """Save a client's whole SOAP state (flat tensors), load it into a fresh optimizer: the next steps equal the
    uninterrupted run bit for bit (including the QR-refreshed eigenbases, which are not recomputed)."""
    shapes = [(5, 4), (4,)]
    ps = [nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(i))) for i, s in enumerate(shapes)]
    opt = SOAP(ps, precondition_frequency=2)
    gen = torch.Generator().manual_seed(9)
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(8)]
    for k in range(5):
        for p, g in zip(ps, grads[k]):
            p.grad = g.clone()
        opt.step()
    flat = {k: v.clone() for k, v in export_optimizer_state(opt).items()}
    qs = [nn.Parameter(p.detach().clone()) for p in ps]
    opt2 = SOAP(qs, precondition_frequency=2)
    import_optimizer_state(opt2, flat)
    for k in range(5, 8):
        for p, q, g in zip(ps, qs, grads[k]):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        opt2.step()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)


@pytest.mark.parametrize("bad", [dict(lr=-1.0), dict(betas=(0.9, 1.0)), dict(first_step="skip"),
                                 dict(precondition_frequency=0)])
def test_bad_values_are_rejected(bad):
    with pytest.raises(ValueError):
        SOAP([nn.Parameter(torch.zeros(2, 2))], **bad)


def _planned_run(opt, params, grads_per_step, first_at=0):
    """The steps as a compiled run takes them (fl_lightning/step/compiled.py): before each, the host's plan
    (``plan_step``) and the counts on the device; returns whether each step was the regular one."""
    from fl_lightning.step.compiled import CompiledStep

    regular = []
    for k, gs in enumerate(grads_per_step):
        for p, g in zip(params, gs):
            p.grad = g.clone()
        regular.append(adapter_for(opt).plan_step(first=k == first_at))
        CompiledStep.steps_as_tensors(opt)
        opt.step()
        CompiledStep.steps_as_tensors(opt)  # a state the (eager) step made
    return regular


def test_a_compiled_runs_planned_steps_equal_the_algorithm_written_out():
    """Under ``trainer.compile`` SOAP's counts live on the device and its branches (the first step that only
    initialises, the refresh every f steps) are decided on the host before the step; those steps run eagerly and
    every other step is the same code, the one the compiled graph holds. The result equals Alg. 3 written out
    (float64: only the rounding of the update's multiply-add differs), and exactly the branching steps are
    irregular: the first, then every f-th count."""
    W0 = torch.randn(5, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    b0 = torch.randn(4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    gW, gb = _grads((5, 4), 8), _grads((4,), 8, seed=4)
    W, b = nn.Parameter(W0.clone()), nn.Parameter(b0.clone())
    opt = SOAP([W, b], lr=0.02, betas=(0.9, 0.95), shampoo_beta=0.9, precondition_frequency=3)
    regular = _planned_run(opt, [W, b], list(zip(gW, gb)))
    assert regular == [False, True, True, False, True, True, False, True]  # counts 0 (init), 1, 2, 3, ..., 7
    want = _hand_soap(W0, gW, 0.02, 0.9, 0.95, 0.9, 1e-8, 0.01, 3)
    torch.testing.assert_close(W.detach(), want, rtol=1e-12, atol=1e-14)
    assert isinstance(opt.state[W]["step"], torch.Tensor) and float(opt.state[W]["step"]) == 7


@pytest.mark.parametrize("first_step", ["init_only", "adam"])
def test_planned_steps_equal_eager_steps_for_imported_factors_and_both_first_steps(first_step):
    """FedPAC's round ≥ 1 (L, R imported for the matrix, the vector fresh) and ``first_step=adam``: the planned
    steps (device counts, host decisions) equal the eager steps (Python counts) to float64 rounding."""
    g = torch.Generator().manual_seed(5)
    W0, b0 = torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)
    A, B = torch.randn(4, 4, generator=g, dtype=torch.float64), torch.randn(3, 3, generator=g, dtype=torch.float64)
    grads = list(zip(_grads((4, 3), 6), _grads((3,), 6, seed=6)))
    out = []
    for planned in (False, True):
        W, b = nn.Parameter(W0.clone()), nn.Parameter(b0.clone())
        opt = SOAP([W, b], precondition_frequency=2, first_step=first_step)
        adapter_for(opt).import_state(W, {"GG0": A @ A.T, "GG1": B @ B.T})
        if planned:
            regular = _planned_run(opt, [W, b], grads)
            # step 0: the vector's fresh state (adam: the matrix's count 1, its bases again); the matrix's counts 2,
            # 4 and 6 refresh its bases
            assert regular == [False, False, True, False, True, False], regular
        else:
            for gs in grads:
                W.grad, b.grad = gs[0].clone(), gs[1].clone()
                opt.step()
        out.append((W.detach().clone(), b.detach().clone()))
    for x, y in zip(*out):
        torch.testing.assert_close(y, x, rtol=1e-12, atol=1e-14)
