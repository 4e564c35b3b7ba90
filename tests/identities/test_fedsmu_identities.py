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
            v = codec.encode("w", g, state).tensor
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
