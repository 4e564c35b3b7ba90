"""The first-order baselines of the five papers (issue 15) through the real FederatedLoop and their conf/method yamls,
each against its defining update computed by hand on a quadratic in float64 (client i: f_i(w) = ½ Σ_j a_ij (w_j −
c_ij)², so ∇f_i(w) = a_i ⊙ (w − c_i) exactly, the same on every minibatch); never against another config built
from the same parts:

* ``fedprox`` (Li et al., MLSys 2020, Alg. 2): local gradient + μ (w − x^r);
* ``fedcm`` (Xu et al. 2021, Alg. 1; spec 001 §5.3, 004 §3.7): d = (1−γ) clip(g) + γ Δ^r, x ← x − η(d + λx), with
  the yaml's paper values (lr 0.1, wd 1e-3, γ = 0.9, clip 10), constant and cosine lr;
* ``fedavgm`` (Cheng, Huang, Wu, Yuan, ICLR 2024, Alg. 1; spec 003 B3): g_i = β∇F_i + (1−β) g^r, g⁰ = the mean
  gradient of ALL n clients at x⁰, g^{r+1} = (1/(ηSK)) Σ (x^r − x_i), x^{r+1} = x^r − ηK g^{r+1};
* ``fedlada`` (Sun et al., TPAMI 2023; spec 004 §3.8, the GLUE code): Adam whose v starts from the mean of last
  round's client v, whose step counter is global, plus γ D/K after every step;
* the three "FedAvg with momentum" names are three different recursions;
* SCAFFOLD option II (Karimireddy et al., ICML 2020, Alg. 1) and the released codes' inert correction
  (``correction_applied=false``: FedAvg's model trajectory while c, c_i are still computed).
"""
from __future__ import annotations

import math

import pytest
import torch

from fl_lightning import seeding
from fl_lightning.schedule import lr_factor
from tests.helpers.harness import FakeData, LossModule, build, make_loop, method_config, QuadVec, quad_loss

D, K, R = 4, 3, 6
A = torch.tensor([[1.0, 0.5, 2.0, 0.2], [0.3, 1.5, 1.0, 2.5], [0.8, 0.6, 0.4, 1.2]], dtype=torch.float64)
C = torch.tensor([[1.0, -2.0, 0.5, 3.0], [-1.0, 1.0, 2.0, -0.5], [0.5, 0.5, -1.5, 1.0]], dtype=torch.float64)
X0 = torch.tensor([0.3, -0.4, 0.1, 0.2], dtype=torch.float64)


def Vec():
    return QuadVec(X0)


def grad(w, i, scale=1.0):
    return A[i] * (w - scale * C[i])


def plain_fedavg_round(x, lr):
    """One round of uniform FedAvg by hand: both clients take K plain SGD steps from x; the mean of the results."""
    ws = []
    for i in range(2):
        w = x.clone()
        for _ in range(K):
            w = w - lr * grad(w, i)
        ws.append(w)
    return sum(ws) / 2


def make(method, overrides, tmp_path, n=2, s=2, schedule="constant", rounds=R, scale=1.0):
    cfg = method_config(method, list(overrides))
    data = FakeData(lambda c, r, k: {"a": A[c][None].clone(), "c": scale * C[c][None].clone()}, n)
    loop = make_loop(build(cfg), LossModule(Vec(), quad_loss), data, tmp_path, num_clients=n, per_round=s,
                     rounds=rounds, local_steps=K, lr_schedule=schedule)
    loop.setup()
    return loop


def follow(loop, reference, rounds=R, rtol=1e-12, atol=1e-12):
    """Run round by round; x after every round must equal the reference's."""
    xs = reference()
    assert len(xs) == rounds
    for r in range(rounds):
        loop.run_round(r)
        torch.testing.assert_close(loop.global_params["net.w"], xs[r], rtol=rtol, atol=atol, msg=f"round {r + 1}")
    return xs


def clip(g, max_norm):
    norm = g.norm()
    return g * (max_norm / (norm + 1e-6)) if max_norm is not None and norm > max_norm else g  # torch's clip rule


# ------------------------------------------------------------------------------------------------------ FedProx
@pytest.mark.parametrize("mu", [0.0, 0.1, 1.0])
def test_fedprox_adds_the_proximal_gradient(tmp_path, mu):
    lr = 0.2
    loop = make("fedprox", [f"method.lr={lr}", f"method.mu={mu}"], tmp_path)
    weights = [10.0, 11.0]  # FakeData.num_samples: fedavg's size-weighted mean

    def reference():
        x, out = X0.clone(), []
        for _ in range(R):
            ws = []
            for i in range(2):
                w = x.clone()
                for _ in range(K):
                    w = w - lr * (grad(w, i) + mu * (w - x))  # Li et al. Alg. 2: ∇h_i = ∇F_i + μ (w − x^r)
                ws.append(w)
            x = sum(wt * w for wt, w in zip(weights, ws)) / sum(weights)
            out.append(x)
        return out

    xs = follow(loop, reference)
    if mu == 1.0:  # the term matters: FedAvg's weights differ
        plain = make("fedavg", [f"method.lr={lr}"], tmp_path / "plain")
        for r in range(R):
            plain.run_round(r)
        assert (plain.global_params["net.w"] - xs[-1]).abs().max() > 1e-3


def test_fedprox_rejects_negative_mu(tmp_path):
    from fl_lightning.errors import ConfigError

    with pytest.raises(ConfigError, match="mu"):
        make("fedprox", ["method.mu=-1"], tmp_path)


# ------------------------------------------------------------------------------------------------------ FedCM
def _fedcm(lr, gamma, wd, clip_norm, schedule, scale, wd_scaled=False):
    """Xu et al. Alg. 1 with the papers' settings: d = (1−γ)·clip(g) + γ·Δ^r (Δ^0 = 0), x ← x − η_r (d + λx)
    (wd_scaled: x ← x − η_r ((1−γ)(clip(g) + λx) + γΔ), seed 004's GLUE code); server x ← mean x_i (uniform),
    Δ^{r+1} = −mean(x_i − x^r)/(K η_r)."""
    x, delta, out = X0.clone(), torch.zeros(D, dtype=torch.float64), []
    for r in range(R):
        eta = lr * lr_factor(r, R, schedule)
        ws = []
        for i in range(2):
            w = x.clone()
            for _ in range(K):
                g = clip(grad(w, i, scale), clip_norm)
                if wd_scaled:
                    w = w - eta * ((1 - gamma) * (g + wd * w) + gamma * delta)
                else:
                    w = w - eta * ((1 - gamma) * g + gamma * delta + wd * w)
            ws.append(w)
        mean = sum(ws) / 2
        delta = -(mean - x) / (K * eta)
        x = mean
        out.append(x)
    return out


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
@pytest.mark.parametrize("wd_scaled", [False, True])
def test_fedcm_is_xu_et_al_with_the_papers_values(tmp_path, schedule, wd_scaled):
    cfg = method_config("fedcm")
    lr, gamma, wd, clip_norm = cfg.method.lr, cfg.method.gamma, cfg.method.weight_decay, cfg.method.grad_clip
    assert (lr, gamma, wd, clip_norm) == (0.1, 0.9, 0.001, 10.0)  # seeds 001 (Table 8) / 004 (code)
    scale = 6.0  # minimisers far away: the first rounds' gradients exceed the clip norm 10
    assert grad(X0, 1, scale).norm() > clip_norm
    over = [f"method.parts.alignment.scale_weight_decay={str(wd_scaled).lower()}"]
    loop = make("fedcm", over, tmp_path, schedule=schedule, scale=scale)
    xs = follow(loop, lambda: _fedcm(lr, gamma, wd, clip_norm, schedule, scale, wd_scaled))
    # non-vacuous: without the global direction (γ = 0) the trajectory is another one
    assert (_fedcm(lr, 0.0, wd, clip_norm, schedule, scale)[-1] - xs[-1]).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------------ FedAvg-M
def _fedavg_m(lr, beta, init, n, s):
    """Cheng et al. Alg. 1 (spec 003 B3), β on the fresh gradient."""
    x = X0.clone()
    g = sum(grad(x, i) for i in range(n)) / n if init == "grad" else torch.zeros(D, dtype=torch.float64)
    out = []
    for r in range(R):
        sampled = seeding.sample_clients(0, r, n, s)
        ws = []
        for i in sampled:
            w = x.clone()
            for _ in range(K):
                w = w - lr * (beta * grad(w, i) + (1 - beta) * g)
            ws.append(w)
        g = sum(x - w for w in ws) / (lr * len(ws) * K)
        x = x - lr * K * g
        out.append(x)
    return out


@pytest.mark.parametrize("init", ["grad", "zero"])
def test_fedavgm_is_cheng_et_al_alg1(tmp_path, init):
    """n = 3 clients, 2 sampled per round: g⁰ is the mean over all three, not over the sampled ones."""
    lr, beta = 0.1, 0.1
    cfg = method_config("fedavgm")
    assert cfg.method.global_momentum == pytest.approx(1 - beta) and cfg.method.init == "grad"
    loop = make("fedavgm", [f"method.lr={lr}", f"method.init={init}"], tmp_path, n=3, s=2)
    xs = follow(loop, lambda: _fedavg_m(lr, beta, init, 3, 2))
    if init == "grad":  # g⁰ matters
        assert (_fedavg_m(lr, beta, "zero", 3, 2)[0] - xs[0]).abs().max() > 1e-3
        two = sum(grad(X0, i) for i in seeding.sample_clients(0, 0, 3, 2)) / 2
        three = sum(grad(X0, i) for i in range(3)) / 3
        assert (two - three).abs().max() > 1e-2  # so the test tells "all clients" from "sampled clients"


def test_three_fedavg_momentum_names_are_three_recursions(tmp_path):
    """Local momentum SGD (seed 000), Cheng et al.'s FedAvg-M and Hsu et al.'s server momentum, each with β = 0.9 on
    the past, end at three different points; local momentum is torch's heavy ball reset every round (written out)."""
    lr, mom = 0.1, 0.9
    local = make("fedavg", [f"method.lr={lr}", f"method.momentum={mom}", "method.parts.aggregation.weighting=uniform"],
                 tmp_path / "local")
    cheng = make("fedavgm", [f"method.lr={lr}"], tmp_path / "cheng")
    hsu = make("fedavg_server_momentum", [f"method.lr={lr}", "method.parts.aggregation.weighting=uniform"],
               tmp_path / "hsu")

    def local_ref():
        x, out = X0.clone(), []
        for _ in range(R):
            ws = []
            for i in range(2):
                w, buf = x.clone(), torch.zeros(D, dtype=torch.float64)
                for _ in range(K):
                    buf = mom * buf + grad(w, i)
                    w = w - lr * buf
                ws.append(w)
            x = sum(ws) / 2
            out.append(x)
        return out

    def hsu_ref():
        x, v, out = X0.clone(), torch.zeros(D, dtype=torch.float64), []
        for _ in range(R):
            v = mom * v + (x - plain_fedavg_round(x, lr))  # Hsu et al.: v ← βv + Δ-gradient, x ← x − 1·v
            x = x - v
            out.append(x)
        return out

    a, b, c = follow(local, local_ref), follow(cheng, lambda: _fedavg_m(lr, 0.1, "grad", 2, 2)), follow(hsu, hsu_ref)
    for p, q in ((a, b), (a, c), (b, c)):
        assert (p[-1] - q[-1]).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------------ FedLADA
def _fedlada(lr, gamma, wd, clip_norm, b1=0.9, b2=0.999, eps=1e-8):
    """Spec 004 §3.8 (the GLUE code): per client m = 0, v = v̄, t = t̄; per step g = clip(∇f) + λw (torch Adam's
    coupled L2), t += 1, Adam with bias correction at the global t, then w ← w + γ D / K; server x ← mean x_i,
    D ← mean Δ_i, v̄ ← mean v_i, t̄ ← mean t_i (uniform). v̄ = 0, D = 0, t̄ = 0 in round 0."""
    x, D_, vbar, tbar, out = X0.clone(), torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64), 0, []
    for _ in range(R):
        ws, vs, ts = [], [], []
        for i in range(2):
            w, m, v, t = x.clone(), torch.zeros(D, dtype=torch.float64), vbar.clone(), tbar
            for _ in range(K):
                g = clip(grad(w, i), clip_norm) + wd * w
                t += 1
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                w = w - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
                w = w + gamma * D_ / K
            ws.append(w), vs.append(v), ts.append(t)
        mean = sum(ws) / 2
        D_, vbar, tbar = mean - x, sum(vs) / 2, sum(ts) / 2
        x = mean
        out.append(x)
    return out


def test_fedlada_follows_the_code_semantics(tmp_path):
    cfg = method_config("fedlada")
    lr, gamma, wd, clip_norm = 0.05, cfg.method.gamma, cfg.method.weight_decay, cfg.method.grad_clip
    assert (gamma, wd, clip_norm) == (0.9, 0.01, 10.0)
    loop = make("fedlada", [f"method.lr={lr}"], tmp_path)
    xs = follow(loop, lambda: _fedlada(lr, gamma, wd, clip_norm), rtol=1e-10, atol=1e-12)
    # every piece matters: no γ D/K, or a fresh v and step, give other trajectories
    assert (_fedlada(lr, 0.0, wd, clip_norm)[-1] - xs[-1]).abs().max() > 1e-3
    # the state the server holds: v̄ and the global step counter R·K
    st = loop.strategy.state_dict()
    steps = [v for k, v in st.items() if k.endswith("/step")]
    assert steps and all(float(s) == R * K for s in steps)
    assert any(k.endswith("/exp_avg_sq") for k in st)


# ------------------------------------------------------------------------------------------------------ SCAFFOLD
@pytest.mark.parametrize("applied", [True, False])
def test_scaffold_option2_and_the_released_codes_inert_correction(tmp_path, applied):
    lr = 0.1
    loop = make("scaffold", [f"method.lr={lr}", "method.control=option2",
                             f"method.parts.correction.correction_applied={str(applied).lower()}"], tmp_path)

    def reference():
        x, c, ci, out = X0.clone(), torch.zeros(D, dtype=torch.float64), [torch.zeros(D, dtype=torch.float64)] * 2, []
        for _ in range(R):
            ys, dcs = [], []
            for i in range(2):
                y = x.clone()
                for _ in range(K):
                    y = y - lr * (grad(y, i) - ci[i] + c if applied else grad(y, i))
                new = ci[i] - c + (x - y) / (K * lr)      # option II
                dcs.append(new - ci[i])
                ci[i] = new
                ys.append(y)
            x = x + sum(y - x for y in ys) / 2           # η_g = 1, uniform
            c = c + sum(dcs) / 2                         # (1/n) Σ Δc_i, n = 2
            out.append(x)
        return out, c

    xs, c = reference()
    follow(loop, lambda: xs)
    from fl_lightning.strategies.parts import ScaffoldCorrection

    corr = next(p for p in loop.strategy.parts if isinstance(p, ScaffoldCorrection))
    torch.testing.assert_close(corr.c["net.w"], c, rtol=1e-12, atol=1e-12)
    assert c.abs().max() > 1e-2
    if not applied:  # the model moves as plain uniform FedAvg
        x = X0.clone()
        for _ in range(R):
            x = plain_fedavg_round(x, lr)
        torch.testing.assert_close(xs[-1], x, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------------ FedOpt defaults
@pytest.mark.parametrize("method,target,tau,v0", [("fedadam", "Adam", 1e-3, "tau2"), ("fedyogi", "Yogi", 1e-3, "tau2"),
                                                  ("fedams", "AMSGrad", 1e-6, "zero")])
def test_fedopt_yamls_hold_reddi_et_als_defaults(method, target, tau, v0):
    """Reddi et al. (ICLR 2021) Alg. 2 / Sec. 5: β = (0.9, 0.99), τ = 1e-3, η = 1e-2, no bias correction (the
    formulas themselves: tests/unit/strategies/test_server_opt.py; FedAMS's τ is a floor on v̂, 1e-6 = (1e-3)²)."""
    opt = method_config(method).method.parts.aggregation.server_opt
    assert opt._target_ == f"fl_lightning.server_opt.{target}"
    assert (opt.lr, opt.beta1, opt.beta2, opt.tau, opt.bias_correction, opt.v0) == (0.01, 0.9, 0.99, tau, False, v0)
    assert math.isclose(math.sqrt(1e-6), 1e-3)
