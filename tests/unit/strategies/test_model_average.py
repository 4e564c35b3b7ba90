"""ModelAverage: the streaming weighted mean (FedAvg, McMahan et al. 2017) and seed 000's (n-S)/n rule, against the
clients' trained weights recorded before aggregation."""
from __future__ import annotations

import torch

from fl_lightning.strategies.base import Part
from tests.helpers.cli import FAST, build_loop
from tests.helpers.spies import Recorder


class Spy(Recorder):
    """Records each client's trained weights (before the aggregation part sees them)."""

    def __init__(self):
        self.seen = []

    def client_end(self, client):
        self.seen.append((client.id, client.num_samples, {k: v.detach().clone() for k, v in client.local.items()}))
        return {}


def _one_round_with_spy(tmp_path, extra):
    loop = build_loop(FAST + ["fl.rounds=1"] + extra, tmp_path)
    spy = Spy()
    loop.strategy.parts.insert(0, spy)
    x0 = {k: v.clone() for k, v in loop.global_params.items()}
    loop.run_round(0)
    return loop, spy, x0


def test_streaming_mean_weighted_by_samples(tmp_path):
    loop, spy, _ = _one_round_with_spy(tmp_path, ["method.parts.aggregation.weighting=num_samples"])
    assert len(spy.seen) == 3
    tot = sum(n for _, n, _ in spy.seen)
    for k, x in loop.global_params.items():
        expect = sum(n * w[k] for _, n, w in spy.seen) / tot
        torch.testing.assert_close(x, expect, rtol=1e-5, atol=1e-6)


def test_n_minus_s_rule_seed000(tmp_path):
    loop, spy, x0 = _one_round_with_spy(tmp_path, ["method.parts.aggregation.rule=n_minus_s"])
    n, S = 6, 3
    for k, x in loop.global_params.items():
        expect = (n - S) / n * x0[k] + sum(w[k] for _, _, w in spy.seen) / n
        torch.testing.assert_close(x, expect, rtol=1e-5, atol=1e-6)


def test_n_minus_s_with_full_participation_is_plain_mean(tmp_path):
    loop, spy, _ = _one_round_with_spy(tmp_path, ["method.parts.aggregation.rule=n_minus_s", "fl.clients_per_round=6"])
    for k, x in loop.global_params.items():
        torch.testing.assert_close(x, sum(w[k] for _, _, w in spy.seen) / 6, rtol=1e-5, atol=1e-6)


def _regression_run(tmp_path, overrides):
    from tests.helpers.harness import (FakeData, LossModule, MLP, build, method_config, mse, params_of,
                                       regression_batches, run)

    loop = run(build(method_config("fedavg", overrides)), LossModule(MLP(), mse), FakeData(regression_batches(4), 4),
               tmp_path, num_clients=4, per_round=2, rounds=4, local_steps=3)
    return params_of(loop), loop


def test_server_opt_none_is_todays_averaging_bit_for_bit(tmp_path):
    """server_opt=None (explicit) and no server_opt at all give identical weights and no server state."""
    a, la = _regression_run(tmp_path / "a", [])
    b, lb = _regression_run(tmp_path / "b", ["+method.parts.aggregation.server_opt=null"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert la.strategy.state_dict() == {} and lb.strategy.state_dict() == {}


def test_server_sgd_is_server_lr_bit_for_bit(tmp_path):
    """FedOpt with SERVEROPT = SGD(eta_g) (Reddi et al. 2021, Alg. 1) is FedAvg with server_lr = eta_g, exactly."""
    a, _ = _regression_run(tmp_path / "a", ["method.parts.aggregation.server_lr=0.7"])
    b, lb = _regression_run(tmp_path / "b", ["+server_opt=sgd", "+method.server_lr=0.7",
                                             "+method.parts.aggregation.server_opt=${server_opt}"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert set(lb.strategy.state_dict()) == {"aggregation/server_opt/step"}
