"""Our server optimizers against Flower's strategy implementations on the same inputs (issue 15): the two-client
quadratic of test_server_opt.py through the real loop; every round the clients' models (K steps of plain SGD from
the current global model, written out) go to Flower's ``aggregate_fit`` and both global models must agree.

* ``fedadam`` with ``server_v0=zero`` and ``server_bias_correction=step_size`` is ``flwr.server.strategy.FedAdam``
  (m, v start at 0; lr_t = eta sqrt(1 - beta2^t) / (1 - beta1^t), tau uncorrected). Flower's exponent is its
  ``server_round + 1`` with rounds counted from 1, one round ahead of Kingma & Ba's t; we hand it ``t - 1``.
* ``fedyogi`` with ``server_v0=zero`` is ``FedYogi`` (no bias correction, v from 0).
* ``fedavg_server_momentum`` (Hsu et al. 2019) is ``FedAvgM(server_momentum=beta)``.

FedAMS has no Flower strategy. ``flwr`` is not a dependency of this project (it pulls a gRPC server stack): the test
skips, saying so, when it is not installed.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr", reason="flwr (Flower) is not installed; it is not a dependency of fl_lightning "
                                          "(pip install flwr to run this comparison)")

from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays  # noqa: E402
from flwr.server.strategy import FedAdam, FedAvgM, FedYogi  # noqa: E402

from tests.helpers.harness import FakeData, LossModule, build, make_loop, method_config  # noqa: E402

D, K, LOCAL_LR, ROUNDS = 4, 3, 0.1, 8
A = torch.tensor([[1.0, 0.5, 2.0, 0.2], [0.3, 1.5, 1.0, 2.5]], dtype=torch.float64)
C = torch.tensor([[1.0, -2.0, 0.5, 3.0], [-1.0, 1.0, 2.0, -0.5]], dtype=torch.float64)
X0 = torch.tensor([0.3, -0.4, 0.1, 0.2], dtype=torch.float64)
WEIGHTS = [10, 11]  # FakeData.num_samples = Flower's num_examples (both weight the mean by them)


class Vec(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(X0.clone())


def quad_loss(net, batch):
    return 0.5 * (batch["a"] * (net.w - batch["c"]) ** 2).sum()


def local_sgd(x: np.ndarray, i: int) -> np.ndarray:
    w = x.copy()
    for _ in range(K):
        w = w - LOCAL_LR * A[i].numpy() * (w - C[i].numpy())
    return w


def our_loop(method, overrides, tmp_path):
    cfg = method_config(method, [f"method.lr={LOCAL_LR}", *overrides])
    data = FakeData(lambda c, r, k: {"a": A[c][None].clone(), "c": C[c][None].clone()}, 2)
    loop = make_loop(build(cfg), LossModule(Vec(), quad_loss), data, tmp_path, num_clients=2, per_round=2,
                     rounds=ROUNDS, local_steps=K)
    loop.setup()
    return loop


def fit_results(x: np.ndarray):
    ok = Status(code=Code.OK, message="")
    return [(None, FitRes(status=ok, parameters=ndarrays_to_parameters([local_sgd(x, i)]), num_examples=WEIGHTS[i],
                          metrics={})) for i in range(2)]


def compare(loop, strategy, round_arg):
    x = X0.numpy().copy()
    for r in range(ROUNDS):
        loop.run_round(r)
        params, _ = strategy.aggregate_fit(round_arg(r + 1), fit_results(x), [])
        x = parameters_to_ndarrays(params)[0]
        np.testing.assert_allclose(loop.global_params["net.w"].numpy(), x, rtol=1e-12, atol=1e-13,
                                   err_msg=f"round {r + 1}")
    assert np.abs(x - X0.numpy()).max() > 1e-2  # it moved


def test_fedadam_matches_flower(tmp_path):
    eta, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    loop = our_loop("fedadam", [f"method.server_lr={eta}", f"method.server_tau={tau}", "method.server_v0=zero",
                                "method.server_bias_correction=step_size"], tmp_path)
    flower = FedAdam(initial_parameters=ndarrays_to_parameters([X0.numpy()]), eta=eta, eta_l=LOCAL_LR, beta_1=b1,
                     beta_2=b2, tau=tau)
    compare(loop, flower, lambda t: t - 1)  # Flower's exponent is server_round + 1


def test_fedyogi_matches_flower(tmp_path):
    eta, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    loop = our_loop("fedyogi", [f"method.server_lr={eta}", f"method.server_tau={tau}", "method.server_v0=zero"],
                    tmp_path)
    flower = FedYogi(initial_parameters=ndarrays_to_parameters([X0.numpy()]), eta=eta, eta_l=LOCAL_LR, beta_1=b1,
                     beta_2=b2, tau=tau)
    compare(loop, flower, lambda t: t)


def test_fedavg_server_momentum_matches_flower(tmp_path):
    eta, beta = 0.7, 0.9
    loop = our_loop("fedavg_server_momentum", [f"method.server_lr={eta}", f"method.server_momentum={beta}"], tmp_path)
    flower = FedAvgM(initial_parameters=ndarrays_to_parameters([X0.numpy()]), server_learning_rate=eta,
                     server_momentum=beta)
    compare(loop, flower, lambda t: t)


def test_bias_correction_step_size_is_not_the_default(tmp_path):
    """Reddi et al.'s Alg. 2 (our default) and Flower's bias-corrected FedAdam are different recursions."""
    a = our_loop("fedadam", ["method.server_v0=zero"], tmp_path / "a")
    b = our_loop("fedadam", ["method.server_v0=zero", "method.server_bias_correction=step_size"], tmp_path / "b")
    for r in range(2):
        a.run_round(r)
        b.run_round(r)
    assert not torch.allclose(a.global_params["net.w"], b.global_params["net.w"], rtol=1e-6, atol=0)
