"""LocalOptimizer: optimizer state reset every round, or kept per client in the ClientStateStore (off the device)."""
from __future__ import annotations

import torch

from tests.helpers.cli import FAST, build_loop
from tests.helpers.harness import FakeData, LossModule, MLP, build, method_config, mse, regression_batches, run
from tests.helpers.spies import MomentumSpy


def test_persistent_optimizer_state_lives_in_store(tmp_path):
    loop = build_loop(FAST + ["method.momentum=0.9", "method.parts.local_optimizer.state=persistent"], tmp_path)
    loop.run()
    stored = loop.store.clients()
    assert stored and all(c in range(6) for c in stored)
    st = loop.store.get(stored[0])
    assert any(k.endswith("momentum_buffer") for k in st)
    assert all(v.device.type == "cpu" for v in st.values())


def test_adam_baseline_runs_and_keeps_state(tmp_path):
    loop = build_loop(FAST + ["method=fedavg_adam"], tmp_path)
    loop.run()
    st = loop.store.get(loop.store.clients()[0])
    assert any(k.endswith("exp_avg_sq") for k in st)


def test_local_muon_momentum_persists_per_client(tmp_path):
    """seed 000 LocalMuon: M_i^{(r,0)} = M_i^{(r',K)} of the client's previous round (state: persistent); with
    state=reset (seed 004's Local Muon) every round starts from zero."""
    for state in ("persistent", "reset"):
        cfg = method_config("local_muon", [f"method.parts.local_optimizer.state={state}"])
        strategy = build(cfg)
        spy = MomentumSpy()
        spy.name = "spy"
        strategy.parts.append(spy)
        n = 4
        run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(n), n), tmp_path / state,
            num_clients=n, per_round=2, rounds=6, local_steps=2)
        last_end = {}
        seen = 0
        for (r, cid, start), (_, _, end) in zip(spy.starts, spy.ends):
            for name, t in start.items():
                if state == "reset" or cid not in last_end:
                    assert t.abs().max() == 0
                else:
                    assert torch.equal(t, last_end[cid][name])
                    seen += 1
            last_end[cid] = end
        assert state == "reset" or seen > 0


class ListStateOpt(torch.optim.Optimizer):
    """SOAP-shaped state: per-param lists of tensors and a counter, and a param-group step counter."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            for p in group["params"]:
                st = self.state[p]
                hist = st.setdefault("hist", [])
                hist.append(p.grad.clone())
                st["hist"] = hist[-2:]
                st["count"] = st.get("count", 0) + 1
                p.sub_(group["lr"] * torch.stack(st["hist"]).mean(0) * (1 + 1 / group["step"]))


def test_persistent_state_keeps_lists_counters_and_group_counters(tmp_path):
    """One client, full participation: K steps per round for R rounds with the state swapped out and back in each
    round equals R·K uninterrupted steps of the same optimizer on the same batches."""
    import functools

    from fl_lightning.strategies.parts import LocalOptimizer, ModelAverage
    from fl_lightning.strategies.base import Strategy

    strategy = Strategy("toy", {"local_optimizer": LocalOptimizer(functools.partial(ListStateOpt, lr=0.05), "persistent"),
                                "aggregation": ModelAverage()})
    batch_fn = regression_batches(1)
    rounds, K = 4, 3
    loop = run(strategy, LossModule(MLP(), mse), FakeData(batch_fn, 1), tmp_path, num_clients=1, per_round=1,
               rounds=rounds, local_steps=K)
    net = MLP()
    opt = ListStateOpt(net.parameters(), lr=0.05)
    for r in range(rounds):
        for k in range(K):
            opt.zero_grad()
            mse(net, batch_fn(0, r, k)).backward()
            opt.step()
    for n, p in net.named_parameters():
        torch.testing.assert_close(loop.global_params[f"net.{n}"], p, rtol=1e-6, atol=1e-7)
    st = loop.store.get(0)
    assert int(st["local_optimizer/group0/step#py"]) == rounds * K and int(st["local_optimizer/0/count#py"]) == rounds * K


class DictStateOpt(torch.optim.SGD):
    @torch.no_grad()
    def step(self, closure=None):
        super().step()
        for p in self.param_groups[0]["params"]:
            self.state[p]["meta"] = {"note": "not a tensor"}


def test_unstorable_state_is_a_one_line_error(tmp_path):
    import functools

    import pytest

    from fl_lightning.errors import ConfigError
    from fl_lightning.strategies.parts import LocalOptimizer, ModelAverage
    from fl_lightning.strategies.base import Strategy

    lo = LocalOptimizer(functools.partial(DictStateOpt, lr=0.05), "persistent")
    lo.config_key = "method.parts.local_optimizer"
    strategy = Strategy("toy", {"local_optimizer": lo, "aggregation": ModelAverage()})
    with pytest.raises(ConfigError) as err:
        run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(1), 1), tmp_path, num_clients=1, per_round=1,
            rounds=1, local_steps=1)
    assert err.value.key == "method.parts.local_optimizer.state" and "dict" in str(err.value)


def test_local_optimizer_is_a_required_slot_built_first(tmp_path):
    """Parts that need client.optimizer (momentum loading, alignment) work whatever the list order: the slot is built
    before every other part's client_start; a method without one is refused at setup."""
    import pytest

    from fl_lightning.errors import ConfigError

    data = FakeData(regression_batches(4), 4)
    kw = dict(num_clients=4, per_round=2, rounds=3, local_steps=2)
    a = run(build(method_config("fedmuon")), LossModule(MLP(), mse), data, tmp_path / "a", **kw)
    s = build(method_config("fedmuon"))
    s.parts.append(s.parts.pop(0))  # local_optimizer last
    b = run(s, LossModule(MLP(), mse), data, tmp_path / "b", **kw)
    for k in a.global_params:
        assert torch.equal(a.global_params[k], b.global_params[k])
    s = build(method_config("fedavg", ["~method.parts.local_optimizer"]))
    with pytest.raises(ConfigError, match="method.parts"):
        run(s, LossModule(MLP(), mse), data, tmp_path / "c", **kw)
