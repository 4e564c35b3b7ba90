"""Seed 002 (FedSMU) identities through the real FederatedLoop, Strategy and parts (spec 002 §9):

* T1: one client, one local step: FedSMU is Lion (lr gamma1, decoupled wd gamma2) for 100 steps, for any eta.
* T2/T3: the box ||x||_inf <= 1/gamma2 is invariant (and contracts at rate 1 - gamma1 gamma2 from outside); every
  server step obeys ||x_{t+1} - x_t||^2 <= 4 d gamma1^2.
* T4: the pre-sign vector recursion v_t = beta2 v_{t-tau} + (beta1 - beta2) g_{t-tau} + (1 - beta1) g_t under
  irregular participation.
* T5: the 3-client quadratic (a = (10, 1, 1), b = (+1, -1, -1)) where averaging and sign averaging disagree; the
  magnitude-uniformity index of (10, 1, 1) is 0.471 and FedSMU's is 1 per coordinate.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_lightning.codecs import Dense, LionMomentum
from tests.helpers.harness import FakeData, LossModule, MLP, build, make_loop, method_config, mse, regression_batches


def _stepwise(loop, rounds):
    """Global params after each of ``rounds`` rounds (x_1, ..., x_T), as one flat fp64 vector each."""
    out = []
    for _ in range(rounds):
        loop.run(stop_after_rounds=1, progress_enabled=False)
        out.append(torch.cat([v.detach().double().reshape(-1) for v in loop.global_params.values()]))
    return out


def _reference_lion(net: nn.Module, batch_fn, rounds, lr, wd, b1, b2):
    """Lion written out (Chen et al. 2023, Alg. 2; spec 002 §9 T1's reference):
    p <- p (1 - lr wd); p <- p - lr sign(b1 m + (1 - b1) g); m <- b2 m + (1 - b2) g."""
    ps = list(net.parameters())
    ms = [torch.zeros_like(p) for p in ps]
    traj = []
    for r in range(rounds):
        net.zero_grad()
        mse(net, batch_fn(0, r, 0)).backward()
        with torch.no_grad():
            for p, m in zip(ps, ms):
                g = p.grad
                p.mul_(1 - lr * wd)
                p.add_(torch.sign(b1 * m + (1 - b1) * g), alpha=-lr)
                m.mul_(b2).add_(g, alpha=1 - b2)
        traj.append(torch.cat([p.detach().reshape(-1) for p in ps]))
    return traj


@pytest.mark.parametrize("eta", [0.1, 1.0])
def test_t1_one_client_one_step_is_lion(tmp_path, eta):
    """T1 (spec 002 §3.2, Remark 4.6): x_t of FedSMU (n = m = 1, K = 1) equals Lion's for 100 steps; eta drops out
    (0.1 and 10x it give the same trajectory)."""
    g1, g2, b1, b2, rounds = 0.01, 0.5, 0.9, 0.99, 100
    cfg = method_config("fedsmu", [f"method.lr={eta}", f"method.gamma1={g1}", f"method.gamma2={g2}",
                                   f"method.beta1={b1}", f"method.beta2={b2}"])
    batch_fn = regression_batches(1, dtype=torch.float64)
    data = FakeData(batch_fn, 1)
    loop = make_loop(build(cfg), LossModule(MLP(dtype=torch.float64), mse), data, tmp_path,
                     num_clients=1, per_round=1, rounds=rounds, local_steps=1)
    loop.setup()
    got = _stepwise(loop, rounds)
    want = _reference_lion(MLP(dtype=torch.float64), batch_fn, rounds, g1, g2, b1, b2)
    for t in range(rounds):
        torch.testing.assert_close(got[t], want[t], rtol=0, atol=1e-10, msg=f"step {t + 1}")
    assert (got[-1] - got[0]).abs().max() > 10 * g1  # it moved


def _box_run(tmp_path, init_scale, rounds, g1=0.1, g2=0.5):
    cfg = method_config("fedsmu", [f"method.gamma1={g1}", f"method.gamma2={g2}", "method.lr=0.2"])
    net = MLP(dtype=torch.float64)
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(init_scale)
    x0 = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    data = FakeData(regression_batches(4, dtype=torch.float64), 4)
    loop = make_loop(build(cfg), LossModule(net, mse), data, tmp_path, num_clients=4, per_round=3, rounds=rounds,
                     local_steps=3)
    loop.setup()
    return x0, _stepwise(loop, rounds)


def test_t2_t3_box_is_invariant_and_steps_are_bounded(tmp_path):
    g1, g2 = 0.1, 0.5
    x0, xs = _box_run(tmp_path, 1.0, 30, g1, g2)
    assert x0.abs().max() <= 1 / g2
    d = x0.numel()
    prev = x0
    for t, x in enumerate(xs):
        assert x.abs().max() <= 1 / g2 + 1e-12, f"round {t + 1} left the box"                     # T2
        assert (x - prev).square().sum() <= 4 * d * g1 ** 2 + 1e-12, f"round {t + 1} step too long"  # T3
        assert (x - prev).abs().max() <= g1 * (1 + g2 * prev.abs().max()) + 1e-12              # spec §3.1 notes
        prev = x


def test_t2_outside_the_box_contracts_at_rate_one_minus_g1g2(tmp_path):
    """Per coordinate |x_{t+1}| <= (1 - g1 g2)|x_t| + g1, so (max|x_t| - 1/g2) <= (1 - g1 g2)^t (max|x_0| - 1/g2)."""
    g1, g2 = 0.1, 0.5
    x0, xs = _box_run(tmp_path, 12.0, 20, g1, g2)
    excess0 = float(x0.abs().max()) - 1 / g2
    assert excess0 > 1
    for t, x in enumerate(xs, start=1):
        assert float(x.abs().max()) - 1 / g2 <= (1 - g1 * g2) ** t * excess0 + 1e-12


def test_t4_presign_recursion_under_random_participation():
    """T4 (spec 002 §8.2, App. D): with v_t = beta1 m_{t-1} + (1 - beta1) g_t (what LionMomentum hands its inner
    codec; Dense shows it) and a client seen at rounds t - tau and t only, v_t = beta2 v_{t-tau} + (beta1 - beta2)
    g_{t-tau} + (1 - beta1) g_t, whatever tau."""
    b1, b2 = 0.9, 0.95
    codec = LionMomentum(Dense(), b1, b2)
    gen = torch.Generator().manual_seed(3)
    state: dict = {}
    last = None  # (v, g) at the client's previous participation
    participated = 0
    for t in range(60):
        if torch.rand((), generator=gen) < 0.35:  # irregular gaps tau
            g = torch.randn(7, dtype=torch.float64, generator=gen)
            v = codec.encode(g, state).tensor
            if last is None:
                torch.testing.assert_close(v, (1 - b1) * g)  # first participation: m = 0
            else:
                torch.testing.assert_close(v, b2 * last[0] + (b1 - b2) * last[1] + (1 - b1) * g)
            last = (v, g)
            participated += 1
    assert participated > 10


class Scalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.x = nn.Parameter(torch.zeros(1, dtype=torch.float64))


def _t5_loop(tmp_path, method, overrides, rounds=1):
    """F_i(x) = a_i (x - b_i)^2 / 2, a = (10, 1, 1), b = (+1, -1, -1), x0 = 0, full participation, K = 1."""
    a, b = [10.0, 1.0, 1.0], [1.0, -1.0, -1.0]
    cfg = method_config(method, overrides)
    net = Scalar()
    module = LossModule(net, lambda n, batch: (0.5 * batch["a"] * (n.x - batch["b"]).square()).mean())
    data = FakeData(lambda c, r, k: {"a": torch.tensor([a[c]], dtype=torch.float64),
                                     "b": torch.tensor([b[c]], dtype=torch.float64)}, 3)
    loop = make_loop(build(cfg), module, data, tmp_path, num_clients=3, per_round=3, rounds=rounds, local_steps=1,
                     eval_every=1)
    loop.setup()
    loop.run(progress_enabled=False)
    return float(loop.global_params["net.x"]), loop


def test_t5_averaging_and_sign_averaging_disagree(tmp_path):
    eta, g1, g2 = 0.01, 0.05, 0.01
    # first-round deltas: -eta a_i (0 - b_i) = eta (10, -1, -1)
    x_avg, loop_avg = _t5_loop(tmp_path / "avg", "fedavg", [f"method.lr={eta}", "method.parts.aggregation.weighting=uniform",
                                                            "+method.parts.mu._target_=fl_lightning.strategies.parts.MagnitudeUniformity",
                                                            "+method.parts.mu.mode=all"])
    assert x_avg == pytest.approx(eta * 8 / 3, rel=1e-12)  # FedAvg follows the large client: +8/3 eta
    x_smu, loop_smu = _t5_loop(tmp_path / "smu", "fedsmu", [f"method.lr={eta}", f"method.gamma1={g1}",
                                                            f"method.gamma2={g2}", "method.log_mu=true", "method.mu_mode=all"])
    assert x_smu == pytest.approx(-g1 / 3, rel=1e-12)  # mean of (+1, -1, -1) = -1/3, no decay at x0 = 0
    x_mv, _ = _t5_loop(tmp_path / "mv", "fedsmu_mv", [f"method.lr={eta}", f"method.gamma1={g1}", f"method.gamma2={g2}"])
    assert x_mv == pytest.approx(-g1, rel=1e-12)  # sign(+1 - 1 - 1) = -1
    # the Jain index of the magnitudes (10, 1, 1) = 144 / (3 * 102) = 0.471 (spec §5); FedSMU's signs: 1
    mu_avg = loop_avg.recorder.rows[-1]["mu"]
    assert mu_avg == pytest.approx(144 / 306, rel=1e-9) and round(mu_avg, 3) == 0.471
    assert loop_smu.recorder.rows[-1]["mu"] == pytest.approx(1.0, rel=1e-12)


def test_t5_fixed_points_differ(tmp_path):
    """Spec 002 §9 T5 caveat: f = mean F_i is minimised at x* = sum a_i b_i / sum a_i = +2/3; FedAvg goes there,
    FedSMU's sign vote drifts toward the median-like point -1 (gamma2 shrinks it slightly)."""
    x_avg, _ = _t5_loop(tmp_path / "avg", "fedavg", ["method.lr=0.05", "method.parts.aggregation.weighting=uniform"],
                        rounds=200)
    assert x_avg == pytest.approx(2 / 3, abs=1e-3)
    x_smu, _ = _t5_loop(tmp_path / "smu", "fedsmu", ["method.lr=0.05", "method.gamma1=0.02", "method.gamma2=0.01"],
                        rounds=200)
    assert -1.05 < x_smu < -0.9


# ---------------------------------------------------------------------------------------------------------------
# Alg. 1 with several clients and persistent momenta, against the recursion written out (2 clients, 4-D quadratics)
# ---------------------------------------------------------------------------------------------------------------
QA = torch.tensor([[1.0, 0.5, 2.0, 0.2], [0.3, 1.5, 1.0, 2.5]], dtype=torch.float64)
QC = torch.tensor([[1.0, -2.0, 0.5, 3.0], [-1.0, 1.0, 2.0, -0.5]], dtype=torch.float64)
QX0 = torch.tensor([0.3, -0.4, 0.1, 0.2], dtype=torch.float64)
QK, QETA = 3, 0.1


class QVec(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(QX0.clone())


def _q_local(x, i):
    w = x.clone()
    for _ in range(QK):
        w = w - QETA * QA[i] * (w - QC[i])
    return w


def _q_loop(tmp_path, method, overrides, rounds):
    cfg = method_config(method, [f"method.lr={QETA}", *overrides])
    data = FakeData(lambda c, r, k: {"a": QA[c][None].clone(), "c": QC[c][None].clone()}, 2)
    loop = make_loop(build(cfg), LossModule(QVec(), lambda n, b: 0.5 * (b["a"] * (n.w - b["c"]) ** 2).sum()), data,
                     tmp_path, num_clients=2, per_round=2, rounds=rounds, local_steps=QK)
    loop.setup()
    return loop


@pytest.mark.parametrize("method,combine", [
    ("fedsmu", lambda us: sum(us) / len(us)),            # Alg. 1 line 16: the mean of the signs
    ("fedsmu_mv", lambda us: torch.sign(sum(us))),       # spec §3.10: the majority vote (2 clients: ties -> 0)
])
def test_alg1_recursion_with_persistent_momenta(tmp_path, method, combine):
    g1, g2, b1, b2, rounds = 0.05, 0.2, 0.9, 0.8, 8
    loop = _q_loop(tmp_path, method, [f"method.gamma1={g1}", f"method.gamma2={g2}", f"method.beta1={b1}",
                                      f"method.beta2={b2}"], rounds)
    x, ms = QX0.clone(), [torch.zeros(4, dtype=torch.float64) for _ in range(2)]
    ties = 0
    for r in range(rounds):
        us = []
        for i in range(2):
            g = _q_local(x, i) - x
            us.append(torch.sign(b1 * ms[i] + (1 - b1) * g))
            ms[i] = b2 * ms[i] + (1 - b2) * g
        ties += int((sum(us) == 0).sum())
        x = x + g1 * (combine(us) - g2 * x)
        loop.run_round(r)
        torch.testing.assert_close(loop.global_params["net.w"], x, rtol=1e-12, atol=1e-12, msg=f"round {r + 1}")
    assert ties > 0  # the clients disagree somewhere, so mean and vote differ


def test_three_bit_variant_quantizes_the_interpolation(tmp_path):
    """fedsmu_3bit: u = the 2^3 levels of [-1, 1] nearest to v / max|v| (spec §3.11 as implemented, 002/#20)."""
    g1, g2, b1, b2, rounds = 0.05, 0.2, 0.9, 0.8, 5
    loop = _q_loop(tmp_path, "fedsmu_3bit", [f"method.gamma1={g1}", f"method.gamma2={g2}", f"method.beta1={b1}",
                                             f"method.beta2={b2}"], rounds)
    levels = torch.tensor([-1 + 2 * j / 7 for j in range(8)], dtype=torch.float64)
    x, ms = QX0.clone(), [torch.zeros(4, dtype=torch.float64) for _ in range(2)]
    for r in range(rounds):
        us = []
        for i in range(2):
            g = _q_local(x, i) - x
            v = b1 * ms[i] + (1 - b1) * g
            y = v / v.abs().max()
            us.append(levels[(y[:, None] - levels).abs().argmin(dim=1)])
            ms[i] = b2 * ms[i] + (1 - b2) * g
        x = x + g1 * (sum(us) / 2 - g2 * x)
        loop.run_round(r)
        torch.testing.assert_close(loop.global_params["net.w"], x, rtol=1e-12, atol=1e-12, msg=f"round {r + 1}")


def test_fedef_sign_composition_is_alg3(tmp_path):
    """FedAvg with codec ErrorFeedback(ScaledSign) is spec 002 Alg. 3 (FedEF-Sign, eta_g = 1, uniform weights):
    Delta_i = C(g_i + e_i), e_i <- e_i + g_i - Delta_i, x <- x + mean Delta_i, C(z) = (||z||_1 / d) sign(z)."""
    rounds = 6
    loop = _q_loop(tmp_path, "fedavg", ["method.parts.aggregation.weighting=uniform",
                                        "+method.parts.aggregation.codec._target_=fl_lightning.codecs.ErrorFeedback",
                                        "+method.parts.aggregation.codec.inner._target_=fl_lightning.codecs.ScaledSign"],
                   rounds)
    x, es = QX0.clone(), [torch.zeros(4, dtype=torch.float64) for _ in range(2)]
    for r in range(rounds):
        deltas = []
        for i in range(2):
            z = _q_local(x, i) - x + es[i]
            c = z.abs().mean() * torch.sign(z)
            es[i] = z - c
            deltas.append(c)
        x = x + sum(deltas) / 2
        loop.run_round(r)
        torch.testing.assert_close(loop.global_params["net.w"], x, rtol=1e-12, atol=1e-12, msg=f"round {r + 1}")
