"""OptimizerStateAverage (seeds 003/004): clients start every round from the server's mean of
last round's optimizer state: Muon momenta, or any entry a state adapter exports (Adam's m, v and step)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.harness import FakeData, LossModule, MLP, build, method_config, mse, regression_batches, run
from tests.helpers.spies import MomentumSpy, StateSpy


def test_fedmuon_clients_start_from_mean_momentum(tmp_path):
    cfg = method_config("fedmuon")
    strategy = build(cfg)
    spy = MomentumSpy()
    spy.name = "spy"
    strategy.parts.insert(2, spy)
    n, s, rounds = 5, 3, 4
    run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(n), n), tmp_path,
        num_clients=n, per_round=s, rounds=rounds, local_steps=3)
    for r in range(rounds):
        starts = [m for rr, _, m in spy.starts if rr == r]
        if r == 0:
            assert all(t.abs().max() == 0 for m in starts for t in m.values())  # M̄^0 = 0
            continue
        prev_ends = [m for rr, _, m in spy.ends if rr == r - 1]
        for name in starts[0]:
            mean = torch.stack([m[name] for m in prev_ends]).mean(0)
            for m in starts:
                torch.testing.assert_close(m[name], mean, rtol=1e-6, atol=1e-7)


def test_adam_state_travels_whole_through_the_adapter(tmp_path):
    """torch.optim.Adam + OptimizerStateAverage(params=all, state_keys=all): every client starts round r with the
    mean over last round's sampled clients of m, v and the step count (cast back to Adam's 0-d tensor): the seam
    that carries Sophia's h and SOAP's L, R. Before the adapter, a partial Adam state raised KeyError: 'exp_avg'."""
    from fl_lightning.strategies.parts import OptimizerStateAverage

    cfg = method_config("fedavg_adam", ["method.parts.local_optimizer.state=reset"])
    strategy = build(cfg)
    avg = OptimizerStateAverage(params="all", state_keys="all")
    avg.name = "state"
    spy = StateSpy()
    spy.name = "spy"
    strategy.parts[1:1] = [avg, spy]
    n, s, rounds = 4, 2, 3
    run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(n), n), tmp_path,
        num_clients=n, per_round=s, rounds=rounds, local_steps=2)
    for r in range(1, rounds):
        starts = [m for rr, _, m in spy.starts if rr == r]
        prev_ends = [m for rr, _, m in spy.ends if rr == r - 1]
        assert len(starts) == s and len(prev_ends) == s
        for name in starts[0]:
            assert set(starts[0][name]) == {"step", "exp_avg", "exp_avg_sq"}
            for entry in ("exp_avg", "exp_avg_sq", "step"):
                mean = torch.stack([m[name][entry].double() for m in prev_ends]).mean(0)
                for m in starts:
                    torch.testing.assert_close(m[name][entry].double(), mean, rtol=1e-6, atol=1e-9)
        assert all(float(m[name]["step"]) == 2 * r for m in starts for name in m)  # 2 steps per round, averaged


def test_params_muon_with_a_non_muon_optimizer_is_one_line(tmp_path):
    from fl_lightning.errors import ConfigError
    from fl_lightning.strategies.parts import OptimizerStateAverage

    strategy = build(method_config("fedavg"))
    avg = OptimizerStateAverage(params="muon")
    avg.name, avg.config_key = "momentum", "method.parts.momentum"
    strategy.parts.insert(1, avg)
    with pytest.raises(ConfigError, match="method.parts.momentum.params.*SGD updates no parameter as a Muon"):
        run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(2), 2), tmp_path,
            num_clients=2, per_round=1, rounds=1, local_steps=1)


def test_theta_moves_soap_factors_and_recomputes_eigenbases(tmp_path):
    """state_keys=theta with SOAP (FedPAC's alignment, spec 001 §4.1): clients start round r with L, R = the mean
    of last round's final factors and Q = eigh of those means (never averaged); M, V, step start fresh."""
    from fl_lightning.strategies.parts import OptimizerStateAverage

    strategy = build(method_config("local_soap"))
    avg = OptimizerStateAverage(params="all", state_keys="theta")
    avg.name = "theta"
    spy = StateSpy()
    spy.name = "spy"
    strategy.parts[1:1] = [avg, spy]
    n, s, rounds = 4, 2, 3
    run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(n), n), tmp_path,
        num_clients=n, per_round=s, rounds=rounds, local_steps=3)
    for r in range(1, rounds):
        starts = [m for rr, _, m in spy.starts if rr == r]
        prev_ends = [m for rr, _, m in spy.ends if rr == r - 1]
        for name in ("net.l1.weight", "net.l2.weight"):
            for entry in ("GG0", "GG1"):
                mean = torch.stack([m[name][entry] for m in prev_ends]).mean(0)
                for m in starts:
                    torch.testing.assert_close(m[name][entry], mean, rtol=1e-6, atol=1e-8)
            for m in starts:
                assert m[name]["step"] == 0 and m[name]["exp_avg"].abs().max() == 0
                for i in (0, 1):
                    Q, F = m[name][f"Q{i}"], m[name][f"GG{i}"]
                    ev = torch.diag(Q.T @ F @ Q)
                    torch.testing.assert_close(Q @ torch.diag(ev) @ Q.T, F, rtol=1e-4, atol=1e-6)
        assert all(m["net.l1.bias"] == {} for m in starts)  # a bias has no factor: nothing sent, a fresh state
