"""Per-step access for second-order and variance-reduced methods (issue 7 G3), through the real loop: the current
minibatch and loss in the step hooks, gradients at other weights (ClientContext.gradient_at), Hessian-vector
products (hvp) and per-client random streams (rng)."""
from __future__ import annotations

import torch
from torch import nn

from fl_lightning.strategies.base import Part
from fl_lightning.strategies.records import Field, Record
from tests.helpers.harness import FakeData, LossModule, MLP, build, method_config, mse, regression_batches, run
from tests.helpers.spies import Recorder


class Quadratic(nn.Module):
    """f(x) = ½ xᵀ A x − bᵀ x with a fixed symmetric positive definite, non-diagonal A (the batch carries b)."""

    def __init__(self, A: torch.Tensor):
        super().__init__()
        self.register_buffer("A", A, persistent=False)
        self.x = nn.Parameter(torch.linspace(-1, 1, A.shape[0], dtype=A.dtype))

    def loss(self, batch):
        return 0.5 * self.x @ self.A @ self.x - batch["b"] @ self.x


def _spd(d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    Q = torch.randn(d, d, generator=g, dtype=torch.float64)
    return Q @ Q.T / d + torch.eye(d, dtype=torch.float64)


class Hutchinson(Recorder):
    """diag(H) ≈ mean over Rademacher probes u of u ⊙ (H u) (Hutchinson 1990; Sophia's estimator, Liu et al. 2023)."""

    def __init__(self, probes: int):
        self.probes, self.estimates, self.draws = probes, [], []

    def after_backward(self, client):
        g = client.rng("hutchinson")
        x = client.params["net.x"]
        est = torch.zeros_like(x)
        for _ in range(self.probes):
            u = (torch.randint(0, 2, x.shape, generator=g, device=x.device) * 2 - 1).to(x.dtype)
            est += u * client.hvp({"net.x": u})["net.x"]
        self.estimates.append(est / self.probes)
        self.draws.append(torch.randint(0, 10**9, (1,), generator=client.rng("hutchinson")).item())


def test_hutchinson_estimate_of_the_hessian_diagonal(tmp_path):
    A = _spd()
    strategy = build(method_config("fedavg", ["method.lr=0.01"]))
    h = Hutchinson(probes=4000)
    h.name = "hutchinson"
    strategy.parts.insert(1, h)
    net = Quadratic(A)
    data = FakeData(lambda c, r, k: {"b": torch.full((5,), float(c), dtype=torch.float64)}, 2,
                    test_batch={"b": torch.zeros(5, dtype=torch.float64)})
    run(strategy, LossModule(net, lambda n, b: n.loss(b)), data, tmp_path, num_clients=2, per_round=2, rounds=1, local_steps=1)
    off = (A - torch.diag(torch.diag(A))).abs().sum(1)  # the estimator's noise scale per coordinate
    for est in h.estimates:
        assert ((est - torch.diag(A)).abs() <= 4 * off / 4000 ** 0.5 + 1e-12).all(), (est, torch.diag(A))
    assert len(set(h.draws)) == 2  # rng(purpose) is per client: two clients, two different streams


class GradientProbe(Recorder):
    """In every step: the gradient at the round's received global weights on the current minibatch."""

    def __init__(self):
        self.seen = []

    def after_backward(self, client):
        before = {n: p.detach().clone() for n, p in client.params.items()}
        grads_before = {n: p.grad.clone() for n, p in client.params.items()}
        g = client.gradient_at(weights={n: client.global_params[n] for n in client.params})
        for n, p in client.params.items():  # nothing moved
            assert torch.equal(p, before[n]) and torch.equal(p.grad, grads_before[n])
        self.seen.append(({k: v.clone() for k, v in client.global_params.items()},
                          {k: v.clone() for k, v in client.batch.items()}, g, float(client.loss)))


def test_gradient_at_previous_global_model_equals_a_direct_computation(tmp_path):
    strategy = build(method_config("fedavg", ["method.lr=0.05"]))
    probe = GradientProbe()
    probe.name = "probe"
    strategy.parts.insert(1, probe)
    run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(3), 3), tmp_path, num_clients=3, per_round=2,
        rounds=2, local_steps=3)
    assert len(probe.seen) == 2 * 2 * 3
    for x, batch, g, loss in probe.seen:
        ref = MLP()
        with torch.no_grad():
            for n, p in ref.named_parameters():
                p.copy_(x[f"net.{n}"])
        mse(ref, batch).backward()
        for n, p in ref.named_parameters():
            torch.testing.assert_close(g[f"net.{n}"], p.grad, rtol=1e-6, atol=1e-7)
        assert loss > 0


class IdleCounter(Recorder):
    """Counts, in each idle client's own state, the rounds it sat out; remembers who was idle when."""

    uses_idle_clients = True

    class State(Record):
        idle_rounds = Field("idle_rounds")

    def __init__(self):
        self.calls = []

    def client_idle(self, client):
        assert client.num_steps == 0
        state = self.State(self, client.state)
        state.idle_rounds.set(state.idle_rounds.get(default=torch.zeros((), dtype=torch.int64)) + 1)
        self.calls.append((client.round, client.id))


def test_idle_clients_hook_runs_for_every_unsampled_client(tmp_path):
    from fl_lightning import seeding

    strategy = build(method_config("fedavg"))
    idle = IdleCounter()
    idle.name = "idle"
    strategy.parts.append(idle)
    n, s, rounds = 5, 2, 4
    loop = run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(n), n), tmp_path, num_clients=n,
               per_round=s, rounds=rounds, local_steps=1)
    expect = [(r, c) for r in range(rounds) for c in range(n) if c not in seeding.sample_clients(0, r, n, s)]
    assert idle.calls == expect
    for c in range(n):
        sat_out = sum(1 for _, cc in expect if cc == c)
        st = loop.store.get(c)
        assert int(st.get("idle/idle_rounds", torch.tensor(0))) == sat_out


def test_methods_without_idle_parts_never_touch_unsampled_clients(tmp_path):
    strategy = build(method_config("fedavg", ["method.parts.local_optimizer.state=persistent", "method.momentum=0.9"]))
    assert not strategy.uses_idle_clients
    loop = run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(6), 6), tmp_path, num_clients=6,
               per_round=1, rounds=2, local_steps=1)
    from fl_lightning import seeding

    sampled = {c for r in range(2) for c in seeding.sample_clients(0, r, 6, 1)}
    assert set(loop.store.clients()) == sampled  # only clients that trained have state


def test_sampled_label_loss_draws_from_the_models_softmax():
    """Sophia-GNB's sampled labels (Liu et al. 2024, Alg. 2): ŷ ~ softmax(f(x)), so the empirical label frequencies
    match the softmax and the expected gradient w.r.t. the logits, softmax − E[onehot(ŷ)], is zero."""
    from fl_lightning.data.info import DataInfo
    from fl_lightning.models import ClassifierModule

    torch.manual_seed(0)
    logits0 = torch.tensor([[2.0, 0.0, -1.0, 0.5]])
    net = nn.Linear(1, 4, bias=True)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.copy_(logits0[0])
    module = ClassifierModule(net, DataInfo(input_shape=(1,), num_classes=4))
    batch = {"x": torch.zeros(20000, 1), "y": torch.zeros(20000, dtype=torch.long)}
    loss = module.sampled_label_loss(batch, torch.Generator().manual_seed(1))
    loss.backward()
    # d loss / d bias = mean over the batch of (softmax - onehot(ŷ)): ~0 with 20,000 draws
    assert net.bias.grad.abs().max() < 4 * 0.5 / 20000 ** 0.5
    again = ClassifierModule(net, DataInfo(input_shape=(1,), num_classes=4))
    a = again.sampled_label_loss(batch, torch.Generator().manual_seed(1))
    assert torch.equal(a.detach(), loss.detach())  # the draws are a pure function of the generator
