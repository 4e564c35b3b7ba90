"""MagnitudeUniformity (seed 002 Def. 3.1, spec 002 §5): the logged Φ_t against the definition written out from
the uploads the clients actually sent (captured by a spy part), for every block mode; Φ = d_sub exactly for FedSMU;
the automatic block is the bias of the last hidden Linear (seed 002's fc2.bias, 192 units); bad blocks are one-line
errors naming the key."""
from __future__ import annotations

import pytest
import torch

from fl_lightning.errors import ConfigError
from fl_lightning.models.cnn_fedsmu import FedSMUCNN
from fl_lightning.strategies.base import Part, ServerContext
from fl_lightning.strategies.parts import MagnitudeUniformity
from tests.helpers.harness import FakeData, LossModule, MLP, build, make_loop, method_config, mse, regression_batches
from tests.helpers.spies import Recorder


class UploadSpy(Recorder):
    """Records, per round, what each client uploaded (the aggregation part's scratch)."""

    def __init__(self):
        self.rounds: dict[int, list[dict]] = {}

    def client_end(self, client):
        self.rounds.setdefault(client.round, []).append({k: v.clone() for k, v in client.output("model_update").items()})
        return {}


def _phi(mags: torch.Tensor) -> float:
    """Def. 3.1: sum_j (sum_i g_ij)^2 / (n sum_i g_ij^2), mags of shape (n, d_sub), all-zero coordinates skipped."""
    n = mags.shape[0]
    total = 0.0
    for j in range(mags.shape[1]):
        col = mags[:, j].double()
        if float(col.square().sum()) > 0:
            total += float(col.sum()) ** 2 / (n * float(col.square().sum()))
    return total


def _run(tmp_path, method, overrides, rounds=3):
    strategy = build(method_config(method, overrides))
    spy = UploadSpy()
    spy.name = "spy"
    strategy.parts.append(spy)
    loop = make_loop(strategy, LossModule(MLP(), mse), FakeData(regression_batches(5), 5), tmp_path, num_clients=5,
                     per_round=3, rounds=rounds, local_steps=3, eval_every=1)
    loop.setup()
    loop.run(progress_enabled=False)
    return loop, spy


MU = ["+method.parts.mu._target_=fl_lightning.strategies.parts.MagnitudeUniformity"]


@pytest.mark.parametrize("mode,block,pick", [
    ("coords", "auto", lambda u: u["net.l1.bias"].abs().reshape(1, -1)),          # MLP: l1 is the last hidden Linear
    ("coords", "net.l2.weight", lambda u: u["net.l2.weight"].abs().reshape(1, -1)),
    ("rows", "auto", lambda u: u["net.l1.weight"].double().norm(dim=1).reshape(1, -1)),
    ("all", "auto", lambda u: torch.cat([t.abs().reshape(-1) for t in u.values()]).reshape(1, -1)),
])
def test_fedavg_mu_is_the_definition(tmp_path, mode, block, pick):
    loop, spy = _run(tmp_path, "fedavg", [*MU, f"+method.parts.mu.mode={mode}", f"+method.parts.mu.block={block}"])
    for r, row in enumerate(loop.recorder.rows):
        mags = torch.cat([pick(u) for u in spy.rounds[r]])
        assert row["mu"] == pytest.approx(_phi(mags), rel=1e-9)
        assert row["mu_frac"] == pytest.approx(_phi(mags) / mags.shape[1], rel=1e-9)
        assert 1 / 3 * mags.shape[1] - 1e-9 <= row["mu"] < mags.shape[1]  # Jain: [1/n, 1] per coordinate, n = 3


@pytest.mark.parametrize("sign_zero", ["0", "+1"])
def test_fedsmu_mu_is_d_sub_exactly(tmp_path, sign_zero):
    """Every FedSMU upload has magnitude 1 per coordinate (no exact zeros in this tanh MLP): Φ = d_sub."""
    loop, _ = _run(tmp_path, "fedsmu", ["method.log_mu=true", f"method.sign_zero={sign_zero}"])
    assert [row["mu"] for row in loop.recorder.rows] == [5.0] * 3  # l1.bias has 5 units
    loop, _ = _run(tmp_path / "all", "fedsmu", ["method.log_mu=true", "method.mu_mode=all"])
    assert all(row["mu"] == sum(p.numel() for p in MLP().parameters()) for row in loop.recorder.rows)


def test_disabled_logs_nothing_and_uploads_nothing(tmp_path):
    loop, _ = _run(tmp_path, "fedsmu", [])
    assert "mu" not in loop.recorder.rows[-1]
    assert loop.recorder.totals["uplink_bits"] == 3 * 3 * sum(p.numel() for p in MLP().parameters())


def _server(module):
    names = [n for n, _ in module.named_parameters()]
    return ServerContext(module=module, global_params=dict(module.named_parameters()), trainable=names,
                         num_clients=1, clients_per_round=1, rounds=1, device=torch.device("cpu"),
                         client_num_samples=[1])


def test_auto_block_is_fc2_bias_of_seed_002_cnn():
    cnn = FedSMUCNN(3, 10, (32, 32))
    part = MagnitudeUniformity(block="auto")
    part.setup(_server(cnn))
    assert part.param == "classifier.3.bias" and dict(cnn.named_parameters())[part.param].numel() == 192
    rows = MagnitudeUniformity(block="auto", mode="rows")
    rows.setup(_server(cnn))
    assert rows.param == "classifier.3.weight"


def test_bad_blocks_are_config_errors():
    with pytest.raises(ConfigError, match="mode"):
        MagnitudeUniformity(mode="cols")
    part = MagnitudeUniformity(block="nope.bias")
    part.config_key = "method.parts.mu"
    with pytest.raises(ConfigError, match="method.parts.mu.block"):
        part.setup(_server(MLP()))
    part = MagnitudeUniformity(block="l1.bias", mode="rows")
    with pytest.raises(ConfigError, match="mode"):
        part.setup(_server(MLP()))


def test_a_reader_of_a_client_output_listed_before_its_writer_is_one_line(tmp_path):
    """Order between parts is stated, not implied: MagnitudeUniformity reads ModelAverage's per-client output
    ``model_update`` (ClientContext.put / output), so listing it first is refused when the method is built."""
    import functools

    from fl_lightning.strategies import Strategy
    from fl_lightning.strategies.parts import LocalOptimizer, ModelAverage

    opt = functools.partial(torch.optim.SGD, lr=0.1)
    Strategy("ok", {"local_optimizer": LocalOptimizer(opt), "aggregation": ModelAverage(), "mu": MagnitudeUniformity()})
    with pytest.raises(ConfigError) as err:
        Strategy("bad", {"local_optimizer": LocalOptimizer(opt), "mu": MagnitudeUniformity(), "aggregation": ModelAverage()})
    assert err.value.key == "method.parts" and "part 'mu' reads the client output 'model_update', which part " \
        "'aggregation' writes after it" in str(err.value) and "list aggregation before mu" in str(err.value)


def test_an_undeclared_client_output_is_a_programming_error():
    from fl_lightning.strategies.base import ClientContext

    c = ClientContext(id=0, round=0, module=None, params={}, local={}, global_params={}, state={}, num_samples=1,
                      num_steps=1, lr_factor=1.0)
    with pytest.raises(RuntimeError, match="without declaring it in provides"):
        c.put(Part(), "model_update", {})
    assert c.output("model_update") is None
