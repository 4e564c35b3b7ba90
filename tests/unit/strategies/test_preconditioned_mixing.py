"""PreconditionedMixing (FedPM, spec 001 §5.6): x^{r+1} = Σ_i (h_i + λ) ⊙ x_i / Σ_i (h_i + λ), element-wise, with h_i
the client's final Sophia Hessian EMA; written out here from the clients' final models and states."""
import pytest
import torch

from fl_lightning.config.args import checked
from fl_lightning.errors import ConfigError
from fl_lightning.strategies.base import Part
from fl_lightning.strategies.parts import PreconditionedMixing
from tests.helpers.harness import FakeData, LossModule, MLP, build, method_config, mse, regression_batches, run
from tests.helpers.spies import Recorder


class EndSpy(Recorder):
    """The client's final model and Sophia h, and x^r, per round."""

    def __init__(self):
        self.ends, self.x = [], {}

    def setup(self, server):
        self.server = server

    def broadcast(self, r):
        self.x[r] = {n: t.clone() for n, t in self.server.global_params.items()}
        return {}

    def client_end(self, client):
        from fl_lightning.optim import adapter_for

        a = adapter_for(client.optimizer)
        self.ends.append((client.round, {n: t.detach().clone() for n, t in client.local.items()},
                          {n: a.export_state(p)["hessian"].clone() for n, p in client.params.items()}))
        return {}


@pytest.mark.parametrize("damping", [1e-8, 1e3])
def test_fedpm_mixes_by_the_clients_curvature(tmp_path, damping):
    n, s, rounds = 5, 3, 3
    strategy = build(method_config("fedpm", ["method.lr=0.01", "method.parts.hessian.every=2",
                                             f"method.damping={damping}"]))
    spy = EndSpy()
    spy.name = "spy"
    strategy.parts.insert(0, spy)
    loop = run(strategy, LossModule(MLP(dtype=torch.float64), mse),
               FakeData(regression_batches(n, dtype=torch.float64), n), tmp_path, num_clients=n, per_round=s,
               rounds=rounds, local_steps=4)
    for r in range(rounds):
        ends = [(x, h) for rr, x, h in spy.ends if rr == r]
        x_next = spy.x[r + 1] if r + 1 < rounds else loop.global_params
        for name in x_next:
            w = torch.stack([h[name] + damping for _, h in ends])
            xs = torch.stack([x[name] for x, _ in ends])
            want = (w * xs).sum(0) / w.sum(0)
            torch.testing.assert_close(x_next[name], want, rtol=1e-10, atol=1e-12)
            if damping > 1:  # λ → ∞: the plain mean
                torch.testing.assert_close(x_next[name], xs.mean(0), rtol=1e-4, atol=1e-6)
    assert any(h[nm].abs().max() > 0 for _, _, h in spy.ends for nm in h)


def test_bad_values_are_config_errors():
    with pytest.raises(ConfigError, match="damping"):
        checked(PreconditionedMixing, damping=0)
    with pytest.raises(ConfigError, match="state_keys"):
        PreconditionedMixing(state_keys=["a", "b"])
