"""Seed 003's matrix-quadratic testbed (spec 003 §6.2): data (fl_lightning/data/matrix_quadratic.py) and model
(fl_lightning/models/matrix_quadratic.py) against the closed forms, by hand in float64."""
from __future__ import annotations

from fl_lightning.config import StepBudget
import math

import numpy as np
import pytest
import torch

from fl_lightning.config.args import checked
from fl_lightning.data import build_federated_data
from fl_lightning.data.info import DataInfo
from fl_lightning.data.matrix_quadratic import MatrixNoise, matrix_quadratic, student_t_scale
from fl_lightning.errors import ConfigError
from fl_lightning.models.matrix_quadratic import MatrixQuadraticModule
from tests.helpers.cli import build_loop, make_cfg

K, M, N = 4, 6, 3
RUN = ["model=matrix_quadratic", "data=matrix_quadratic", f"fl.num_clients={K}", f"fl.clients_per_round={K}",
       f"data.m={M}", f"data.n={N}", "fl.local_steps=2", "trainer.progress=false"]


def problem(delta=0.7, **kw):
    train, test, info = matrix_quadratic(K, m=M, n=N, L=5.0, kappa=4.0, delta=delta, **kw)
    a = test.tensors["a"][0].double()
    return train, test, info, a, test.tensors["target"][0].double(), train.tensors["target"].double()


def test_problem_matches_the_spec():
    """AᵀA's spectrum is [L/kappa, L]; X_k* = X* + δE_k with Σ E_k = 0 and ‖E_k‖_F = 1."""
    _, _, info, a, x_star, targets = problem(delta=0.7)
    eig = torch.linalg.eigvalsh(a.T @ a)
    assert info.input_shape == (M, N)
    assert math.isclose(eig.max().item(), 5.0, rel_tol=1e-5) and math.isclose(eig.min().item(), 1.25, rel_tol=1e-5)
    e = (targets - x_star) / 0.7
    assert torch.allclose(e.sum(0), torch.zeros(M, N, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(e.flatten(1).norm(dim=1), torch.ones(K, dtype=torch.float64), atol=1e-6)


def test_batch_gradient_and_global_metrics_are_the_closed_forms():
    """∇(loss of a client's batch) = AᵀA(X − X_k*) + σZ; grad_norm = ‖(1/K)Σ_k ∇f_k(X)‖_F and excess_loss =
    (1/K)Σ_k f_k(X) − (1/K)Σ_k f_k(X*) (the minimiser of the mean is X*)."""
    data = build_federated_data(make_cfg(RUN + ["data.sigma=0.3"]).data, K, 0, torch.device("cpu"))
    module = MatrixQuadraticModule(data.info)
    with torch.no_grad():
        module.x.copy_(torch.randn(M, N, generator=torch.Generator().manual_seed(3)))
    x = module.x.detach().double()
    a = data.test.tensors["a"][0].double()
    targets = data.train.tensors["target"].double()
    for client in (0, 3):
        batch = next(data.client_batches(client, 5, "cpu", StepBudget(steps=1)))
        (grad,) = torch.autograd.grad(module.training_step(batch), module.x)
        k = int(batch["y"][0])
        assert k == client
        by_hand = a.T @ a @ (x - targets[k]) + batch["noise"][0].double()
        assert torch.allclose(grad.double(), by_hand, atol=1e-4)
    for batch in data.test_batches("cpu"):
        module.validation_step(batch)
    out = module.compute_eval()
    mean_grad = torch.stack([a.T @ a @ (x - t) for t in targets]).mean(0)
    f = [0.5 * (a @ (z - targets)).square().sum(dim=(1, 2)).mean() for z in (x, data.test.tensors["target"][0].double())]
    assert math.isclose(out["grad_norm"], mean_grad.norm().item(), rel_tol=1e-6)
    assert math.isclose(out["excess_loss"], (f[0] - f[1]).item(), rel_tol=1e-5)


def test_noise_is_a_function_of_seed_client_round():
    """The noise of (seed, client, round) is the same in a rebuilt dataset (what exact resume needs), and differs
    between rounds and clients."""
    def noise(client, rnd):
        data = build_federated_data(make_cfg(RUN).data, K, 7, torch.device("cpu"))
        return torch.cat([b["noise"] for b in data.client_batches(client, rnd, "cpu", StepBudget(steps=2))])

    assert torch.equal(noise(1, 2), noise(1, 2))
    assert not torch.allclose(noise(1, 2), noise(1, 3)) and not torch.allclose(noise(1, 2), noise(2, 2))


def test_student_t_scale_and_tails():
    """Student-t entries are scaled to the Gaussian's E|Z| = √(2/π) (ν = 3: finite variance, checked by sampling);
    ν = 1.5 has far heavier tails than Gaussian noise (max |Z| and sample kurtosis over 20k entries)."""
    g = torch.Generator().manual_seed(0)
    gauss = MatrixNoise((100, 200), 1.0, "gaussian", None).draw(1, g).double().flatten()
    t3 = MatrixNoise((100, 200), 1.0, "student_t", 3.0).draw(1, g).double().flatten()
    t15 = MatrixNoise((100, 200), 1.0, "student_t", 1.5).draw(1, g).double().flatten()
    assert math.isclose(student_t_scale(3.0), math.sqrt(2 / math.pi) / (2 * math.sqrt(3) / (math.pi * 1.0)), rel_tol=1e-12)
    assert abs(t3.abs().mean().item() - math.sqrt(2 / math.pi)) < 0.02
    assert abs(gauss.abs().mean().item() - math.sqrt(2 / math.pi)) < 0.02

    def kurtosis(z):
        c = z - z.mean()
        return (c.pow(4).mean() / c.pow(2).mean().square()).item()

    assert kurtosis(gauss) < 3.5 and kurtosis(t15) > 30
    assert t15.abs().max() > 10 * gauss.abs().max()


@pytest.mark.parametrize("kw, key", [({"noise": "cauchy"}, "noise"), ({"noise": "student_t", "nu": 1.0}, "nu"),
                                     ({"noise": "student_t"}, "nu"), ({"kappa": 0.5}, "kappa"),
                                     ({"sigma": -1.0}, "sigma"), ({"L": 0.0}, "L"),
                                     ({"problem_seed": -1}, "problem_seed")])
def test_bad_settings_name_the_key(kw, key):
    """The ranges are the builder's annotations (checked with the config; ``checked`` in Python)."""
    with pytest.raises(ConfigError) as err:
        checked(matrix_quadratic, K, **kw)
    assert err.value.key == key


def test_model_needs_a_matrix_problem():
    with pytest.raises(ConfigError):
        MatrixQuadraticModule(DataInfo(input_shape=(1, 8, 8), num_classes=10))


def test_fedmuon_lowers_the_gradient_norm(tmp_path):
    """End to end through the config: FedMuon on Student-t(1.5) noise lowers G = ‖∇f‖_F of the global model."""
    loop = build_loop(RUN + ["method=fedmuon_avg", "data.noise=student_t", "data.nu=1.5", "fl.rounds=8", "method.lr=0.05"], tmp_path)
    loop.run(progress_enabled=False)
    rows = loop.recorder.rows
    assert np.isfinite(rows[-1]["grad_norm"]) and rows[-1]["grad_norm"] < 0.8 * rows[0]["grad_norm"]


def test_resume_is_exact(tmp_path):
    """4 rounds of FedMuon on Student-t(2) noise in one go = 2 rounds, then resumed for 2 more: the same X."""
    run = RUN + ["method=fedmuon_avg", "data.noise=student_t", "data.nu=2", "fl.rounds=4"]
    full = build_loop(run, tmp_path / "full")
    full.run(progress_enabled=False)
    half = build_loop(run, tmp_path / "half")
    half.run(stop_after_rounds=2, progress_enabled=False)
    rest = build_loop(run, tmp_path / "rest", resume=str(tmp_path / "half"))
    rest.run(progress_enabled=False)
    assert torch.equal(full.module.x, rest.module.x) and not torch.equal(half.module.x, rest.module.x)
