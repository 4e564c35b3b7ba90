"""Seed 003's variance-reduced and adaptive baselines (issue 16) through the real FederatedLoop and their yamls, each
against its defining update written out by hand in float64 on per-client quadratics whose minibatch changes with
(client, round, step): f(w; ξ) = ½ Σ_j a_j (w_j − c_j)² with (a, c) a function of the batch, so a gradient reveals
both the weights it was taken at and the batch it saw. Never compared with another config built from the same parts.

* SCAFFOLD-M, FedAvg-VR, SCAFFOLD-VR (Cheng, Huang, Wu, Yuan, ICLR 2024; spec 003 B4–B6);
* PAdaMFed, PAdaMFed-VR (Yan, Zhang, Wang, Cao, ICLR 2025; spec 003 B7–B8): normalised steps, g from the controls;
* the VR methods' same-ξ property: the reference's second gradient is at x^{r−1} on the CURRENT minibatch; the same
  recursion with x^r, or with the next minibatch, ends elsewhere (so the test tells them apart).
"""
from __future__ import annotations

import pytest
import torch

from fl_lightning import seeding
from fl_lightning.errors import ConfigError
from tests.helpers.harness import FakeData, LossModule, build, make_loop, method_config, QuadVec, quad_loss

D, K, R = 4, 3, 6
A = torch.tensor([[1.0, 0.5, 2.0, 0.2], [0.3, 1.5, 1.0, 2.5], [0.8, 0.6, 0.4, 1.2]], dtype=torch.float64)
C = torch.tensor([[1.0, -2.0, 0.5, 3.0], [-1.0, 1.0, 2.0, -0.5], [0.5, 0.5, -1.5, 1.0]], dtype=torch.float64)
X0 = torch.tensor([0.3, -0.4, 0.1, 0.2], dtype=torch.float64)


def batch(i, r, k):
    """Client i's minibatch k of round r (r = −1: the probe batch, −2: the test batch)."""
    return {"a": (A[i] * (1 + 0.3 * ((k + r) % 3)))[None], "c": (C[i] + 0.2 * k - 0.1 * r)[None]}


def grad(w, i, r, k):
    b = batch(i, r, k)
    return b["a"][0] * (w - b["c"][0])


def make(method, overrides, tmp_path, n=3, s=2):
    cfg = method_config(method, list(overrides))
    data = FakeData(lambda c, r, k: batch(c, r, k), n)
    loop = make_loop(build(cfg), LossModule(QuadVec(X0), quad_loss), data, tmp_path, num_clients=n, per_round=s,
                     rounds=R, local_steps=K)
    loop.setup()
    return loop


def reference(lr, beta, *, control, vr, normalize, momentum, n=3, s=2, vr_at="prev", vr_batch=0):
    """The papers' recursion: v = a ∇F(x_i; ξ_k) − β c_i + βc + (1−β) g − [vr] (1−β) ∇F(x^{r−1}; ξ_k), a = 1 with VR
    else β; x_i ← x_i − lr v (/‖v‖ when normalised); c_i⁺ = mean raw gradient; c ← c + (1/n) Σ Δc_i; g⁺ = the mean
    local direction (Cheng et al.) or β(c + mean_S Δc_i) + (1−β) g (PAdaMFed); x⁺ = mean x_i. g⁰ = mean over ALL n
    clients of the probe gradient at x⁰, c⁰ = c_i⁰ = 0, x^{−1} = x⁰."""
    x, x_prev = X0.clone(), X0.clone()
    g = sum(grad(x, i, -1, 0) for i in range(n)) / n
    c, ci, out = torch.zeros(D, dtype=torch.float64), [torch.zeros(D, dtype=torch.float64)] * n, []
    for r in range(R):
        d = (1 - beta) * g + (beta * c if control else 0)
        ws, dcs = [], []
        for i in seeding.sample_clients(0, r, n, s):
            w, acc = x.clone(), torch.zeros(D, dtype=torch.float64)
            for k in range(K):
                gk = grad(w, i, r, k)
                acc = acc + gk
                v = (1.0 if vr else beta) * gk + d - (beta * ci[i] if control else 0)
                if vr:
                    v = v - (1 - beta) * grad(x_prev if vr_at == "prev" else x, i, r, k + vr_batch)
                w = w - lr * (v / v.norm() if normalize else v)
            if control:
                dcs.append(acc / K - ci[i])
                ci[i] = acc / K
            ws.append(w)
        mean_delta = sum(w - x for w in ws) / len(ws)
        if momentum == "direction":
            g = -mean_delta / (lr * K)
        else:
            g = beta * (c + sum(dcs) / len(dcs)) + (1 - beta) * g
        if control:
            c = c + sum(dcs) / n
        x_prev, x = x, x + mean_delta
        out.append(x)
    return out


FORMS = {  # method: (control, vr, normalize, momentum)
    "scaffold_m": (True, False, False, "direction"),
    "fedavg_vr": (False, True, False, "direction"),
    "scaffold_vr": (True, True, False, "direction"),
    "padamfed": (True, False, True, "control"),
    "padamfed_vr": (True, True, True, "control"),
}


def follow(loop, xs):
    for r in range(R):
        loop.run_round(r)
        torch.testing.assert_close(loop.global_params["net.w"], xs[r], rtol=1e-12, atol=1e-12, msg=f"round {r + 1}")


@pytest.mark.parametrize("method", sorted(FORMS))
def test_defining_update_by_hand(tmp_path, method):
    """3 clients, 2 sampled per round: c's 1/n, g⁰ over all clients and the kept c_i of the idle client all matter."""
    control, vr, normalize, momentum = FORMS[method]
    lr, beta = 0.1, 0.3
    loop = make(method, [f"method.lr={lr}", f"method.beta={beta}"], tmp_path)
    form = dict(control=control, vr=vr, normalize=normalize, momentum=momentum)
    xs = reference(lr, beta, **form)
    follow(loop, xs)
    if vr:  # same ξ at x^{r−1}: the current weights, or the next minibatch, give another trajectory
        for wrong in (dict(vr_at="current"), dict(vr_batch=1)):
            assert (reference(lr, beta, **form, **wrong)[-1] - xs[-1]).abs().max() > 1e-3, wrong
    if control:  # the control variates matter
        assert (reference(lr, beta, **{**form, "control": False, "momentum": "direction"})[-1] - xs[-1]).abs().max() > 1e-3


def test_vr_with_clients_keeping_the_previous_model(tmp_path):
    """prev_model=client under full participation: the same trajectory, x^{r−1} no longer on the downlink; refused
    with one line naming the key under partial participation."""
    lr, beta = 0.1, 0.3
    kept = make("fedavg_vr", [f"method.lr={lr}", f"method.beta={beta}", "method.prev_model=client"], tmp_path / "a", n=2, s=2)
    sent = make("fedavg_vr", [f"method.lr={lr}", f"method.beta={beta}"], tmp_path / "b", n=2, s=2)
    xs = reference(lr, beta, control=False, vr=True, normalize=False, momentum="direction", n=2, s=2)
    follow(kept, xs)
    follow(sent, xs)
    P = D * 8  # float64 bytes
    down = lambda loop: loop.recorder.totals["downlink_bits"] // 8  # noqa: E731
    assert down(sent) - down(kept) == 2 * (R - 1) * P  # 2 clients, rounds 1..R-1
    with pytest.raises(ConfigError, match=r"method\.parts\.direction\.prev_model.*full participation"):
        make("scaffold_vr", ["method.prev_model=client"], tmp_path / "c", n=3, s=2)


# ------------------------------------------------------------------------------------------------------ Adam-BiClip
def test_adam_biclip_by_hand(tmp_path):
    """Lee, Zaheer & Li (TailOPT): clients x ← x − η sign(g) clamp(|g|, d t^γ, u t^ζ) (t = round + 1), server Adam on
    the uniform mean Δ = (1/|S|) Σ (x_i − x) (B9/B11; Reddi et al. Alg. 2: no bias correction, v_{−1} = τ²).
    Thresholds chosen so both sides clip in every round (checked), with growing d and shrinking u."""
    lr, d, u, gam, zeta = 0.1, 0.5, 1.5, 0.5, -0.25
    slr, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    loop = make("adam_biclip", [f"method.lr={lr}", f"method.biclip_lower={d}", f"method.biclip_upper={u}",
                                f"method.biclip_lower_exponent={gam}", f"method.biclip_upper_exponent={zeta}",
                                f"method.server_lr={slr}"], tmp_path, n=2, s=2)
    x, m, v = X0.clone(), torch.zeros(D, dtype=torch.float64), torch.full((D,), tau * tau, dtype=torch.float64)
    xs, below, above = [], 0, 0
    for r in range(R):
        lo, hi = d * (r + 1) ** gam, u * (r + 1) ** zeta
        ws = []
        for i in range(2):
            w = x.clone()
            for k in range(K):
                g = grad(w, i, r, k)
                below, above = below + int((g.abs() < lo).sum()), above + int((g.abs() > hi).sum())
                w = w - lr * g.sign() * g.abs().clamp(lo, hi)
            ws.append(w)
        delta = ((ws[0] - x) + (ws[1] - x)) / 2  # uniform, though FakeData's sizes are 10 and 11
        m = b1 * m + (1 - b1) * (-delta)
        v = b2 * v + (1 - b2) * delta * delta
        x = x - slr * m / (v.sqrt() + tau)
        xs.append(x)
    assert below > 0 and above > 0
    follow(loop, xs)


# ------------------------------------------------------------------------------------------------------ FAFED
def _fafed(lr, k_, omega, c, rho, decay, n=3, s=2, prev="prev", shift=0):
    """Wu et al. Alg. 1 as spec 003 B10 reads it: per round (q = K steps) from x̄, m̄, H = √v̄ + ρ: a step
    x ← x − γ η_t m / H, then per minibatch m ← ∇F(x; ξ) + (1 − α)(m − ∇F(x_prev; ξ)), v ← ϱv + (1 − ϱ)∇F(x; ξ)²
    and a step unless it is the last; η_t = k/(ω + t)^{1/3}, α = min(1, c η_t²), t = r K + step; the server
    averages x, m, v over the sampled clients; m̄⁰, v̄⁰ = mean probe gradient (and square) over ALL clients."""
    eta = lambda t: k_ / (omega + t) ** (1 / 3)  # noqa: E731
    x = X0.clone()
    m_bar = sum(grad(x, i, -1, 0) for i in range(n)) / n
    v_bar = sum(grad(x, i, -1, 0) ** 2 for i in range(n)) / n
    out = []
    for r in range(R):
        t0, ws, ms, vs = r * K, [], [], []
        H = v_bar.sqrt() + rho
        for i in seeding.sample_clients(0, r, n, s):
            w_prev, m, v = x.clone(), m_bar.clone(), v_bar.clone()
            w = x - lr * eta(t0) * m / H
            for k in range(K):
                g = grad(w, i, r, k)
                old = grad(w_prev if prev == "prev" else w, i, r, k + shift)
                alpha = min(1.0, c * eta(t0 + k) ** 2)
                m = g + (1 - alpha) * (m - old)
                v = decay * v + (1 - decay) * g * g
                w_prev = w
                if k < K - 1:
                    w = w - lr * eta(t0 + k + 1) * m / H
            ws.append(w), ms.append(m), vs.append(v)
        x, m_bar, v_bar = sum(ws) / len(ws), sum(ms) / len(ms), sum(vs) / len(vs)
        out.append(x)
    return out


def test_fafed_by_hand(tmp_path):
    lr, k_, omega, c, rho, decay = 0.05, 2.0, 8.0, 0.5, 0.1, 0.9
    loop = make("fafed", [f"method.lr={lr}", f"method.storm_k={k_}", f"method.storm_omega={omega}",
                          f"method.storm_c={c}", f"method.rho={rho}", f"method.v_decay={decay}"], tmp_path)
    xs = _fafed(lr, k_, omega, c, rho, decay)
    follow(loop, xs)
    for wrong in (dict(prev="current"), dict(shift=1)):  # the previous iterate, on the same minibatch
        assert (_fafed(lr, k_, omega, c, rho, decay, **wrong)[-1] - xs[-1]).abs().max() > 1e-3, wrong


@pytest.mark.parametrize("method,override,key", [
    ("scaffold_m", "method.beta=0", "method.beta"),
    ("padamfed", "method.parts.direction.control=false", "method.parts.direction.momentum"),
    ("adam_biclip", "method.biclip_lower=2", "method.biclip_lower"),
    ("fafed", "method.v_decay=1", "method.v_decay"),
])
def test_bad_values_are_one_line_errors_naming_the_key(method, override, key):
    with pytest.raises(ConfigError) as err:
        build(method_config(method, [override]))
    assert key in str(err.value) and "\n" not in str(err.value)
