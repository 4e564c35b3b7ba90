"""PreconditionerDrift (seed 001 §6.1, eq. 15): Δ_D^r = (1/S) Σ_i ‖Θ_i^{r,K} − Θ̄^{r,K}‖², logged per round, equal to
the definition computed from the clients' final states; the diagnostic uploads cost 0 bits; it also measures
Local-X, where Θ̄ is never broadcast."""
import pytest
import torch

from fl_lightning.errors import ConfigError
from fl_lightning.strategies.parts import PreconditionerDrift
from tests.helpers.harness import FakeData, LossModule, MLP, build, method_config, mse, regression_batches, run
from tests.helpers.spies import StateSpy

THETA = {"fedpac_soap": ("GG0", "GG1"), "fedpac_sophia": ("hessian",), "fedpac_muon": ("momentum_buffer",),
         "local_sophia": ("hessian",), "fedpac_sophia_light": ("hessian",)}


def _drift_by_definition(ends, method):
    theta = [(n, e) for n, st in ends[0].items() for e in THETA[method] if e in st]
    assert theta
    total = 0.0
    for n, e in theta:
        stack = torch.stack([m[n][e].double() for m in ends])
        total += float((stack - stack.mean(0)).square().sum()) / len(ends)
    return total


@pytest.mark.parametrize("method,extra", [
    ("fedpac_soap", ["method.lr=0.01", "method.precondition_frequency=2"]),
    ("fedpac_sophia", ["method.lr=0.01", "method.parts.hessian.every=2"]),
    ("fedpac_sophia_light", ["method.lr=0.01", "method.parts.hessian.every=2"]),
    ("fedpac_muon", ["method.ns_dtype=null"]),
    ("local_sophia", ["method.parts.hessian.every=2",
                      "+method.parts.drift._target_=fl_lightning.strategies.parts.PreconditionerDrift"]),
])
def test_logged_drift_is_the_definition_and_costs_no_bits(tmp_path, method, extra):
    n, s, rounds = 5, 3, 3
    data = FakeData(regression_batches(n), n)
    kw = dict(num_clients=n, per_round=s, rounds=rounds, local_steps=4, eval_every=1)  # a metrics row every round
    on = ["method.log_drift=true"] if method.startswith("fedpac") else []
    strategy = build(method_config(method, [*extra, *on]))
    spy = StateSpy()
    spy.name = "spy"
    strategy.parts.insert(1, spy)
    loop = run(strategy, LossModule(MLP(), mse), data, tmp_path / "on", **kw)
    rows = loop.recorder.rows
    assert len(rows) == rounds
    for r in range(rounds):
        ends = [m for rr, _, m in spy.ends if rr == r]
        want = _drift_by_definition(ends, method)
        assert want > 0
        assert rows[r]["precond_drift"] == pytest.approx(want, rel=1e-9, abs=1e-15)
    if method.startswith("fedpac"):  # the same run without the diagnostic: identical bits and weights
        off = run(build(method_config(method, extra)), LossModule(MLP(), mse), data, tmp_path / "off", **kw)
        assert off.recorder.totals == loop.recorder.totals
        assert "precond_drift" not in off.recorder.rows[-1]
        for k, v in off.global_params.items():
            assert torch.equal(v, loop.global_params[k])


def test_bad_values_are_config_errors():
    with pytest.raises(ConfigError, match="enabled"):
        PreconditionerDrift(enabled="yes")
    with pytest.raises(ConfigError, match="state_keys"):
        PreconditionerDrift(state_keys="all")
