"""ClientByClient (fl_lightning/cohort/optimizer.py): a cohort's optimizer with no batched form steps each client's
rows with that client's own optimizer; given the same gradients, each row is bit for bit the client's optimizer
stepped alone (the independent computation: the optimizer itself, one client at a time)."""
from __future__ import annotations

from functools import partial

import pytest
import torch

from fl_lightning.cohort.optimizer import ClientByClient, copy_of
from fl_lightning.optim import SOAP


@pytest.mark.parametrize("factory", [partial(SOAP, lr=0.01, precondition_frequency=2),
                                     partial(torch.optim.NAdam, lr=0.01)], ids=["soap", "nadam"])
def test_each_clients_rows_take_its_own_optimizers_steps(factory):
    torch.manual_seed(0)
    shapes, K, steps = [(6, 4), (4,), (3, 2, 3, 3)], 3, 5
    params = [torch.nn.Parameter(torch.randn(s, dtype=torch.float64)) for s in shapes]
    start = [p.detach().clone() for p in params]
    grads = [[[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(steps)] for _ in range(K)]
    histories = [0, 2, 0]  # client 1 arrives with state (two earlier steps: a persistent optimizer's)
    alone = []
    for i in range(K):  # each client alone: its own parameters and optimizer
        ps = [torch.nn.Parameter(t.clone()) for t in start]
        opt = factory(ps)
        for k in range(histories[i] + steps):
            for p, g in zip(ps, grads[i][k % steps]):
                p.grad = g.clone()
            opt.step()
        alone.append([p.detach() for p in ps])
    own = []
    for i in range(K):  # the cohort: copies of each client's optimizer over the module's parameters
        opt = factory(params)
        for _ in range(histories[i]):
            for p, t, g in zip(params, start, grads[i][_ % steps]):
                p.data.copy_(t)
                p.grad = g.clone()
            opt.step()
        own.append(copy_of(opt, factory(params)))
    stacked = [torch.stack([t.clone() for _ in range(K)]).requires_grad_(True) for t in start]
    with torch.no_grad():  # client 1's rows as its history left them
        ps = [torch.nn.Parameter(t.clone()) for t in start]
        opt = factory(ps)
        for k in range(histories[1]):
            for p, g in zip(ps, grads[1][k]):
                p.grad = g.clone()
            opt.step()
        for s, p in zip(stacked, ps):
            s[1].copy_(p)
    cohort = ClientByClient(own, params, stacked)
    for k in range(histories[1], histories[1] + steps):
        for j, s in enumerate(stacked):
            s.grad = torch.stack([grads[i][(k if i == 1 else k - histories[1]) % steps][j] for i in range(K)])
        cohort.step()
    for i in range(K):
        for s, a in zip(stacked, alone[i]):
            assert torch.equal(s.detach()[i], a)
    cohort.active = [True, False, True]  # a finished client: its rows and its optimizer untouched
    before = [s.detach().clone() for s in stacked]
    for s in stacked:
        s.grad = torch.ones_like(s)
    cohort.step()
    assert all(torch.equal(s.detach()[1], b[1]) and not torch.equal(s.detach()[0], b[0]) for s, b in zip(stacked, before))
