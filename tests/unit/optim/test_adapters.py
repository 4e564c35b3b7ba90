"""State adapters (fl_lightning/optim/adapters.py) and the pure Muon update: what federated parts use to move
optimizer state and reuse the optimizer's math."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fl_lightning.errors import ConfigError
from fl_lightning.optim import Muon, adapter_for, muon_update, orthogonalize
from fl_lightning.optim.adapters import StateAdapter, register_adapter


def _param(shape=(3, 4), seed=0):
    return nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(seed)))


def test_partial_adam_state_is_completed_and_matches_hand_adam():
    """Writing only m into a fresh torch.optim.Adam used to raise KeyError: 'exp_avg' at the step; the adapter
    completes v = 0, t = 0, and the next step is Adam's formula with m_0 = the received m (Kingma & Ba, Alg. 1)."""
    p = _param()
    x0 = p.detach().clone()
    m0 = torch.randn(p.shape, generator=torch.Generator().manual_seed(1))
    opt = torch.optim.Adam([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8)
    adapter_for(opt).import_state(p, {"exp_avg": m0})
    assert set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq"}
    g = torch.randn(p.shape, generator=torch.Generator().manual_seed(2))
    p.grad = g.clone()
    opt.step()
    m = 0.9 * m0 + 0.1 * g
    v = 0.01 * g * g
    expected = x0 - 0.1 * (m / (1 - 0.9)) / ((v / (1 - 0.99)).sqrt() + 1e-8)
    torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True),
    lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    lambda ps: Muon(ps, lr=0.02, aux="adamw"),
    lambda ps: Muon(ps, lr=0.02, aux="sgd"),
], ids=["sgd", "adam_amsgrad", "adamw", "muon_adamw", "muon_sgd"])
def test_export_import_round_trip_continues_bit_for_bit(make):
    """Export every param's state after 3 steps, import it into a fresh optimizer on copies: 3 more steps agree
    exactly with the uninterrupted run (numbers come back as the optimizer's own type: int or 0-d tensor)."""
    shapes = [(4, 3), (3,)]
    ps = [_param(s, i) for i, s in enumerate(shapes)]
    opt = make(ps)
    gen = torch.Generator().manual_seed(5)
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(6)]
    for k in range(3):
        for p, g in zip(ps, grads[k]):
            p.grad = g.clone()
        opt.step()
    a = adapter_for(opt)
    exported = {i: {k: v.clone() for k, v in a.export_state(p).items()} for i, p in enumerate(ps)}
    for i, p in enumerate(ps):
        assert set(exported[i]) == set(a.entries(p))
    qs = [nn.Parameter(p.detach().clone()) for p in ps]
    opt2 = make(qs)
    a2 = adapter_for(opt2)
    for i, q in enumerate(qs):
        a2.import_state(q, exported[i])
        for k, v in opt.state[ps[i]].items():
            assert type(opt2.state[q][k]) is type(v), k
    for k in range(3, 6):
        for p, q, g in zip(ps, qs, grads[k]):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        opt2.step()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)


def test_param_kinds():
    w, b = _param((4, 3)), _param((3,))
    muon = adapter_for(Muon([w, b], aux="adamw"))
    assert (muon.param_kind(w), muon.param_kind(b)) == ("muon", "adamw")
    assert muon.entries(w) == ("momentum_buffer",) and muon.entries(b) == ("step", "exp_avg", "exp_avg_sq")
    assert adapter_for(torch.optim.SGD([w], lr=0.1)).entries(w) == ()  # no momentum, no state
    assert adapter_for(torch.optim.AdamW([w])).param_kind(w) == "adamw"
    assert muon.supports_correction and not adapter_for(torch.optim.SGD([w], lr=0.1)).supports_correction


def test_unrepresentable_state_is_an_error_not_a_drop():
    class Odd(torch.optim.SGD):
        def step(self, closure=None):
            for p in self.param_groups[0]["params"]:
                self.state[p]["meta"] = {"nested": 1}
            return super().step(closure)

    p = _param()
    opt = Odd([p], lr=0.1)
    p.grad = torch.ones_like(p)
    opt.step()
    with pytest.raises(ConfigError, match="keeps a dict under 'meta'"):
        adapter_for(opt).export_state(p)


def test_refresh_runs_after_import_with_the_imported_values():
    """The post-load hook SOAP needs (spec 001 §4.1): derived state (an eigenbasis of L) is recomputed from the
    received L, never carried stale from before the import."""

    class EigenOpt(torch.optim.SGD):
        pass

    @register_adapter(EigenOpt)
    class EigenAdapter(StateAdapter):
        def init_state(self, p):
            return {"L": torch.zeros(p.shape[0], p.shape[0]), "Q": torch.eye(p.shape[0])}

        def refresh(self, p, imported=()):
            st = self.opt.state[p]
            st["Q"] = torch.linalg.eigh(st["L"]).eigenvectors

    p = _param((3, 2))
    opt = EigenOpt([p], lr=0.1)
    a = adapter_for(opt)
    assert isinstance(a, EigenAdapter)
    A = torch.randn(3, 3, generator=torch.Generator().manual_seed(3))
    L = A @ A.T
    a.import_state(p, {"L": L})
    Q = opt.state[p]["Q"]
    torch.testing.assert_close(Q @ torch.diag(torch.linalg.eigvalsh(L)) @ Q.T, L, rtol=1e-5, atol=1e-5)


def test_state_adapter_attribute_wins_over_registry():
    class Own(torch.optim.SGD):
        class state_adapter(StateAdapter):  # noqa: N801 (the attribute's name is the protocol)
            def param_kind(self, p):
                return "own"

    p = _param()
    assert adapter_for(Own([p], lr=0.1)).param_kind(p) == "own"


# --------------------------------------------------------------------------- the pure Muon update
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_update_is_keller_jordans_formula(nesterov):
    """muon_update([g], [M], β) = [(O, s)] with s·O = s·NS(g.lerp(M', β) or M'), M' = βM + (1-β)g,
    s = sqrt(max(1, rows/cols)): Keller Jordan's muon.py, written out here by hand; and X − (lr·s)·O is
    Muon.step's result bit for bit (the optimizer runs on this function)."""
    g = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    M = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    beta = 0.9
    M_new = beta * M + (1 - beta) * g
    d = (1 - beta) * g + beta * M_new if nesterov else M_new
    expected = orthogonalize(d, steps=5, coeffs="muon") * math.sqrt(max(1.0, 6 / 4))
    mom = M.clone()
    [(o, s)] = muon_update([g], [mom], beta, nesterov=nesterov)
    assert s == math.sqrt(6 / 4)
    torch.testing.assert_close(o * s, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mom, M_new)  # the momentum is updated in place

    p = nn.Parameter(torch.randn(6, 4, generator=torch.Generator().manual_seed(2)))
    x0 = p.detach().clone()
    opt = Muon([p], lr=0.05, momentum=beta, nesterov=nesterov)
    opt.state[p]["momentum_buffer"] = M.clone()
    p.grad = g.clone()
    opt.step()
    torch.testing.assert_close(p.detach(), x0 - 0.05 * expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(p.detach(), x0.add(o, alpha=-0.05 * s))


def test_apply_direction_steps_along_a_given_direction_without_touching_momentum():
    p = nn.Parameter(torch.randn(5, 3, generator=torch.Generator().manual_seed(4)))
    x0 = p.detach().clone()
    opt = Muon([p], lr=0.1, scale_mode="none", weight_decay=0.5)
    M = torch.randn(5, 3, generator=torch.Generator().manual_seed(6))
    opt.state[p]["momentum_buffer"] = M.clone()
    opt.apply_direction(p, opt.momentum_buffer(p))
    torch.testing.assert_close(p.detach(), x0 * (1 - 0.1 * 0.5) - 0.1 * orthogonalize(M), rtol=1e-5, atol=1e-6)
    assert torch.equal(opt.state[p]["momentum_buffer"], M)
