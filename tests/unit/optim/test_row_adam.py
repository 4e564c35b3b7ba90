"""RowAdam (fl_lightning/optim/row_adam.py): K clients' Adam over stacked rows, each with its own step count, equals
torch.optim.Adam / AdamW run on each client's row alone (the independent computation: torch's own optimizer)."""
from __future__ import annotations

import pytest
import torch

from fl_lightning.optim.row_adam import RowAdam


@pytest.mark.parametrize("cls,wd", [(torch.optim.Adam, 0.0), (torch.optim.Adam, 0.1), (torch.optim.AdamW, 0.05)])
def test_each_row_takes_its_own_clients_adam_step(cls, wd):
    torch.manual_seed(0)
    K, shape, done = 3, (4, 5), [0, 5, 17]  # the clients' earlier steps (persistent state: different counts)
    hp = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=wd)
    rows = [torch.nn.Parameter(torch.randn(shape, dtype=torch.float64)) for _ in range(K)]
    ones = [cls([p], **hp) for p in rows]
    for p, opt, n in zip(rows, ones, done):  # each client's own history
        for _ in range(n):
            p.grad = torch.randn_like(p)
            opt.step()
    stacked = torch.nn.Parameter(torch.stack([p.detach().clone() for p in rows]))
    template = cls([torch.nn.Parameter(torch.zeros(1))], **hp)
    row_adam = RowAdam([{**{k: v for k, v in template.param_groups[0].items() if k != "params"}, "params": [stacked]}],
                       template.defaults)
    st = row_adam._state(stacked)
    for i, opt in enumerate(ones):
        own = opt.state[rows[i]]
        if own:
            st["step"][i] = own["step"]
            st["exp_avg"][i], st["exp_avg_sq"][i] = own["exp_avg"], own["exp_avg_sq"]
    for _ in range(4):  # the same gradients for the rows and for each client alone
        g = torch.randn((K, *shape), dtype=torch.float64)
        stacked.grad = g.clone()
        row_adam.step()
        for i, (p, opt) in enumerate(zip(rows, ones)):
            p.grad = g[i].clone()
            opt.step()
    for i, p in enumerate(rows):
        torch.testing.assert_close(stacked.detach()[i], p.detach(), rtol=1e-14, atol=0)
        assert float(st["step"][i]) == done[i] + 4
