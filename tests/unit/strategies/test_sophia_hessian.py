"""SophiaHessian (seed 001 Alg. 8; Liu et al. Alg. 1-2) through the real loop: Hutchinson's estimate reaches
Sophia's h and matches the true Hessian diagonal of a quadratic; the schedule (rK + k) mod f_h = 0; GNB and the
empirical estimator against direct computations; one-line errors."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_lightning.config.args import checked
from fl_lightning.errors import ConfigError
from fl_lightning.strategies.base import Part
from fl_lightning.strategies.parts import SophiaHessian
from tests.helpers.harness import FakeData, LossModule, MLP, build, method_config, mse, regression_batches, run
from tests.unit.loop.test_client_services import Quadratic, _spd
from tests.helpers.spies import Recorder


class HessianSpy(Recorder):
    """After the hessian part: (round, step, h) of the first param whenever h changed."""

    def __init__(self):
        self.seen, self.last = [], None

    def after_backward(self, client):
        p = next(iter(client.params.values()))
        h = client.optimizer.state[p].get("hessian") if p in client.optimizer.state else None
        if h is not None and not h.any():  # the state allocated up front, zeroed: no estimate has arrived yet
            h = None
        if h is not None and (self.last is None or not torch.equal(h, self.last)):
            self.seen.append((client.round, client.step, h.clone()))
        self.last = None if h is None else h.clone()

    def client_start(self, client):
        self.last = None


def _sophia(overrides=()):
    strategy = build(method_config("local_sophia", ["method.lr=0.0", *overrides]))
    spy = HessianSpy()
    spy.name = "spy"
    strategy.parts.insert(2, spy)  # after local_optimizer and hessian
    return strategy, spy


def test_hutchinson_reaches_sophia_h_and_matches_the_hessian_diagonal(tmp_path):
    """β2 = 0 makes h = max(ĥ, 0) = ĥ (A is positive definite, the diagonal is positive): with 3000 probes the
    estimate is diag(A) within the Hutchinson noise bound."""
    A = _spd()
    strategy, spy = _sophia(["method.beta2=0.0", "method.parts.hessian.every=1", "method.parts.hessian.probes=3000"])
    data = FakeData(lambda c, r, k: {"b": torch.full((5,), float(c), dtype=torch.float64)}, 1,
                    test_batch={"b": torch.zeros(5, dtype=torch.float64)})
    run(strategy, LossModule(Quadratic(A), lambda n, b: n.loss(b)), data, tmp_path, num_clients=1, per_round=1,
        rounds=1, local_steps=1)
    assert len(spy.seen) == 1
    off = (A - torch.diag(torch.diag(A))).abs().sum(1)
    est = spy.seen[0][2]
    assert ((est - torch.diag(A)).abs() <= 4 * off / 3000 ** 0.5).all(), (est, torch.diag(A))


def test_estimates_on_global_steps_multiple_of_every(tmp_path):
    """K = 3, f_h = 2, two rounds: global steps rK + k = 2, 4, 6 → round 0 step index 1, round 1 indices 0 and 2."""
    strategy, spy = _sophia(["method.parts.hessian.every=2"])
    n = 1
    run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(n), n), tmp_path, num_clients=n, per_round=1,
        rounds=2, local_steps=3)
    assert [(r, k) for r, k, _ in spy.seen] == [(0, 1), (1, 0), (1, 2)]


def test_empirical_and_gnb_estimators_equal_direct_computations():
    """empirical: ĥ = g⊙g of the current minibatch gradient; gnb: ĥ = B·ĝ⊙ĝ with ĝ the gradient of the loss
    against labels drawn from the model's softmax with the part's generator (Liu et al. Alg. 2)."""
    from fl_lightning.data.info import DataInfo
    from fl_lightning.models import ClassifierModule

    torch.manual_seed(0)
    module = ClassifierModule(nn.Linear(4, 3), DataInfo(num_classes=3, input_shape=(4,)))
    batch = {"x": torch.randn(6, 4), "y": torch.randint(0, 3, (6,))}
    params = dict(module.named_parameters())

    class Client:  # the ClientContext services the part uses, computed directly
        round, num_steps, step, id = 0, 1, 0, 0

        def __init__(self):
            self.params, self.batch, self.module = params, batch, module
            self.states = {}

        def state_of(self, part):  # the part's round state as its client_start would make it
            return self.states.setdefault(part.name, part.Round())

        def rng(self, purpose):
            return torch.Generator().manual_seed(123)

        def gradient_at(self, loss_fn):
            grads = torch.autograd.grad(loss_fn(module, batch), list(params.values()))
            return dict(zip(params, grads))

    loss = module.training_step(batch)
    grads = torch.autograd.grad(loss, list(params.values()))
    for p, g in zip(params.values(), grads):
        p.grad = g
    emp = SophiaHessian("empirical", every=1).estimate(Client())
    for (n, p), g in zip(params.items(), grads):
        torch.testing.assert_close(emp[n], g.square())

    part = SophiaHessian("gnb", every=1)
    part.name = "hessian"
    got = part.estimate(Client())
    logits = module(batch["x"])
    y_hat = torch.multinomial(torch.softmax(logits.detach(), -1), 1, generator=torch.Generator().manual_seed(123))
    ref = torch.autograd.grad(nn.functional.cross_entropy(logits, y_hat.squeeze(-1)), list(params.values()))
    for (n, _), g in zip(params.items(), ref):
        torch.testing.assert_close(got[n], 6 * g.square())


def test_config_errors():
    with pytest.raises(ConfigError, match="estimator"):
        SophiaHessian("fisher")
    with pytest.raises(ConfigError, match="every"):
        checked(SophiaHessian, every=0)


def test_a_non_sophia_optimizer_is_one_line(tmp_path):
    strategy = build(method_config("local_sophia", ["optimizer=adamw"]))
    strategy.parts[1].config_key = "method.parts.hessian"
    with pytest.raises(ConfigError, match="method.parts.hessian.estimator.*AdamW takes no Hessian"):
        run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(1), 1), tmp_path, num_clients=1,
            per_round=1, rounds=1, local_steps=1)
