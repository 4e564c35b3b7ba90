"""The papers' identities for the Muon-family methods, through the real FederatedLoop, Strategy and parts.

* spec 000 §8 C2 (Thm 1): LocalMuon never moves on seed 000's construction; fedmuon_bc converges there.
* spec 000 §4.1 / C6: fedmuon_bc with lmo -> -G and alpha = 1 is the SCAFFOLD variant with c_i = last gradient.
* spec 000 §4.1 invariants: C_i = M_i at round start, C = mean over all n clients of C_i.
* spec 004 §3.5.4: the alignment term re-applies alpha * avgDelta of the previous round over K steps.
* spec 003: with one client, FedMuon (average x and M every tau steps) is centralized Muon.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from tests.helpers.harness import (FakeData, LossModule, MLP, build, make_loop, method_config, mse, params_of,
                             regression_batches, run)
from fl_lightning import seeding
from fl_lightning.strategies.base import Part
from fl_lightning.strategies.round_state import RoundState, own
from fl_lightning.strategies.parts import LMOControlVariates, OptimizerStateAverage
from tests.helpers.spies import Recorder


# ---------------------------------------------------------------------------------------------------------------
# spec 000 §8 C2: the construction of Theorem 1 (Appendix D)
# ---------------------------------------------------------------------------------------------------------------
class ShiftedQuadratic(nn.Module):
    """f_c(X) = ½||X + a_c I||²_F with X a d×d matrix (d = 1: the scalar case). Client 0: a_0 = 0, client 1: a_1 = a."""

    def __init__(self, d: int, x0: float, dtype=torch.float64):
        super().__init__()
        self.X = nn.Parameter(x0 * torch.eye(d, dtype=dtype))

    def loss(self, batch):
        return 0.5 * ((self.X + batch["shift"] * torch.eye(self.X.shape[0], dtype=self.X.dtype)) ** 2).sum()


def _c2_run(method: str, d: int, rounds: int, tmp_path, overrides=(), a=1.0, tail: int = 0):
    """Run seed 000's construction; return X after ``rounds`` rounds (and, with ``tail``, X after each of ``tail``
    further rounds)."""
    cfg = method_config(method, ["method.scale_mode=none", "method.exclude=[]", *overrides])
    strategy = build(cfg)
    net = ShiftedQuadratic(d, -a / 4)
    module = LossModule(net, lambda n, b: n.loss(b))
    shifts = [0.0, a]
    data = FakeData(lambda c, r, k: {"shift": torch.tensor(shifts[c], dtype=torch.float64)}, 2,
                    test_batch={"shift": torch.tensor(a / 2, dtype=torch.float64)})
    loop = make_loop(strategy, module, data, tmp_path, num_clients=2, per_round=2, rounds=rounds + tail, local_steps=1)
    loop.setup()
    loop.run(stop_after_rounds=rounds, progress_enabled=False)
    X = loop.global_params["net.X"].clone()
    if not tail:
        return X
    trail = []
    for _ in range(tail):
        loop.run(stop_after_rounds=1, progress_enabled=False)
        trail.append(loop.global_params["net.X"].clone())
    return X, torch.stack(trail)


ETA = 2.0 ** -7  # a dyadic stepsize, so x0 ± η and the deltas are exact in binary floating point


@pytest.mark.parametrize("alpha", [0.1, 1.0, 0.05])
def test_localmuon_stalls_exactly_scalar(tmp_path, alpha):
    """Scalar case (d = 1, where the spectral LMO is -sign): x stays bit-exactly at -a/4 (Thm 1), any α."""
    X = _c2_run("local_muon", 1, 60, tmp_path, [f"method.lr={ETA}", f"method.alpha={alpha}"])
    assert X.item() == -0.25  # exactly the start, after 60 rounds


@pytest.mark.parametrize("T", [0, 1, 2, 5])
def test_localmuon_stalls_matrix_any_T(tmp_path, T):
    """Matrix case f_1 = ½||X||², f_2 = ½||X + aI||², X0 = -(a/4)I, spectral LMO by NS with any T: the two
    polar factors are ∓I and cancel, so X never moves (in exact arithmetic; fp64 here: ≤ 1e-12)."""
    X = _c2_run("local_muon", 4, 40, tmp_path, [f"method.lr={ETA}", "method.alpha=0.1", f"method.ns_steps={T}"])
    torch.testing.assert_close(X, -0.25 * torch.eye(4, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("d,T,init", [(1, 5, "zero"), (4, 5, "zero"), (4, 0, "zero"), (4, 2, "grad")])
def test_fedmuon_bc_converges_where_localmuon_stalls(tmp_path, d, T, init):
    """Same construction: fedmuon_bc reaches x* = -(a/2)I to within ~η (spec author: -0.49 after 400 rounds).
    With a constant η an LMO method ends in a limit cycle around x* (amplitude a few η with momentum): over the
    last 20 rounds the mean is within η of x* and every iterate within 4η."""
    eta = 0.01
    _, trail = _c2_run("fedmuon_bc", d, 250, tmp_path, [f"method.lr={eta}", "method.alpha=0.1",
                                                         f"method.ns_steps={T}", f"method.init={init}"], tail=20)
    diag = trail.diagonal(dim1=-2, dim2=-1)  # (rounds, d): X stays a multiple of I
    assert (diag - diag[:, :1]).abs().max() < 1e-12
    x = diag[:, 0]
    assert abs(x.mean().item() + 0.5) <= eta, f"fedmuon_bc's last 20 iterates {x.tolist()} (x* = -0.5)"
    assert (x + 0.5).abs().max().item() <= 4 * eta
    assert (x + 0.25).abs().min().item() > 0.2  # far from x0 = -1/4, where LocalMuon stays


# ---------------------------------------------------------------------------------------------------------------
# spec 000 §4.1 / C6: lmo -> -G, α = 1 gives a SCAFFOLD variant (c_i = last local gradient)
# ---------------------------------------------------------------------------------------------------------------
N, S, K, R, LR = 5, 3, 3, 6, 0.05


def _grads(net, batch):
    net.zero_grad(set_to_none=True)
    mse(net, batch).backward()
    return {n: p.grad.detach().clone() for n, p in net.named_parameters()}


def _scaffold_variant_reference(batch_fn, init: str, seed=0):
    """Hand-written SCAFFOLD with plain SGD, correction on the gradient, c_i⁺ = the last local gradient, server
    c ← c + (1/n)Σ Δc_i and x ← x + (1/n)Σ (y_i - x) (seed 000's (n-S)/n rule)."""
    net = MLP()
    x = {n: p.detach().clone() for n, p in net.named_parameters()}
    zeros = {n: torch.zeros_like(t) for n, t in x.items()}
    if init == "grad":
        ci = [_grads(net, batch_fn(i, -1, 0)) for i in range(N)]
        c = {n: sum(ci[i][n] for i in range(N)) / N for n in x}
    else:
        ci = [dict(zeros) for _ in range(N)]
        c = dict(zeros)
    for r in range(R):
        sdx, sdc = None, None
        for i in seeding.sample_clients(seed, r, N, S):
            with torch.no_grad():
                for n, p in net.named_parameters():
                    p.copy_(x[n])
            corr = {n: c[n] - ci[i][n] for n in x}
            for k in range(K):
                g = _grads(net, batch_fn(i, r, k))
                with torch.no_grad():
                    for n, p in net.named_parameters():
                        p.add_(g[n] + corr[n], alpha=-LR)
            dx = {n: p.detach() - x[n] for n, p in net.named_parameters()}
            dc = {n: g[n] - ci[i][n] for n in x}
            ci[i] = g
            sdx = dx if sdx is None else {n: sdx[n] + dx[n] for n in x}
            sdc = dc if sdc is None else {n: sdc[n] + dc[n] for n in x}
        x = {n: x[n] + sdx[n] / N for n in x}
        c = {n: c[n] + sdc[n] / N for n in x}
    return {f"net.{n}": t for n, t in x.items()}


@pytest.mark.parametrize("init", ["zero", "grad"])
def test_fedmuon_bc_without_lmo_is_scaffold_variant(tmp_path, init):
    batch_fn = regression_batches(N)
    ref = _scaffold_variant_reference(batch_fn, init)
    cfg = method_config("fedmuon_bc", ["method.lmo=neg_identity", "method.alpha=1.0", "method.scale_mode=none",
                                       f"method.lr={LR}", f"method.aux_lr={LR}", f"method.init={init}"])
    loop = run(build(cfg), LossModule(MLP(), mse), FakeData(batch_fn, N), tmp_path / "bc",
               num_clients=N, per_round=S, rounds=R, local_steps=K)
    got = params_of(loop)
    assert got.keys() == ref.keys()
    for n in ref:  # fp32, same operations in a different grouping: equal to a few ulps
        torch.testing.assert_close(got[n], ref[n], rtol=1e-6, atol=1e-6)
    assert max((got[n] - MLP().state_dict()[n[4:]]).abs().max() for n in got) > 1e-2  # it did train

    if init == "zero":  # the SCAFFOLD part with control=last_grad, SGD and the same aggregation agrees too
        cfg = method_config("scaffold", ["method.control=last_grad", f"method.lr={LR}",
                                         "method.parts.aggregation.rule=n_minus_s"])
        loop = run(build(cfg), LossModule(MLP(), mse), FakeData(batch_fn, N), tmp_path / "sc",
                   num_clients=N, per_round=S, rounds=R, local_steps=K)
        for n, t in params_of(loop).items():
            torch.testing.assert_close(t, ref[n], rtol=1e-6, atol=1e-6)


def test_scaffold_mean_grad_equals_option2_with_sgd(tmp_path):
    """Spec 000 §4.4: c_i⁺ = mean of raw gradients equals SCAFFOLD option II for plain SGD."""
    batch_fn = regression_batches(N)
    out = {}
    for control in ("mean_grad", "option2"):
        cfg = method_config("scaffold", [f"method.control={control}", f"method.lr={LR}"])
        loop = run(build(cfg), LossModule(MLP(), mse), FakeData(batch_fn, N), tmp_path / control,
                   num_clients=N, per_round=S, rounds=R, local_steps=K)
        out[control] = params_of(loop)
    for n in out["mean_grad"]:
        torch.testing.assert_close(out["mean_grad"][n], out["option2"][n], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# spec 000 §4.1 invariants with partial participation
# ---------------------------------------------------------------------------------------------------------------
class RoundStartSpy(Recorder):
    """Placed after the correction part: at every client_start, compare the optimizer's momentum with C_i."""

    def __init__(self, cv_name: str):
        self.cv_name, self.checked, self.max_err = cv_name, 0, 0.0

    def client_start(self, client):
        opt = client.optimizer
        for n, p in client.params.items():
            ci = client.state[f"{self.cv_name}/C_i/{n}"]
            self.max_err = max(self.max_err, (opt.momentum_buffer(p) - ci).abs().max().item())
            self.checked += 1


@pytest.mark.parametrize("state", ["persistent", "reset"])
def test_fedmuon_bc_invariants_partial_participation(tmp_path, state):
    n, s = 6, 2
    batch_fn = regression_batches(n)
    cfg = method_config("fedmuon_bc", [f"method.parts.local_optimizer.state={state}", "method.init=grad",
                                       "method.lr=0.02", "method.aux_lr=0.05"])
    strategy = build(cfg)
    cv = next(p for p in strategy.parts if isinstance(p, LMOControlVariates))
    spy = RoundStartSpy(cv.name)
    spy.name = "spy"
    strategy.parts.insert(2, spy)
    loop = run(strategy, LossModule(MLP(), mse), FakeData(batch_fn, n), tmp_path,
               num_clients=n, per_round=s, rounds=7, local_steps=3)
    assert spy.checked == 7 * s * 4 and spy.max_err == 0.0  # C_i == M_i^{(r,0)} exactly, at every round start
    trained = set()
    for r in range(7):
        trained |= set(seeding.sample_clients(0, r, n, s))
    for name, c in cv.C.items():
        ci = torch.stack([loop.store.get(i)[f"{cv.name}/C_i/{name}"] for i in range(n)])
        torch.testing.assert_close(c, ci.mean(0), rtol=1e-5, atol=1e-6)  # C = (1/n) Σ_{i∈[n]} C_i
    if state == "persistent":  # the LocalOptimizer's own copy of M_i equals C_i after the round (Alg. 1 line 11)
        from fl_lightning.optim import muon_param_names

        mu, aux = muon_param_names(loop.module)
        order = mu + aux  # optimizer param order: Muon group, then aux group
        for i in trained:
            st = loop.store.get(i)
            for idx, pname in enumerate(order):
                torch.testing.assert_close(st[f"local_optimizer/{idx}/momentum_buffer"], st[f"{cv.name}/C_i/{pname}"],
                                           rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# spec 004 §3.5.4: the alignment identity
# ---------------------------------------------------------------------------------------------------------------
class AlignmentSpy(Recorder):
    """First in the parts list: measures the alignment term of every step as (params at the next after_backward or
    client_end) - (params right after optimizer.step, before the alignment part ran)."""

    def __init__(self):
        self.x_at_round: dict[int, dict] = {}
        self.totals: list[tuple[int, dict]] = []

    def broadcast(self, r):
        self.x_at_round[r] = {n: t.clone() for n, t in self.server.global_params.items()}
        return {}

    def setup(self, server):
        self.server = server

    @dataclass
    class Round(RoundState):
        spy: dict = own(default_factory=dict)  # the weights after the last optimizer step; the moves since, summed

    def client_start(self, client):
        client.start_state(self, self.Round({"after_opt": None,
                                             "total": {n: torch.zeros_like(p) for n, p in client.params.items()}}))

    def _close(self, client):
        s = client.state_of(self).spy
        if s["after_opt"] is not None:
            for n, p in client.params.items():
                s["total"][n] += p.detach() - s["after_opt"][n]
            s["after_opt"] = None

    def after_backward(self, client):
        self._close(client)

    def after_step(self, client):
        client.state_of(self).spy["after_opt"] = {n: p.detach().clone() for n, p in client.params.items()}

    def client_end(self, client):
        self._close(client)
        self.totals.append((client.round, client.state_of(self).spy["total"]))
        return {}


@pytest.mark.parametrize("alpha", [0.5, 0.25])
def test_fedmuon_alignment_reapplies_alpha_avg_delta(tmp_path, alpha):
    n, s, k, rounds = 4, 2, 4, 4
    batch_fn = regression_batches(n, dtype=torch.float64)  # float64: fp32 used 1/5 of a 1e-4 bound
    cfg = method_config("fedmuon", [f"method.alpha={alpha}", "method.ns_dtype=null", "method.lr=0.03",
                                    "method.aux_lr=0.01"])
    strategy = build(cfg)
    spy = AlignmentSpy()
    spy.name = "spy"
    strategy.parts.insert(0, spy)
    loop = run(strategy, LossModule(MLP(dtype=torch.float64), mse), FakeData(batch_fn, n), tmp_path,
               num_clients=n, per_round=s, rounds=rounds, local_steps=k)
    assert len(spy.totals) == rounds * s
    for r, total in spy.totals:
        for name, t in total.items():
            if r == 0:
                assert t.abs().max() == 0  # Δ_G^0 = 0
            else:
                avg_delta = spy.x_at_round[r][name] - spy.x_at_round[r - 1][name]
                assert avg_delta.abs().max() > 1e-4
                torch.testing.assert_close(t, alpha * avg_delta, rtol=1e-10, atol=1e-12)
    assert loop.round == rounds


# ---------------------------------------------------------------------------------------------------------------
# spec 003: one client == centralized Muon
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("init", ["zero", "grad"])
def test_fedmuon_avg_one_client_is_centralized_muon_standard_order(tmp_path, init):
    from hydra.utils import instantiate

    tau, rounds = 3, 5
    batch_fn = regression_batches(1)
    cfg = method_config("fedmuon_avg", ["method.ns_dtype=null", f"method.init={init}", "method.lr=0.05",
                                        "method.aux_lr=0.01", "method.weight_decay=0.01", "method.order=standard"])
    strategy = build(cfg)
    loop = run(strategy, LossModule(MLP(), mse), FakeData(batch_fn, 1), tmp_path,
               num_clients=1, per_round=1, rounds=rounds, local_steps=tau)

    net = MLP()  # centralized: one Muon optimizer for rounds·tau steps on the same stream
    oc = cfg.method.parts.local_optimizer
    opt = instantiate(oc.optimizer)(instantiate(oc.param_groups)(net))
    if init == "grad":
        g = _grads(net, batch_fn(0, -1, 0))
        opt.set_momentum({p: g[n] for n, p in net.named_parameters() if opt.param_kind(p) != "adamw"})
    for r in range(rounds):
        for k in range(tau):
            opt.zero_grad(set_to_none=True)
            mse(net, batch_fn(0, r, k)).backward()
            opt.step()
    for n, p in net.named_parameters():
        torch.testing.assert_close(loop.global_params[f"net.{n}"], p.detach(), rtol=1e-5, atol=1e-6)
    mom = next(p for p in strategy.parts if isinstance(p, OptimizerStateAverage))
    for n, p in net.named_parameters():
        for sk, v in opt.state[p].items():
            got = mom.Mbar[f"{mom.name}/M/net.{n}/{sk}"]
            want = torch.tensor(float(v), dtype=got.dtype) if not isinstance(v, torch.Tensor) else v
            torch.testing.assert_close(got.to(want.dtype), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("init", ["zero", "grad"])
def test_fedmuon_avg_one_client_is_centralized_alg1(tmp_path, init):
    """Default order=alg1: one client over R rounds of tau steps == seed 003's Alg. 1 written out by hand for R*tau
    iterations: X <- X(1 - lr wd) - lr Orth(M); g <- grad at the new X; M <- (1-beta) M + beta g (matrices), with
    the biases on torch's AdamW after every gradient, and M_0 = the probe gradient (init=grad) or 0."""
    from fl_lightning.optim import orthogonalize

    tau, rounds, lr, wd, beta, aux_lr = 3, 4, 0.05, 0.01, 0.1, 0.01
    batch_fn = regression_batches(1, dtype=torch.float64)  # float64: fp32 used 1/5 of a 1e-5 bound
    cfg = method_config("fedmuon_avg", ["method.ns_dtype=null", f"method.init={init}", f"method.lr={lr}",
                                        f"method.aux_lr={aux_lr}", f"method.weight_decay={wd}", f"method.beta={beta}"])
    loop = run(build(cfg), LossModule(MLP(dtype=torch.float64), mse), FakeData(batch_fn, 1), tmp_path,
               num_clients=1, per_round=1, rounds=rounds, local_steps=tau)

    net = MLP(dtype=torch.float64)
    mats = [p for p in net.parameters() if p.ndim >= 2]
    vecs = [p for p in net.parameters() if p.ndim < 2]
    adamw = torch.optim.AdamW(vecs, lr=aux_lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    if init == "grad":
        g0 = _grads(net, batch_fn(0, -1, 0))
        M = {p: g0[n].clone() for n, p in net.named_parameters() if p.ndim >= 2}
    else:
        M = {p: torch.zeros_like(p) for p in mats}
    for r in range(rounds):
        for k in range(tau):
            with torch.no_grad():
                for p in mats:  # Alg. 1 line 4 (decoupled weight decay as in the experiments)
                    p.mul_(1 - lr * wd).sub_(lr * orthogonalize(M[p], steps=5, coeffs="muon"))
            net.zero_grad(set_to_none=True)
            mse(net, batch_fn(0, r, k)).backward()  # the gradient at the new point
            with torch.no_grad():
                for p in mats:
                    M[p].mul_(1 - beta).add_(p.grad, alpha=beta)  # line 5
            adamw.step()
    for n, p in net.named_parameters():
        torch.testing.assert_close(loop.global_params[f"net.{n}"], p.detach(), rtol=1e-10, atol=1e-12)
    mom = next(p for p in loop.strategy.parts if isinstance(p, OptimizerStateAverage))
    for n, p in net.named_parameters():
        if p.ndim >= 2:
            torch.testing.assert_close(mom.Mbar[f"{mom.name}/M/net.{n}/momentum_buffer"], M[p], rtol=1e-10, atol=1e-12)


def test_fedmuon_avg_alg1_differs_from_standard_order(tmp_path):
    batch_fn = regression_batches(2)
    out = {}
    for order in ("alg1", "standard"):
        cfg = method_config("fedmuon_avg", ["method.ns_dtype=null", f"method.order={order}", "method.lr=0.05"])
        loop = run(build(cfg), LossModule(MLP(), mse), FakeData(batch_fn, 2), tmp_path / order,
                   num_clients=2, per_round=2, rounds=3, local_steps=3)
        out[order] = params_of(loop)
    assert any((out["alg1"][k] - out["standard"][k]).abs().max() > 1e-4 for k in out["alg1"])
