"""The one local step (fl_lightning/step/local.py) against a hand-written step, and its K-step loop's losses and
divergence check."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fl_lightning.errors import NonFiniteLossError
from fl_lightning.step import ClientStep, check_finite, mean_losses, run_steps
from fl_lightning.strategies.base import ClientContext, Part, Strategy


class _Fabric:
    def autocast(self):
        import contextlib

        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()


class _Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2, dtype=torch.float64)

    def training_step(self, batch, k):
        return ((self.lin(batch["x"]) - batch["y"]) ** 2).mean()


class _Scale(Part):
    """after_backward: gradients x 2; after_step: the weights + 0.5 (to see both hooks in their places)."""

    def after_backward(self, client):
        for p in client.params.values():
            p.grad.mul_(2.0)

    def after_step(self, client):
        with torch.no_grad():
            for p in client.params.values():
                p.add_(0.5)


def _client(module, lr):
    params = dict(module.named_parameters())
    ctx = ClientContext(id=0, round=0, module=module, params=params, local={}, global_params={}, state={},
                        num_samples=4, num_steps=3, lr_factor=1.0)
    ctx.optimizer = torch.optim.SGD(list(params.values()), lr=lr)
    return ctx


def test_the_step_is_backward_hooks_clip_optimizer_hooks_in_that_order():
    torch.manual_seed(0)
    module = _Module()
    w0 = {n: p.detach().clone() for n, p in module.named_parameters()}
    batch = {"x": torch.randn(4, 3, dtype=torch.float64), "y": torch.randn(4, 2, dtype=torch.float64)}
    strategy = Strategy("t", {"scale": _Scale()}, grad_clip=0.1)
    ctx = _client(module, lr=0.3)
    loss = ClientStep(_Fabric(), module, strategy, ctx.params)(ctx, batch, 0)
    # by hand: g = 2 ∇f, clipped to norm 0.1, w <- w - 0.3 g + 0.5
    w = {n: t.clone().requires_grad_(True) for n, t in w0.items()}
    f = ((batch["x"] @ w["lin.weight"].T + w["lin.bias"] - batch["y"]) ** 2).mean()
    g = torch.autograd.grad(f, list(w.values()))
    g = [2.0 * t for t in g]
    norm = torch.sqrt(sum((t ** 2).sum() for t in g))
    g = [t * min(1.0, 0.1 / (float(norm) + 1e-6)) for t in g]
    for (n, p), gi in zip(module.named_parameters(), g):
        torch.testing.assert_close(p.detach(), w0[n] - 0.3 * gi + 0.5, rtol=1e-14, atol=1e-14)
        assert p.grad is None
    assert float(loss) == pytest.approx(float(f), rel=1e-15)


def test_the_k_step_loop_plans_outside_the_step_counts_and_sums_the_losses():
    order = []
    ctx = SimpleNamespace(params={"w": torch.zeros(2)}, step=0)

    def step(c, batch, k):
        order.append(("step", k, c.step))
        return torch.tensor(float(batch))

    total, first, taken = run_steps(ctx, [1.0, 2.0, 4.0], step, lambda c: order.append(("plan", c.step)))
    assert order == [("plan", 0), ("step", 0, 0), ("plan", 1), ("step", 1, 1), ("plan", 2), ("step", 2, 2)]
    assert (float(total), float(first), taken, ctx.step) == (7.0, 1.0, 3, 3)
    assert mean_losses(total, [3]) == [7.0 / 3]


def test_a_non_finite_mean_names_the_clients_first_loss_of_its_own_row():
    first = torch.tensor([0.5, 0.25, 0.125])
    said = []
    check_finite(4, 1.0, first, 2, lambda c, m, f: said.append((c, m, f)) or "x")
    assert said == []
    with pytest.raises(NonFiniteLossError):
        check_finite(7, float("nan"), first, 2, lambda c, m, f: said.append((c, m, f)) or "diverged")
    assert said[0][0] == 7 and said[0][2] == 0.125
