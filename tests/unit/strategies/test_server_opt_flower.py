"""Our server optimizers against Flower's strategy implementations on the same inputs (issue 15): the two-client
quadratic of test_server_opt.py through the real loop; every round the clients' models (K steps of plain SGD from
the current global model, written out) go to Flower's ``aggregate_fit`` and both global models must agree.

Weighting: Flower's strategies average the clients' models weighted by ``num_examples``; the comparison runs ours
with ``method.parts.aggregation.weighting=num_samples`` (FakeData's sample counts are Flower's num_examples, 10 and
11). FedAdam and FedYogi default to the uniform mean of Reddi et al.'s Alg. 2, which Flower does not compute.

* ``fedadam`` with ``server_v0=zero`` and ``server_bias_correction=step_size`` is ``flwr.server.strategy.FedAdam``
  (m, v start at 0; lr_t = eta sqrt(1 - beta2^t) / (1 - beta1^t), tau uncorrected). Flower's exponent is its
  ``server_round + 1`` with rounds counted from 1, one round ahead of Kingma & Ba's t; we hand it ``t - 1``.
* ``fedyogi`` with ``server_v0=zero`` is ``FedYogi`` (no bias correction, v from 0).
* ``fedavg_server_momentum`` (Hsu et al. 2019) is ``FedAvgM(server_momentum=beta)``.

FedAMS has no Flower strategy. Flower's global models are recorded in tests/fixtures/flower_server_opt.json, which
the comparison always runs against: ``flwr`` cannot be a dev dependency (flwr 1.42 needs SQLAlchemy >= 2, the dev
extra's Optuna sweeper SQLAlchemy < 2, and it would move protobuf, rich, packaging and cryptography). Where flwr is
installed, the live test checks the recording against Flower itself; ``python tools/record_flower.py`` re-records
it (in a throwaway venv: ``python -m venv --system-site-packages /tmp/flwr && /tmp/flwr/bin/pip install flwr``).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from tests.helpers.harness import FakeData, LossModule, build, make_loop, method_config

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "flower_server_opt.json")
D, K, LOCAL_LR, ROUNDS = 4, 3, 0.1, 8
A = torch.tensor([[1.0, 0.5, 2.0, 0.2], [0.3, 1.5, 1.0, 2.5]], dtype=torch.float64)
C = torch.tensor([[1.0, -2.0, 0.5, 3.0], [-1.0, 1.0, 2.0, -0.5]], dtype=torch.float64)
X0 = torch.tensor([0.3, -0.4, 0.1, 0.2], dtype=torch.float64)
WEIGHTS = [10, 11]  # FakeData.num_samples = Flower's num_examples (both weight the mean by them)
WEIGHTING = "method.parts.aggregation.weighting=num_samples"  # Flower's: every strategy weights by num_examples
ETA, B1, B2, TAU = 0.05, 0.9, 0.99, 1e-3

# name: our method and overrides; Flower's strategy, its arguments, and the server_round it is handed for our round t
CASES = {
    "fedadam": dict(
        method="fedadam", ours=[f"method.server_lr={ETA}", f"method.server_tau={TAU}", "method.server_v0=zero",
                                "method.server_bias_correction=step_size", WEIGHTING],
        strategy="FedAdam", kwargs=dict(eta=ETA, eta_l=LOCAL_LR, beta_1=B1, beta_2=B2, tau=TAU),
        round_offset=-1),  # Flower's exponent is server_round + 1
    "fedyogi": dict(
        method="fedyogi", ours=[f"method.server_lr={ETA}", f"method.server_tau={TAU}", "method.server_v0=zero",
                                WEIGHTING],
        strategy="FedYogi", kwargs=dict(eta=ETA, eta_l=LOCAL_LR, beta_1=B1, beta_2=B2, tau=TAU), round_offset=0),
    "fedavg_server_momentum": dict(
        method="fedavg_server_momentum", ours=["method.server_lr=0.7", "method.server_momentum=0.9", WEIGHTING],
        strategy="FedAvgM", kwargs=dict(server_learning_rate=0.7, server_momentum=0.9), round_offset=0),
}


def problem() -> dict:
    """The inputs both sides see; the recording holds them, so a changed constant asks for a re-recording."""
    return {"A": A.tolist(), "C": C.tolist(), "X0": X0.tolist(), "K": K, "local_lr": LOCAL_LR, "rounds": ROUNDS,
            "num_examples": WEIGHTS}


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


def flower_trajectory(name: str) -> list[list[float]]:
    """Flower's global model after each of ROUNDS rounds of ``aggregate_fit`` (needs flwr)."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import strategy as strategies

    case = CASES[name]
    flower = getattr(strategies, case["strategy"])(initial_parameters=ndarrays_to_parameters([X0.numpy()]),
                                                   **case["kwargs"])
    ok = Status(code=Code.OK, message="")
    x, out = X0.numpy().copy(), []
    for t in range(1, ROUNDS + 1):
        results = [(None, FitRes(status=ok, parameters=ndarrays_to_parameters([local_sgd(x, i)]),
                                 num_examples=WEIGHTS[i], metrics={})) for i in range(2)]
        params, _ = flower.aggregate_fit(t + case["round_offset"], results, [])
        x = parameters_to_ndarrays(params)[0]
        out.append(x.tolist())
    return out


def recorded() -> dict:
    with open(FIXTURE) as f:
        rec = json.load(f)
    assert rec["problem"] == problem(), "the problem changed: re-record with python tools/record_flower.py"
    return rec


def assert_matches(ours: np.ndarray, flower, t) -> None:
    np.testing.assert_allclose(ours, np.asarray(flower), rtol=1e-12, atol=1e-13, err_msg=f"round {t}")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_flowers_recorded_trajectory(tmp_path, name):
    case, rec = CASES[name], recorded()["cases"][name]
    assert (rec["strategy"], rec["kwargs"], rec["round_offset"]) == \
        (case["strategy"], case["kwargs"], case["round_offset"]), "re-record with python tools/record_flower.py"
    loop = our_loop(case["method"], case["ours"], tmp_path)
    for r in range(ROUNDS):
        loop.run_round(r)
        assert_matches(loop.global_params["net.w"].numpy(), rec["trajectory"][r], r + 1)
    assert np.abs(loop.global_params["net.w"].numpy() - X0.numpy()).max() > 1e-2  # it moved


def test_the_recording_is_flowers_own_output():
    """Live: Flower now gives the recorded trajectories (so ours, checked against them above, match Flower's)."""
    pytest.importorskip("flwr", reason="flwr (Flower) is not installed: it conflicts with the dev extra (SQLAlchemy "
                                       "< 2); the recorded trajectories are checked instead")
    rec = recorded()["cases"]
    for name in CASES:
        for t, (now, then) in enumerate(zip(flower_trajectory(name), rec[name]["trajectory"], strict=True), 1):
            assert_matches(np.asarray(now), then, f"{name} {t}")


def test_the_default_uniform_weighting_is_not_flowers(tmp_path):
    """FedAdam's default (Reddi et al.'s uniform mean) differs from Flower's num_examples-weighted mean at round 1."""
    ours = [o for o in CASES["fedadam"]["ours"] if o != WEIGHTING]
    loop = our_loop("fedadam", ours, tmp_path)
    loop.run_round(0)
    flower = np.asarray(recorded()["cases"]["fedadam"]["trajectory"][0])
    assert np.abs(loop.global_params["net.w"].numpy() - flower).max() > 1e-6


def test_bias_correction_step_size_is_not_the_default(tmp_path):
    """Reddi et al.'s Alg. 2 (our default) and Flower's bias-corrected FedAdam are different recursions."""
    a = our_loop("fedadam", ["method.server_v0=zero"], tmp_path / "a")
    b = our_loop("fedadam", ["method.server_v0=zero", "method.server_bias_correction=step_size"], tmp_path / "b")
    for r in range(2):
        a.run_round(r)
        b.run_round(r)
    assert not torch.allclose(a.global_params["net.w"], b.global_params["net.w"], rtol=1e-6, atol=0)
