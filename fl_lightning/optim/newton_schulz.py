"""Newton–Schulz orthogonalization and the spectral-norm LMO.

For a matrix G = U Σ Vᵀ (thin SVD) the spectral-norm LMO is (seed 000 = FedMuon, anonymous, under review, Sec. 6;
Bernstein & Newhouse 2024)

    lmo(G) = argmin_{||Y||_sp ≤ 1} <G, Y> = -U Vᵀ,     <G, lmo(G)> = -||G||_trace.

``orthogonalize`` returns the POSITIVE polar-factor approximation G^(T) ≈ U Vᵀ (what every Muon update
subtracts); ``lmo_spectral`` is its negative. The approximation is Algorithm 2 of seed 000:

    G^(0)   = G / ||G||_F                                                  (Frobenius normalization)
    G^(t+1) = a G^(t) + b (G^(t) G^(t)ᵀ) G^(t) + c (G^(t) G^(t)ᵀ)² G^(t),   t = 0..T-1

which acts on every singular value x ∈ [0, 1] of G^(0) through φ(x) = a x + b x³ + c x⁵ and leaves U, V alone.

* ``"polar_express"`` (15/8, -5/4, 3/8): the theory coefficients of seed 000 (Thm 3 / Lemma 12, after Amsel et
  al. 2025). φ(1) = 1, φ(x) ≥ x and 1 - φ(x) ≤ (1-x)^1.5 on [0, 1], so outputs stay in [0, 1]: ||G^(T)||_sp ≤ 1
  for every T ≥ 0, and <G, G^(T)> ≥ ||G||_p with p(κ, T) = 1 + log(1-(1-κ)^{1.5^T}) / log κ  (Lemma 12).
* ``"muon"`` (3.4445, -4.7750, 2.0315): Keller Jordan's quintic (Jordan et al. 2024), tuned for a steep slope at
  0; after 5 steps singular values land roughly in [0.7, 1.2] (it overshoots 1, so Lemma 12 does not apply).

T = 0 is plain Frobenius normalization G/||G||_F (normalized SGD), which the seed-000 theory covers too.
Only G Gᵀ of the wide orientation is formed (rows ≤ cols; we transpose tall inputs, which is exact because
(G Gᵀ)^j G = G (Gᵀ G)^j). Leading dims are a batch: a 3-D tensor is a stack of matrices, each normalized on
its own (Keller Jordan's convention). Conv kernels (out, in, kh, kw), and any ≥4-D tensor, are viewed as the
matrix (out, in·kh·kw) (seed 000 Sec. 2) and reshaped back.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["NS_COEFFS", "resolve_coeffs", "as_matrix", "matrix_shape", "orthogonalize", "lmo_spectral", "ns_polynomial"]

NS_COEFFS: dict[str, tuple[float, float, float]] = {
    "muon": (3.4445, -4.7750, 2.0315),  # Keller Jordan's quintic (torch.optim.Muon's default)
    "polar_express": (15 / 8, -5 / 4, 3 / 8),  # seed 000 theory coefficients (Lemma 12)
}


def resolve_coeffs(coeffs: str | tuple[float, float, float] | list) -> tuple[float, float, float]:
    """Return (a, b, c) for a name in :data:`NS_COEFFS` or an explicit triple."""
    if isinstance(coeffs, str):
        if coeffs not in NS_COEFFS:
            raise ValueError(f"unknown Newton-Schulz coefficients {coeffs!r}; use {sorted(NS_COEFFS)} or (a, b, c)")
        return NS_COEFFS[coeffs]
    if len(coeffs) != 3:
        raise ValueError(f"Newton-Schulz coefficients must be 3 numbers (a, b, c), got {coeffs!r}")
    return tuple(float(x) for x in coeffs)  # type: ignore[return-value]


def ns_polynomial(x: Tensor | float, coeffs="polar_express") -> Tensor | float:
    """φ(x) = a x + b x³ + c x⁵: what one NS step does to each singular value of the normalized matrix."""
    a, b, c = resolve_coeffs(coeffs)
    return a * x + b * x**3 + c * x**5


def as_matrix(t: Tensor) -> Tensor:
    """The matrix view used for orthogonalization: ≥4-D (conv) tensors → (out, in·kh·kw); 2-D/3-D unchanged."""
    if t.ndim < 2:
        raise ValueError(f"orthogonalization needs a tensor with ndim >= 2, got shape {tuple(t.shape)}")
    return t.reshape(t.shape[0], -1) if t.ndim >= 4 else t


def matrix_shape(t: Tensor | torch.Size) -> tuple[int, int]:
    """(rows, cols) of :func:`as_matrix`'s view: conv → (out, in·kh·kw); 3-D batch → its last two dims."""
    shape = tuple(t.shape if isinstance(t, Tensor) else t)
    if len(shape) >= 4:
        return shape[0], math.prod(shape[1:])
    return shape[-2], shape[-1]


def _dtype(d, like: Tensor) -> torch.dtype:
    if d is None:  # fp32 by default; keep fp64 inputs in fp64 (theory checks)
        return torch.float64 if like.dtype == torch.float64 else torch.float32
    if d == "auto":  # bf16 where it is native (CUDA, a CPU with AVX512-BF16/AMX), else fp32: fl_lightning/precision.py
        from ..precision import native_bf16

        return torch.bfloat16 if native_bf16(like.device.type) else _dtype(None, like)
    return getattr(torch, d) if isinstance(d, str) else d


@torch.no_grad()
def orthogonalize(
    G: Tensor,
    steps: int = 5,
    coeffs: str | tuple[float, float, float] = "muon",
    method: str = "ns",
    eps: float = 1e-7,
    dtype: torch.dtype | str | None = None,
) -> Tensor:
    """Approximate polar factor U Vᵀ of G (seed 000 Alg. 2 without the final minus; seeds 003/004 ``Orth``).

    G: a matrix, a batch of matrices (leading dims) or a conv kernel (viewed as (out, in·kh·kw)).
    steps: T ≥ 0 Newton–Schulz iterations (T = 0 → G/||G||_F). coeffs: name in NS_COEFFS or (a, b, c).
    method: "ns" (Algorithm 2) or "svd" (exact U Vᵀ over the numerically nonzero singular values).
    eps: the Frobenius norm is clamped below at eps (as in torch.optim.Muon), so a zero input maps to zero.
    dtype: compute dtype; None = fp32 (fp64 stays fp64); torch.bfloat16 mimics public GPU Muon code; "auto" = bf16
    where it is native (CUDA, AVX512-BF16/AMX CPUs), else as None (a run resolves it once: fl_lightning/precision.py).
    Returns a tensor with G's shape and dtype.
    """
    if steps < 0:
        raise ValueError(f"Newton-Schulz steps must be >= 0, got {steps}")
    X = as_matrix(G).to(_dtype(dtype, G))
    if method == "svd":
        # Exact polar factor restricted to the rank-r part: U[:, :r] Vh[:r] (zero for the zero matrix).
        if X.dtype in (torch.float16, torch.bfloat16):
            X = X.float()  # linalg.svd has no half-precision kernels
        U, S, Vh = torch.linalg.svd(X, full_matrices=False)
        tol = S.amax(-1, keepdim=True) * max(X.shape[-2:]) * torch.finfo(S.dtype).eps
        X = (U * (S > tol).to(U.dtype).unsqueeze(-2)) @ Vh
        return X.reshape(G.shape).to(G.dtype)
    if method != "ns":
        raise ValueError(f"orthogonalization method must be 'ns' or 'svd', got {method!r}")
    a, b, c = resolve_coeffs(coeffs)
    tall = X.size(-2) > X.size(-1)
    if tall:  # iterate on the wide orientation: the Gram matrix X Xᵀ is then the small one
        X = X.mT
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp_min(eps)  # G^(0): spectral norm ≤ Frobenius norm = 1
    mm = torch.addmm if X.ndim == 2 else torch.baddbmm  # fused beta·C + alpha·A@B (as_matrix gives ndim 2 or 3);
    # the same op order as torch.optim.Muon, so in bf16 both agree bit for bit
    for _ in range(steps):
        A = X @ X.mT
        B = mm(A, A, A, beta=b, alpha=c)  # b A + c A²
        X = mm(X, B, X, beta=a)  # a X + B X = a X + b (X Xᵀ) X + c (X Xᵀ)² X
    if tall:
        X = X.mT
    return X.reshape(G.shape).to(G.dtype)


def lmo_spectral(G: Tensor, steps: int = 5, coeffs="muon", method: str = "ns", eps: float = 1e-7, dtype=None) -> Tensor:
    """Approximate spectral-norm LMO argmin_{||Y||_sp ≤ 1} <G, Y> ≈ -U Vᵀ (seed 000 Sec. 6: Alg. 2 returns -G^(T))."""
    return -orthogonalize(G, steps=steps, coeffs=coeffs, method=method, eps=eps, dtype=dtype)
