"""Seed 002's ablations and comparison methods (issue 14) through the real FederatedLoop and their conf/method yamls,
each against its defining update written out by hand on a diagonal quadratic in float64 (client i:
f_i(w) = ½ Σ_j a_ij (w_j − c_ij)², ∇f_i(w) = a_i ⊙ (w − c_i) on every minibatch), 3 clients, 2 sampled per round
(rounds 1-2: clients {0, 2}, rounds 3-4: {1, 2}, so client 1 idles before it trains and client 0 after), K = 3 local
steps; and the exact bits per direction of every round against spec 002 §4's table (d = 4 coordinates, one tensor;
the tensors are float64 here, so a dense value is 64 bits where the table's fp32 says 32):

* ``fedsmum`` (Alg. 7): idle clients' momentum completion, and the model charged to all 3 clients;
* ``fedsmumc`` (Alg. 8): the server-held M, u and m_i up;
* ``fedlion`` (Tang & Chang, Alg. 4): local Lion from the mean momentum, integer Δ at ⌈log₂(2K+1)⌉ bits + fp32 m;
* ``fed_globallion`` / ``fed_locallion`` (Algs. 5, 6): Lion at the server on the mean delta / at each client;
* ``fedef_topk``, ``fedef_sign``, ``fedef_hs`` (Alg. 3): error feedback with three different compressors;
* ``ef21`` (EF21-PP), ``fedcams`` (server AMSGrad on EF-compressed deltas), ``dlion`` (the sign step as downlink),
  ``scallion`` (SCAFFOLD with one compressed increment; identity RandK for the trajectory).
"""
from __future__ import annotations

import math

import pytest
import torch

from fl_lightning import seeding
from tests.helpers.harness import FakeData, LossModule, build, make_loop, method_config, QuadVec, quad_loss

D, K, R, N, S = 4, 3, 4, 3, 2
A = torch.tensor([[1.0, 0.5, 2.0, 0.2], [0.3, 1.5, 1.0, 2.5], [0.8, 0.6, 0.4, 1.2]], dtype=torch.float64)
C = torch.tensor([[1.0, -2.0, 0.5, 3.0], [-1.0, 1.0, 2.0, -0.5], [0.5, 0.5, -1.5, 1.0]], dtype=torch.float64)
X0 = torch.tensor([0.3, -0.4, 0.1, 0.2], dtype=torch.float64)
W = "net.w"
LOG2D = 2  # ceil(log2 d) index bits
VAL = 64  # bits of one float64 value


def grad(w, i):
    return A[i] * (w - C[i])


def sgd(x, i, lr, corr=0.0):
    w = x.clone()
    for _ in range(K):
        w = w - lr * (grad(w, i) + corr)
    return w


def sampled(r):
    return seeding.sample_clients(0, r, N, S)


def make(method, overrides, tmp_path):
    cfg = method_config(method, list(overrides))
    data = FakeData(lambda c, r, k: {"a": A[c][None].clone(), "c": C[c][None].clone()}, N)
    loop = make_loop(build(cfg), LossModule(QuadVec(X0), quad_loss), data, tmp_path, num_clients=N, per_round=S,
                     rounds=R, local_steps=K)
    loop.setup()
    return loop


def follow(loop, xs, bits=None, check=None):
    """Round by round: x (and ``check(r)``) against the reference; ``bits(r) -> (up, down)`` against the loop's."""
    assert sampled(0) == [0, 2] and sampled(2) == [1, 2]
    for r in range(R):
        row = loop.run_round(r)
        torch.testing.assert_close(loop.global_params[W], xs[r], rtol=1e-12, atol=1e-12, msg=f"round {r + 1}")
        if bits is not None:
            assert (row["round_uplink_bits"], row["round_downlink_bits"]) == bits(r), f"bits, round {r + 1}"
        if check is not None:
            check(r)


def dense():
    return VAL * D


# ------------------------------------------------------------------------------------------------ FedSMUM, FedSMUMC
@pytest.mark.parametrize("scale", ["gamma1", "one"])
def test_fedsmum_completes_idle_momentum_alg7(tmp_path, scale):
    lr, b1, b2, g1, g2 = 0.1, 0.9, 0.99, 0.05, 0.2
    s = g1 if scale == "gamma1" else 1.0
    x, m, y, xs, ms = X0.clone(), [torch.zeros(D, dtype=torch.float64)] * N, [None] * N, [], []
    for r in range(R):
        us = []
        for i in range(N):
            if i in sampled(r):
                yk = sgd(x, i, lr)
                g = yk - x
                us.append(torch.sign(b1 * m[i] + (1 - b1) * g))
                m[i], y[i] = b2 * m[i] + (1 - b2) * g, yk
            else:  # Alg. 7 lines 16-18
                g = x - (1 - g1 * g2) * (x if y[i] is None else y[i])
                m[i], y[i] = b2 * m[i] + (1 - b2) * s * g, x
        x = x + g1 * (sum(us) / S - g2 * x)
        xs.append(x)
        ms.append(list(m))
    loop = make("fedsmum", [f"method.lr={lr}", f"method.beta2={b2}", f"method.gamma1={g1}", f"method.gamma2={g2}",
                            f"method.completion_scale={scale}"], tmp_path)

    def momenta(r):
        for i in range(N):
            torch.testing.assert_close(loop.store.get(i)[f"aggregation/{W}/lion_m"], ms[r][i], rtol=1e-12, atol=1e-14)

    follow(loop, xs, bits=lambda r: (S * D, N * dense()), check=momenta)


def test_fedsmumc_server_momentum_alg8(tmp_path):
    lr, b1, b2, g1, g2 = 0.1, 0.9, 0.9, 0.05, 0.01
    x, M, xs, Ms = X0.clone(), torch.zeros(D, dtype=torch.float64), [], []
    for r in range(R):
        us, mi = [], []
        for i in sampled(r):
            g = sgd(x, i, lr) - x
            us.append(torch.sign(b1 * M + (1 - b1) * g))
            mi.append(b2 * M + (1 - b2) * g)
        M = sum(mi) / S
        x = x + g1 * (sum(us) / S - g2 * x)
        xs.append(x)
        Ms.append(M)
    loop = make("fedsmumc", [f"method.lr={lr}", f"method.gamma1={g1}", f"method.gamma2={g2}"], tmp_path)
    follow(loop, xs, bits=lambda r: (S * (D + dense()), S * 2 * dense()),
           check=lambda r: torch.testing.assert_close(loop.strategy.state_dict()[f"momentum/{W}"], Ms[r]))
    assert not any("lion_m" in k for i in range(N) for k in loop.store.get(i))  # clients keep nothing


# -------------------------------------------------------------------------------- FedLion, Fed-Global/LocalLion
def test_fedlion_alg4(tmp_path):
    lr, b1, b2 = 0.05, 0.9, 0.99
    x, M, xs, Ms = X0.clone(), torch.zeros(D, dtype=torch.float64), [], []
    for r in range(R):
        deltas, mi = [], []
        for i in sampled(r):
            y, m = x.clone(), M.clone()
            for _ in range(K):  # Alg. 4 lines 7-10
                g = grad(y, i)
                u = torch.sign(b1 * m + (1 - b1) * g)
                m = b2 * m + (1 - b2) * g
                y = y - lr * u
            deltas.append(torch.round((y - x) / lr))  # integer-valued in [-K, K]
            mi.append(m)
        M, x = sum(mi) / S, x + lr * sum(deltas) / S
        xs.append(x)
        Ms.append(M)
    loop = make("fedlion", [f"method.lr={lr}"], tmp_path)
    follow(loop, xs, bits=lambda r: (S * (math.ceil(math.log2(2 * K + 1)) * D + dense()),
                                     S * dense() * (1 if r == 0 else 2)),
           check=lambda r: torch.testing.assert_close(loop.strategy.state_dict()[f"momentum/M/{W}/exp_avg"], Ms[r]))


def test_fed_globallion_alg5(tmp_path):
    lr, b1, b2, g1, g2 = 0.1, 0.9, 0.99, 0.05, 0.1
    x, M, xs = X0.clone(), torch.zeros(D, dtype=torch.float64), []
    for r in range(R):
        G = sum(sgd(x, i, lr) - x for i in sampled(r)) / S
        U = torch.sign(b1 * M + (1 - b1) * G)
        M = b2 * M + (1 - b2) * G
        x = x + g1 * (U - g2 * x)
        xs.append(x)
    loop = make("fed_globallion", [f"method.lr={lr}", f"method.gamma1={g1}", f"method.gamma2={g2}"], tmp_path)
    follow(loop, xs, bits=lambda r: (S * dense(), S * dense()))


def test_fed_locallion_alg6(tmp_path):
    lr, b1, b2, g1, g2, eta_g = 0.1, 0.9, 0.99, 0.05, 0.1, 0.7
    x, m, xs = X0.clone(), [torch.zeros(D, dtype=torch.float64)] * N, []
    for r in range(R):
        deltas = []
        for i in sampled(r):
            yk = sgd(x, i, lr)
            g = yk - x
            u = torch.sign(b1 * m[i] + (1 - b1) * g)
            m[i] = b2 * m[i] + (1 - b2) * g
            deltas.append(yk + g1 * (u - g2 * yk) - x)  # Alg. 6 lines 13-14
        x = x + eta_g * sum(deltas) / S
        xs.append(x)
    loop = make("fed_locallion", [f"method.lr={lr}", f"method.gamma1={g1}", f"method.gamma2={g2}",
                                  f"method.server_lr={eta_g}"], tmp_path)
    follow(loop, xs, bits=lambda r: (S * dense(), S * dense()))


# ----------------------------------------------------------------------------------------------------- FedEF-*
def topk1(z):
    out = torch.zeros_like(z)
    j = int(z.abs().argmax())
    out[j] = z[j]
    return out


def scaled_sign(z):
    return z.abs().mean() * torch.sign(z)


def heavy_sign(z):  # the top-1 coordinate exactly, the mean |.| of the other 3 times their signs
    j = int(z.abs().argmax())
    rest = torch.cat([z[:j], z[j + 1:]])
    out = rest.abs().mean() * torch.sign(z)
    out[j] = z[j]
    return out


@pytest.mark.parametrize("method,comp,up_bits", [
    ("fedef_topk", topk1, VAL + LOG2D),
    ("fedef_sign", scaled_sign, D + VAL),               # d sign bits + the scale at the tensor width (fp64)
    ("fedef_hs", heavy_sign, (VAL + LOG2D) + (D - 1) + VAL),
])
def test_fedef_alg3(tmp_path, method, comp, up_bits):
    lr, eta_g = 0.1, 0.8
    x, e, xs = X0.clone(), [torch.zeros(D, dtype=torch.float64)] * N, []
    for r in range(R):
        sent = []
        for i in sampled(r):
            z = sgd(x, i, lr) - x + e[i]
            sent.append(comp(z))
            e[i] = z - sent[-1]  # Alg. 3 line 12, read e_i <- e_i + g_i - Delta_i
        x = x + eta_g * sum(sent) / S
        xs.append(x)
    loop = make(method, [f"method.lr={lr}", f"method.server_lr={eta_g}"], tmp_path)
    follow(loop, xs, bits=lambda r: (S * up_bits, S * dense()))


# ------------------------------------------------------------------------------------------- EF21, FedCAMS
@pytest.mark.parametrize("partial", ["all", "sampled"])
def test_ef21_pp(tmp_path, partial):
    lr, gamma = 0.1, 0.9
    x, gi, g, xs = X0.clone(), [torch.zeros(D, dtype=torch.float64)] * N, torch.zeros(D, dtype=torch.float64), []
    for r in range(R):
        cs = []
        for i in sampled(r):
            c = topk1(x - sgd(x, i, lr) - gi[i])
            gi[i] = gi[i] + c
            cs.append(c)
        g = g + sum(cs) / (N if partial == "all" else S)
        x = x - gamma * g
        xs.append(x)
    loop = make("ef21", [f"method.lr={lr}", f"method.server_lr={gamma}", f"method.partial={partial}"], tmp_path)
    follow(loop, xs, bits=lambda r: (S * (VAL + LOG2D), S * dense()))


def test_fedcams_amsgrad_on_error_feedback_signs(tmp_path):
    lr, s_lr, b1, b2, tau = 0.1, 0.05, 0.9, 0.99, 1e-6
    x, e, xs = X0.clone(), [torch.zeros(D, dtype=torch.float64)] * N, []
    m, v, vh = (torch.zeros(D, dtype=torch.float64) for _ in range(3))
    for r in range(R):
        sent = []
        for i in sampled(r):
            z = sgd(x, i, lr) - x + e[i]
            sent.append(scaled_sign(z))
            e[i] = z - sent[-1]
        g = -sum(sent) / S
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        vh = torch.maximum(torch.maximum(vh, v), torch.full_like(v, tau))  # FedAMS: max(v_hat, v, eps)
        x = x - s_lr * m / vh.sqrt()
        xs.append(x)
    loop = make("fedcams", [f"method.lr={lr}", f"method.server_lr={s_lr}"], tmp_path)
    follow(loop, xs, bits=lambda r: (S * (D + VAL), S * dense()))


# ------------------------------------------------------------------------------------------- D-Lion, SCALLION
@pytest.mark.parametrize("rule", ["mean", "majority_vote"])
def test_dlion_worker_step_and_sign_downlink(tmp_path, rule):
    """D-Lion in its own (gradient) convention: delta_i = sign(b1 m_i + (1 - b1) h_i) of the pseudo-gradient
    h_i = x - y_K, Delta = mean or sign of the sum, every worker x <- x - eps (Delta + lambda x); downlink: x_0 to all
    3 workers once, then Delta at ceil(log2(S + 1)) bits (mean) or 1 bit (vote) per coordinate, to all."""
    lr, b1, b2, eps, lam = 0.1, 0.9, 0.9, 0.05, 0.1
    x, m, xs = X0.clone(), [torch.zeros(D, dtype=torch.float64)] * N, []
    for r in range(R):
        deltas = []
        for i in sampled(r):
            h = x - sgd(x, i, lr)
            deltas.append(torch.sign(b1 * m[i] + (1 - b1) * h))
            m[i] = b2 * m[i] + (1 - b2) * h
        Delta = sum(deltas) / S if rule == "mean" else torch.sign(sum(deltas))
        x = x - eps * (Delta + lam * x)
        xs.append(x)
    loop = make("dlion", [f"method.lr={lr}", f"method.gamma1={eps}", f"method.gamma2={lam}", f"method.rule={rule}"],
                tmp_path)
    per = 1 if rule == "majority_vote" else math.ceil(math.log2(S + 1))
    follow(loop, xs, bits=lambda r: (S * D, N * (dense() if r == 0 else per * D)))


def test_scallion_with_the_identity_compressor(tmp_path):
    """RandK with frac = 1 keeps every coordinate (scale d/k = 1), so the trajectory is SCALLION's equations exactly;
    alpha = 0.5 (not the default 1/(1 + omega)) keeps c_i from being plain SCAFFOLD's."""
    lr, eta_g, alpha = 0.1, 0.9, 0.5
    x, c, ci, xs = X0.clone(), torch.zeros(D, dtype=torch.float64), [torch.zeros(D, dtype=torch.float64)] * N, []
    for r in range(R):
        ds = []
        for i in sampled(r):
            y = sgd(x, i, lr, corr=c - ci[i])
            ds.append((x - y) / (K * lr) - c)  # the increment SCAFFOLD uploads: ḡ_i − c_i (spec 002 §3.12, corrected)
            ci[i] = ci[i] + alpha * ds[-1]
        x = x - eta_g * K * lr * (c + sum(ds) / S)
        c = c + alpha * sum(ds) / N
        xs.append(x)
    loop = make("scallion", [f"method.lr={lr}", f"method.server_lr={eta_g}", f"method.alpha={alpha}",
                             "method.randk_frac=1.0"], tmp_path)
    follow(loop, xs, bits=lambda r: (S * D * (VAL + LOG2D), S * 2 * dense()))


def test_scallion_default_alpha_is_k_over_d_per_tensor():
    """alpha = null: 1/(1 + omega) of RandK per tensor, omega = d/k - 1, so alpha = k/d with k = max(1, ceil(frac d))
    (not frac: 2/15 for d = 15 at frac 0.1, 1 for a one-entry tensor)."""
    from fl_lightning.codecs import RandK
    from fl_lightning.strategies.parts import Scallion

    part = Scallion(RandK(0.1), lr=0.1)
    assert part.alpha_for(15) == pytest.approx(2 / 15, rel=1e-15)
    assert part.alpha_for(1) == 1.0 and part.alpha_for(1000) == pytest.approx(0.1, rel=1e-15)
    assert Scallion(RandK(0.1), lr=0.1, alpha=0.3).alpha_for(15) == 0.3
