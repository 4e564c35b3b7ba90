"""Server optimizers (fl_lightning.server_opt) inside ModelAverage, through the real loop on a two-client quadratic.

Client i minimises f_i(w) = 1/2 sum_j a_ij (w_j - c_ij)^2 with K steps of plain SGD, so its trained weights are known
exactly; the references below re-derive every server recursion from the papers (Reddi et al., ICLR 2021, arXiv
2003.00295, Alg. 2; Hsu et al. 2019; Wang et al., ICML 2022; Chen et al., NeurIPS 2023) in float64 without calling
fl_lightning.server_opt, and the loop must follow them round by round.
"""
from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn

from fl_lightning.config.args import checked
from fl_lightning.errors import ConfigError
from fl_lightning.server_opt import (AMSGrad, Adam, Lion, Momentum, SGD, Yogi, adam_update, amsgrad_update,
                                     momentum_update)
from fl_lightning.strategies.parts import ModelAverage
from tests.helpers.harness import FakeData, LossModule, build, make_loop, method_config, params_of, QuadVec, quad_loss

D, K, LOCAL_LR, ROUNDS = 4, 3, 0.1, 6
A = torch.tensor([[1.0, 0.5, 2.0, 0.2], [0.3, 1.5, 1.0, 2.5]], dtype=torch.float64)  # curvatures per client
C = torch.tensor([[1.0, -2.0, 0.5, 3.0], [-1.0, 1.0, 2.0, -0.5]], dtype=torch.float64)  # minimisers per client
X0 = torch.tensor([0.3, -0.4, 0.1, 0.2], dtype=torch.float64)
WEIGHTS = [10.0, 11.0]  # FakeData.num_samples (weighting=num_samples: fedavg_server_momentum)
UNIFORM = [1.0, 1.0]    # weighting=uniform: fedadam, fedyogi (Reddi et al. Alg. 2), fedams


def Vec():
    return QuadVec(X0)


def quad_data() -> FakeData:
    return FakeData(lambda c, r, k: {"a": A[c][None].clone(), "c": C[c][None].clone()}, 2)


def local_sgd(x: torch.Tensor, i: int) -> torch.Tensor:
    w = x.clone()
    for _ in range(K):
        w = w - LOCAL_LR * A[i] * (w - C[i])
    return w


def pseudo_gradient(x: torch.Tensor, weights=UNIFORM) -> torch.Tensor:
    """-Delta_t = -(weighted mean of x_i - x); uniform unless ``weights`` are given."""
    delta = sum(weights[i] * (local_sgd(x, i) - x) for i in range(2)) / sum(weights)
    return -delta


def loop_for(method: str, overrides: list[str], tmp_path, rounds: int = ROUNDS):
    cfg = method_config(method, [f"method.lr={LOCAL_LR}", *overrides])
    loop = make_loop(build(cfg), LossModule(Vec(), quad_loss), quad_data(), tmp_path, num_clients=2, per_round=2,
                     rounds=rounds, local_steps=K)
    loop.setup()
    return loop


def follow(loop, reference, rounds: int = ROUNDS):
    """Run the loop round by round and compare x with the reference recursion after every round."""
    x = X0.clone()
    for r in range(rounds):
        loop.run_round(r)
        x = reference(x, r + 1)
        torch.testing.assert_close(loop.global_params["net.w"], x, rtol=1e-12, atol=1e-12, msg=f"round {r + 1}")
    return x


# ---------------------------------------------------------------------------------------- FedAdam / FedYogi (Alg. 2)
@pytest.mark.parametrize("bias_correction", [False, True])
@pytest.mark.parametrize("v0", ["tau2", "zero"])
@pytest.mark.parametrize("method", ["fedadam", "fedyogi"])
def test_adaptive_server_follows_reddi_alg2(tmp_path, method, bias_correction, v0):
    eta, b1, b2, tau = 0.1, 0.9, 0.99, 0.05  # a large tau so that v_-1 = tau^2 matters
    loop = loop_for(method, [f"method.server_lr={eta}", f"method.server_tau={tau}", f"method.server_v0={v0}",
                             f"method.server_bias_correction={str(bias_correction).lower()}"], tmp_path)
    st = {"m": torch.zeros(D, dtype=torch.float64),
          "v": torch.full((D,), tau ** 2 if v0 == "tau2" else 0.0, dtype=torch.float64)}

    def reference(x, t):
        delta = -pseudo_gradient(x)                       # Alg. 2 works with Delta_t = mean(x_i - x)
        st["m"] = b1 * st["m"] + (1 - b1) * delta
        if method == "fedadam":
            st["v"] = b2 * st["v"] + (1 - b2) * delta ** 2
        else:
            st["v"] = st["v"] - (1 - b2) * delta ** 2 * torch.sign(st["v"] - delta ** 2)
        m, v = st["m"], st["v"]
        if bias_correction:
            m, v = m / (1 - b1 ** t), v / (1 - b2 ** t)
        return x + eta * m / (torch.sqrt(v) + tau)

    follow(loop, reference)
    opt = loop.strategy.parts[-1].opt
    torch.testing.assert_close(opt.state["net.w"]["m"], -st["m"], rtol=1e-12, atol=1e-15)  # m of g = -Delta
    torch.testing.assert_close(opt.state["net.w"]["v"], st["v"], rtol=1e-12, atol=1e-15)


def test_yogi_differs_from_adam(tmp_path):
    """The two recursions are not the same method under another name (non-vacuous Yogi test)."""
    a = loop_for("fedadam", ["method.server_lr=0.1"], tmp_path / "a")
    y = loop_for("fedyogi", ["method.server_lr=0.1"], tmp_path / "y")
    for r in range(ROUNDS):
        a.run_round(r)
        y.run_round(r)
    assert not torch.allclose(a.global_params["net.w"], y.global_params["net.w"], rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------------------- FedAMS
@pytest.mark.parametrize("tau_mode", ["max", "add"])
def test_amsgrad_vhat_is_non_decreasing_and_follows_fedams(tmp_path, tau_mode):
    eta, b1, b2, tau = 0.05, 0.9, 0.5, 1e-4  # a short beta2 memory so v falls while v_hat holds
    loop = loop_for("fedams", [f"method.server_lr={eta}", f"method.server_beta2={b2}", f"method.server_tau={tau}",
                               f"method.server_tau_mode={tau_mode}"], tmp_path, rounds=12)
    opt = loop.strategy.parts[-1].opt
    m, v, vh = (torch.zeros(D, dtype=torch.float64) for _ in range(3))
    x = X0.clone()
    held = False
    prev = opt.state["net.w"]["v_hat"].clone()
    for r in range(12):
        g = pseudo_gradient(x)  # FedAMS Alg. 1 averages the sampled deltas uniformly
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g ** 2
        vh = torch.maximum(vh, v)
        if tau_mode == "max":
            vh = torch.clamp(vh, min=tau)
            x = x - eta * m / torch.sqrt(vh)
        else:
            x = x - eta * m / (torch.sqrt(vh) + tau)
        loop.run_round(r)
        now = opt.state["net.w"]["v_hat"]
        assert bool((now >= prev).all()), f"v_hat decreased at round {r + 1}"
        assert bool((now >= opt.state["net.w"]["v"]).all())
        held |= bool((now > opt.state["net.w"]["v"]).any())
        prev = now.clone()
        torch.testing.assert_close(loop.global_params["net.w"], x, rtol=1e-12, atol=1e-12)
    assert held, "v never fell below v_hat: the test did not exercise the max"
    if tau_mode == "max":
        assert bool((prev >= tau).all())


# ---------------------------------------------------------------------------------------- FedAvgM / SGD / Lion
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_matches_heavy_ball(tmp_path, nesterov):
    eta, beta = 0.7, 0.9
    loop = loop_for("fedavg_server_momentum", [f"method.server_lr={eta}", f"method.server_momentum={beta}",
                                f"+method.server_nesterov={str(nesterov).lower()}"], tmp_path)
    buf = {"v": torch.zeros(D, dtype=torch.float64)}

    def reference(x, t):
        g = pseudo_gradient(x, WEIGHTS)  # sample-count weights (fedavg's)
        buf["v"] = beta * buf["v"] + g            # Hsu et al.: v <- beta v + Delta-gradient; x <- x - eta v
        return x - eta * ((g + beta * buf["v"]) if nesterov else buf["v"])

    follow(loop, reference)


def test_server_sgd_is_fedavg_with_server_lr(tmp_path):
    eta = 1.5
    loop = loop_for("fedadam", ["server_opt=sgd", f"method.server_lr={eta}"], tmp_path)
    follow(loop, lambda x, t: x - eta * pseudo_gradient(x))


def test_lion_moves_every_coordinate_by_lr(tmp_path):
    lr, b1, b2 = 0.05, 0.9, 0.99
    loop = loop_for("fedadam", ["server_opt=lion", f"method.server_lr={lr}"], tmp_path)
    st = {"m": torch.zeros(D, dtype=torch.float64)}

    def reference(x, t):
        g = pseudo_gradient(x)
        u = torch.sign(b1 * st["m"] + (1 - b1) * g)
        st["m"] = b2 * st["m"] + (1 - b2) * g
        return x - lr * u

    x = X0.clone()
    for r in range(ROUNDS):
        before = loop.global_params["net.w"].clone()
        loop.run_round(r)
        step = loop.global_params["net.w"] - before
        torch.testing.assert_close(step.abs(), torch.full((D,), lr, dtype=torch.float64), rtol=0, atol=1e-12)
        x = reference(x, r + 1)
        torch.testing.assert_close(loop.global_params["net.w"], x, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------- state and resume
def test_resume_mid_run_is_exact_with_adam_state(tmp_path):
    over = ["method.server_lr=0.1", "method.server_bias_correction=true"]
    full = loop_for("fedadam", over, tmp_path / "full")
    full.run(progress_enabled=False)

    first = loop_for("fedadam", over, tmp_path / "half")
    first.run(stop_after_rounds=ROUNDS // 2, progress_enabled=False)
    state = first.strategy.state_dict()
    pre = "aggregation/server_opt/"
    assert set(state) == {pre + "net.w/m", pre + "net.w/v", pre + "step"}
    assert int(state["aggregation/server_opt/step"]) == ROUNDS // 2

    cfg = method_config("fedadam", [f"method.lr={LOCAL_LR}", *over])
    second = make_loop(build(cfg), LossModule(Vec(), quad_loss), quad_data(), tmp_path / "half2", num_clients=2,
                       per_round=2, rounds=ROUNDS, local_steps=K)
    with torch.no_grad():
        second.module.net.w.add_(1.0)  # other initial weights: everything must come from the checkpoint
    second.setup(resume=str(tmp_path / "half"))
    assert second.strategy.parts[-1].opt.t == ROUNDS // 2
    second.run(progress_enabled=False)
    assert torch.equal(params_of(full)["net.w"], params_of(second)["net.w"])
    a, b = full.strategy.state_dict(), second.strategy.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_server_opt_state_is_loaded_strictly(tmp_path):
    from fl_lightning.checkpoint import load_strict
    from fl_lightning.errors import ResumeError

    loop = loop_for("fedyogi", [], tmp_path)
    loop.run_round(0)
    saved = loop.strategy.state_dict()
    missing = {k: v for k, v in saved.items() if not k.endswith("/v")}
    with pytest.raises(ResumeError, match="lacks key 'aggregation/server_opt/net.w/v'"):
        load_strict(loop.strategy, missing, "strategy")
    with pytest.raises(ResumeError, match="nothing in this run reads"):
        load_strict(loop.strategy, {**saved, "aggregation/server_opt/net.w/x": saved["aggregation/server_opt/net.w/v"]},
                    "strategy")
    plain = loop_for("fedavg", [], tmp_path / "plain")
    with pytest.raises(ResumeError, match="nothing in this run reads"):  # a FedYogi checkpoint is not a FedAvg one
        load_strict(plain.strategy, saved, "strategy")


# ---------------------------------------------------------------------------------------- pure functions vs torch.optim
def _torch_run(opt_cls, kwargs, grads):
    p = nn.Parameter(torch.zeros_like(grads[0]))
    opt = opt_cls([p], **kwargs)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


def _ours(opt_cls, kwargs, grads):
    x = torch.zeros_like(grads[0])
    opt = opt_cls([x], **kwargs)
    for g in grads:
        opt.step({"0": g})
    return x


GRADS = [torch.randn(7, generator=torch.Generator().manual_seed(s), dtype=torch.float64) * (1 + s) for s in range(5)]


def test_adam_with_bias_correction_and_zero_v0_is_torch_adam():
    ours = _ours(Adam, dict(lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3, bias_correction=True, v0="zero"), GRADS)
    ref = _torch_run(torch.optim.Adam, dict(lr=0.1, betas=(0.9, 0.99), eps=1e-3), GRADS)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-14)


def test_amsgrad_add_mode_is_torch_amsgrad():
    ours = _ours(AMSGrad, dict(lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3, bias_correction=True, v0="zero",
                               tau_mode="add"), GRADS)
    ref = _torch_run(torch.optim.Adam, dict(lr=0.1, betas=(0.9, 0.99), eps=1e-3, amsgrad=True), GRADS)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_is_torch_sgd_momentum(nesterov):
    ours = _ours(Momentum, dict(lr=0.1, momentum=0.9, nesterov=nesterov), GRADS)
    ref = _torch_run(torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=nesterov), GRADS)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-14)


def test_update_functions_update_state_in_place():
    g = GRADS[0]
    m, v = torch.zeros_like(g), torch.zeros_like(g)
    u = adam_update(g, m, v, 1, 0.9, 0.99, 1e-3)
    torch.testing.assert_close(m, 0.1 * g)
    torch.testing.assert_close(v, 0.01 * g * g)
    torch.testing.assert_close(u, m / (v.sqrt() + 1e-3))
    buf = torch.zeros_like(g)
    assert momentum_update(g, buf, 0.9) is buf
    vh = torch.full_like(g, 10.0)
    amsgrad_update(g, torch.zeros_like(g), torch.zeros_like(g), vh, 1, 0.9, 0.99, 1e-6)
    assert bool((vh == 10.0).all())


def test_state_is_fp32_for_half_precision_weights():
    x = torch.zeros(3, dtype=torch.bfloat16)
    opt = Yogi({"x": x})
    assert opt.state["x"]["m"].dtype == torch.float32
    opt.step({"x": torch.ones(3)})
    assert x.dtype == torch.bfloat16 and bool((x < 0).all())


# ---------------------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("cls,kwargs,key", [
    (SGD, dict(lr=-1.0), "lr"), (Adam, dict(lr=0.0), "lr"), (Adam, dict(beta1=1.0), "beta1"),
    (Yogi, dict(beta2=1.5), "beta2"), (Adam, dict(tau=-1e-3), "tau"), (Adam, dict(v0="half"), "v0"),
    (Adam, dict(tau=0.0, v0="zero"), "tau"), (AMSGrad, dict(tau_mode="both"), "tau_mode"),
    (Momentum, dict(momentum=1.0), "momentum"), (Lion, dict(beta2=-0.1), "beta2"),
    (Lion, dict(weight_decay=-1.0), "weight_decay"), (Adam, dict(bias_correction="yes"), "bias_correction"),
])
def test_bad_values_name_the_relative_argument(cls, kwargs, key):
    """Ranges are the annotations' (checked with the config, or by ``checked`` in Python); other rules the
    constructor's."""
    with pytest.raises(ConfigError) as err:
        checked(cls, [], **kwargs)
    assert err.value.key == key


def test_model_average_qualifies_the_server_opt_argument():
    with pytest.raises(ConfigError) as err:
        ModelAverage(server_opt=functools.partial(Adam, beta2=1.0))
    assert err.value.key == "server_opt.beta2"
    with pytest.raises(ConfigError) as err:
        checked(ModelAverage, server_lr=0.5, server_opt=functools.partial(SGD, lr=0.5))
    assert err.value.key == "server_lr"
    with pytest.raises(ConfigError) as err:
        ModelAverage(server_opt={"lr": 1.0})
    assert err.value.key == "server_opt"


@pytest.mark.parametrize("override,key", [
    ("method.server_lr=-1", "method.server_lr (via method.parts.aggregation.server_opt.lr)"),
    ("server_opt.beta1=1.0", "server_opt.beta1 (via method.parts.aggregation.server_opt.beta1)"),
    ("method.server_v0=nope", "method.server_v0 (via method.parts.aggregation.server_opt.v0)"),
])
def test_config_errors_name_the_full_key(override, key):
    with pytest.raises(ConfigError) as err:
        build(method_config("fedadam", [override]))
    assert err.value.key == key
    assert "\n" not in str(err.value)


def test_server_opt_acts_on_trainable_params_only(tmp_path):
    loop = loop_for("fedadam", [], tmp_path)
    opt = loop.strategy.parts[-1].opt
    assert list(opt.params) == loop.trainable == ["net.w"]
    assert opt.params["net.w"] is loop.global_params["net.w"]
    assert math.isclose(opt.lr, 0.01)


def test_server_sgd_weight_decay_is_decoupled(tmp_path):
    """x <- x - lr (g + wd x): with g = -mean(u) this is FedSMU's server step (spec 002 Alg. 1 line 16)."""
    eta, wd = 0.7, 0.3
    loop = loop_for("fedadam", ["server_opt=sgd", f"method.server_lr={eta}", f"+method.server_weight_decay={wd}"],
                    tmp_path)
    follow(loop, lambda x, t: x - eta * (pseudo_gradient(x) + wd * x))
