"""Sophia (fl_lightning/optim/sophia.py) step by step: against Alg. 8 of spec 001 (Liu et al. Alg. 3) written out,
against pytorch-optimizer's SophiaH where installed, and its state round trip."""
from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

from fl_lightning.optim import Sophia, adapter_for
from fl_lightning.optim.state import export_optimizer_state, import_optimizer_state


def _seq(shape, n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n)]


@pytest.mark.parametrize("denominator", ["max", "add"])
def test_matches_alg8_written_out(denominator):
    """m ← β1 m + (1−β1) g; h ← β2 h + (1−β2) max(ĥ, 0) on the steps with an estimate; D = clip(m / max(γh, ε), ±ρ)
    (or m / (γh + ε)); θ ← θ − η(D + λθ). Estimates with negative entries on steps 0, 2, 4."""
    lr, b1, b2, rho, gamma, eps, wd = 0.05, 0.9, 0.8, 0.7, 0.5, 1e-3, 0.1
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads, hats = _seq((3, 4), 6, 1), _seq((3, 4), 6, 2)
    m, h, X = torch.zeros_like(x), torch.zeros_like(x), x.clone()
    for k in range(6):
        m = b1 * m + (1 - b1) * grads[k]
        if k % 2 == 0:
            h = b2 * h + (1 - b2) * hats[k].clamp(min=0)
        den = torch.maximum(gamma * h, torch.full_like(h, eps)) if denominator == "max" else gamma * h + eps
        D = torch.clamp(m / den, -rho, rho)
        X = X - lr * (D + wd * X)
    p = nn.Parameter(x.clone())
    opt = Sophia([p], lr=lr, betas=(b1, b2), rho=rho, gamma=gamma, eps=eps, weight_decay=wd, denominator=denominator)
    for k in range(6):
        if k % 2 == 0:
            opt.update_hessian({p: hats[k]})
        p.grad = grads[k].clone()
        opt.step()
    torch.testing.assert_close(p.detach(), X, rtol=1e-12, atol=1e-12)
    assert opt.state[p]["step"] == 6


def test_matches_pytorch_optimizer_sophiah():
    """pytorch-optimizer's SophiaH given the same (non-negative) Hessian estimates every step: its update is
    clip(m / max(h, eps), ±p) with decoupled decay, i.e. ours with γ = 1, ρ = p."""
    ref_mod = importlib.import_module("pytorch_optimizer")
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads, hats = _seq((4, 3), 5, 1), [h.abs() for h in _seq((4, 3), 5, 2)]
    p, q = nn.Parameter(x.clone()), nn.Parameter(x.clone())
    ours = Sophia([p], lr=0.03, betas=(0.9, 0.95), rho=0.05, eps=1e-12, weight_decay=0.01)
    ref = ref_mod.SophiaH([q], lr=0.03, betas=(0.9, 0.95), p=0.05, eps=1e-12, weight_decay=0.01)
    for g, hh in zip(grads, hats):
        p.grad, q.grad = g.clone(), g.clone()
        ours.update_hessian({p: hh})
        ours.step()
        ref.step(hessian=[hh.clone()])
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-12)


def test_state_round_trips_and_theta_is_h():
    ps = [nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(i))) for i, s in enumerate([(3, 2), (2,)])]
    opt = Sophia(ps, lr=0.01, rho=0.5)
    a = adapter_for(opt)
    assert a.theta(ps[0]) == ("hessian",) and a.entries(ps[0]) == ("step", "exp_avg", "hessian")
    gen = torch.Generator().manual_seed(4)
    steps = [[torch.randn(p.shape, generator=gen) for p in ps] for _ in range(6)]
    for k in range(3):
        opt.update_hessian({p: g.abs() for p, g in zip(ps, steps[k])})
        for p, g in zip(ps, steps[k]):
            p.grad = g.clone()
        opt.step()
    qs = [nn.Parameter(p.detach().clone()) for p in ps]
    opt2 = Sophia(qs, lr=0.01, rho=0.5)
    import_optimizer_state(opt2, {k: v.clone() for k, v in export_optimizer_state(opt).items()})
    for k in range(3, 6):
        for o, params in ((opt, ps), (opt2, qs)):
            o.update_hessian({p: g.abs() for p, g in zip(params, steps[k])})
            for p, g in zip(params, steps[k]):
                p.grad = g.clone()
            o.step()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)


def test_aligned_h_into_a_fresh_state():
    """FedPAC_Sophia (Θ = {h}): h arrives, m starts at 0, step at 0."""
    p = nn.Parameter(torch.zeros(2, 2))
    opt = Sophia([p], lr=0.1, rho=10.0, weight_decay=0.0)
    adapter_for(opt).import_state(p, {"hessian": torch.full((2, 2), 2.0)})
    p.grad = torch.ones(2, 2)
    opt.step()  # m = 0.1, D = 0.1 / 2
    torch.testing.assert_close(p.detach(), torch.full((2, 2), -0.1 * 0.05))


@pytest.mark.parametrize("bad", [dict(rho=0.0), dict(betas=(0.9,)), dict(denominator="sum"), dict(lr=-1.0)])
def test_bad_values_are_rejected(bad):
    with pytest.raises(ValueError):
        Sophia([nn.Parameter(torch.zeros(2, 2))], **bad)
