"""Lion (Chen et al., NeurIPS 2023, arXiv 2302.06675, Alg. 2): step by step against the rule written out, and against
lucidrains' ``lion-pytorch`` (an independent implementation) when it is installed."""
from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

from fl_lightning.optim import Lion, adapter_for


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def _grads(net, step):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(16, 5, generator=g, dtype=torch.float64), torch.randn(16, 3, generator=g, dtype=torch.float64)
    net.zero_grad()
    ((net(x) - y) ** 2).mean().backward()


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_lion_matches_the_rule_step_by_step(wd):
    lr, b1, b2 = 3e-3, 0.9, 0.99
    net, ref = _net(), _net()
    opt = Lion(net.parameters(), lr=lr, betas=(b1, b2), weight_decay=wd)
    ms = [torch.zeros_like(p) for p in ref.parameters()]
    for step in range(30):
        _grads(net, step)
        _grads(ref, step)
        opt.step()
        with torch.no_grad():
            for p, m in zip(ref.parameters(), ms):
                g = p.grad
                u = torch.sign(b1 * m + (1 - b1) * g)                  # the old m
                p.copy_(p * (1 - lr * wd) - lr * u)
                m.copy_(b2 * m + (1 - b2) * g)
        for (p, q), m in zip(zip(net.parameters(), ref.parameters()), ms):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-14)
            torch.testing.assert_close(opt.state[p]["exp_avg"], m, rtol=0, atol=1e-14)


def test_every_coordinate_moves_by_lr_without_weight_decay():
    net = _net()
    before = [p.detach().clone() for p in net.parameters()]
    opt = Lion(net.parameters(), lr=0.01)
    _grads(net, 0)
    opt.step()
    for p, b in zip(net.parameters(), before):
        torch.testing.assert_close((p - b).abs(), torch.full_like(p, 0.01), rtol=0, atol=1e-15)


def test_lion_matches_lion_pytorch():
    lion_pytorch = importlib.import_module("lion_pytorch")
    net, ref = _net(), _net()
    ours = Lion(net.parameters(), lr=1e-3, betas=(0.95, 0.98), weight_decay=0.5)
    theirs = lion_pytorch.Lion(ref.parameters(), lr=1e-3, betas=(0.95, 0.98), weight_decay=0.5)
    for step in range(25):
        _grads(net, step)
        _grads(ref, step)
        ours.step()
        theirs.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


def test_state_adapter_exports_the_momentum():
    net = _net()
    opt = Lion(net.parameters(), lr=1e-3)
    _grads(net, 0)
    opt.step()
    a = adapter_for(opt)
    p = next(net.parameters())
    assert a.param_kind(p) == "lion" and a.entries(p) == ("exp_avg",)
    torch.testing.assert_close(a.export_state(p)["exp_avg"], opt.state[p]["exp_avg"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="lr"):
        Lion(_net().parameters(), lr=-1e-3)
    with pytest.raises(ValueError, match="betas"):
        Lion(_net().parameters(), betas=(0.9, 1.0))
