"""A synthetic testbed for seed 003's heavy-tailed-noise result: a federated matrix quadratic with controlled noise.
Zhang & Gao ("On Provable Benefits of Muon in Federated Learning") prove convergence without clipping under
heavy-tailed noise (Sec. 5.2, Thm 5.5, Cor. 5.6) but run no synthetic experiment; this one is ours (docs/decisions.md,
seed 003, "synthetic heavy-tailed testbed").

Client k's objective is ``f_k(X) = ½‖A(X − X_k*)‖_F²`` over ``X ∈ R^{m×n}``, with a shared ``A ∈ R^{m×m}`` whose
``AᵀA`` has eigenvalues log-spaced in ``[L/kappa, L]`` (so L = λ_max(AᵀA)) and ``X_k* = X* + δ·E_k``, ``Σ_k E_k = 0``,
``‖E_k‖_F = 1``; the global objective ``f = (1/K)Σ_k f_k`` has ``∇f(X) = AᵀA(X − X*)`` and ``f − f* = ½‖A(X − X*)‖²``.
A stochastic gradient is ``∇f_k(X) + σ·Z``, Z with i.i.d. entries, standard Gaussian or Student-t with ``nu``
degrees of freedom scaled so that ``E|Z_ij| = √(2/π)`` (the Gaussian's; finite for every ν > 1, unlike the variance,
docs/decisions.md). Z is drawn fresh for every example of every batch from the client's seeded generator
(``FederatedData.client_batches``: seed, client, round), so runs are reproducible and resume exactly.

The train set has one example per client ``{"a": A, "target": X_k*, "group": k, "y": k}`` (``data/partition=natural``:
client k = group k); the test set one example ``{"a": A, "target": X*}`` from which the model computes ∇f and f − f*.
The problem (A, X*, E_k) is drawn from ``problem_seed``, independent of the run seed.
"""
from __future__ import annotations

import math
from typing import Annotated

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError
from ..config import NonNegative, OneOf, Positive, Range, Validate
from .info import DataInfo
from .tensors import TensorSet


def student_t_scale(nu: float) -> float:
    """The factor making a standard Student-t(ν) entry's mean absolute value √(2/π) (a standard Gaussian's):
    E|t_ν| = 2√ν Γ((ν+1)/2) / (√π (ν−1) Γ(ν/2)), for ν > 1."""
    log_mean_abs = (math.log(2.0) + 0.5 * math.log(nu) + math.lgamma((nu + 1) / 2)
                    - 0.5 * math.log(math.pi) - math.log(nu - 1) - math.lgamma(nu / 2))
    return math.sqrt(2.0 / math.pi) / math.exp(log_mean_abs)


class MatrixNoise:
    """Batch transform adding ``noise = σ·Z`` (one m×n draw per example) to a batch; ``draw`` gives the draws ahead
    (shape (1, batch, m, n)) from the client's generator. Student-t draws go through numpy's ``standard_t``, seeded
    from ``generator`` (torch has no seeded Student-t sampler)."""

    def __init__(self, shape: tuple[int, int], sigma: float, noise: str, nu: float | None):
        self.shape, self.sigma, self.noise, self.nu = tuple(shape), float(sigma), noise, nu

    def draw(self, n: int, generator: torch.Generator | None) -> Tensor:
        size = (1, n, *self.shape)
        if self.noise == "gaussian":
            z = torch.randn(size, generator=generator)
        else:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
            z = torch.from_numpy(np.random.default_rng(seed).standard_t(self.nu, size=size)).float()
            z.mul_(student_t_scale(self.nu))
        return z.mul_(self.sigma)

    def __call__(self, batch: dict, generator: torch.Generator | None, noise: Tensor | None = None) -> dict:
        if noise is None:
            noise = self.draw(len(batch["y"]), generator)
        return {**batch, "noise": noise[0].to(batch["target"].device)}


MAX_ENTRIES = 1 << 27  # m·n·K float64 numbers (1 GiB): bounds the offsets before they are drawn


def _check_size(m: int, n: int, num_clients: int) -> None:
    if m * n * max(num_clients, 2) > MAX_ENTRIES:  # the offsets E_k: (K, m, n) float64, and A
        raise ConfigError("m", f"{m}x{n} matrices for {num_clients} clients hold {m * n * num_clients:,} numbers (at "
                          f"most {MAX_ENTRIES:,})", "lower data.m / data.n or fl.num_clients")


def student_t_nu(noise, nu) -> bool:
    """Student-t noise needs its degrees of freedom nu (> 1 by its Range: E|Z| is infinite otherwise)."""
    return noise != "student_t" or nu is not None


Nu = Annotated[float, Range(1.0, open_low=True), Validate(student_t_nu, "must be > 1 for student_t noise (E|Z| is "
                                                          "infinite otherwise), got {nu}", "e.g. data.nu=1.5, 2 or 3")]


def _offsets(num_clients: int, m: int, n: int, g: torch.Generator) -> Tensor:
    """E_k = √(K/(K−1))·(q_k − q̄) for K random orthonormal q_k ∈ R^{m×n} (a regular simplex): Σ_k E_k = 0 and
    ‖E_k‖_F = 1 exactly; zero for K = 1."""
    if num_clients == 1:
        return torch.zeros(1, m, n, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(m * n, num_clients, generator=g, dtype=torch.float64))
    q = q.T
    return (math.sqrt(num_clients / (num_clients - 1)) * (q - q.mean(0))).reshape(num_clients, m, n)


def matrix_quadratic(num_clients: Annotated[int, Range(1, 1 << 20)], m: Annotated[int, Range(1, 1 << 12)] = 64,
                     n: Annotated[int, Range(1, 1 << 12)] = 32, L: Positive = 1.0,
                     kappa: Annotated[float, Range(1.0)] = 10.0, delta: NonNegative = 1.0, sigma: NonNegative = 1.0,
                     noise: Annotated[str, OneOf("gaussian", "student_t")] = "gaussian",
                     nu: Nu | None = None,
                     problem_seed: Annotated[int, Range(0, 2**32 - 1)] = 0) -> tuple[TensorSet, TensorSet, DataInfo]:
    """(train, test, info) of the quadratic testbed above; ``info.input_shape = (m, n)``, the shape of X."""
    k, m, n = int(num_clients), int(m), int(n)
    _check_size(m, n, k)
    g = torch.Generator().manual_seed(int(problem_seed))
    q, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    eig = float(L) / float(kappa) ** torch.linspace(1.0, 0.0, m, dtype=torch.float64)  # of AᵀA, in [L/kappa, L]
    a = eig.sqrt()[:, None] * q.T  # A = diag(√λ) Qᵀ: AᵀA = Q diag(λ) Qᵀ
    x_star = torch.randn(m, n, generator=g, dtype=torch.float64) / math.sqrt(n)
    targets = x_star + float(delta) * _offsets(k, m, n, g)
    ids = torch.arange(k)
    train = TensorSet({"a": a.float().expand(k, m, m).clone(), "target": targets.float(), "group": ids, "y": ids},
                      transform=MatrixNoise((m, n), sigma, noise, None if nu is None else float(nu)))
    test = TensorSet({"a": a.float()[None], "target": x_star.float()[None], "y": torch.zeros(1, dtype=torch.long)})
    return train, test, DataInfo(input_shape=(m, n), provenance={"problem_seed": problem_seed})
