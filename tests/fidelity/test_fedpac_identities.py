"""Seed 001 (FedPAC, Liu, Shang, Liu, Liu, An, Liu, "Taming Preconditioner Drift ...") identities of spec 001 §3.4,
through the real FederatedLoop and the conf/method/fedpac_*.yaml compositions, each against a recursion written out
here (never against another config built from the same parts):

* I3: with P = identity (plain SGD, no Θ) FedPAC is FedCM with FedCM's α = 1 − β (hand-written FedCM, cosine lr);
* I4: β = 0 without alignment is Local-X (hand-written FedAvg loop around a fresh SOAP per client and round);
* I1: g_G^{r+1} = β g_G^r + (1 − β) v̂^r, v̂^r the mean of the clients' preconditioned directions;
* I2: x^{r+1} = x^r − η_r K g_G^{r+1} (under a cosine schedule: η_r of the round that produced it, 001/#2);
* alignment round-trips the state: every client starts round r from the mean of round r−1's final Θ (Muon m,
  Sophia h, SOAP L, R with Q = eigh of the mean, never averaged), everything else fresh;
* I6: the share of the aligned Θ^r left in Sophia's h after n curvature updates is β2^n.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from fl_lightning import seeding
from fl_lightning.optim import SOAP
from fl_lightning.optim.soap import eigenbasis
from fl_lightning.schedule import lr_factor
from fl_lightning.strategies.base import Part
from fl_lightning.strategies.round_state import RoundState, own
from fl_lightning.strategies.parts import GlobalAlignment, OptimizerStateAverage
from tests.helpers.harness import (FakeData, LossModule, MLP, build, make_loop, method_config, mse, params_of,
                                   regression_batches, run)
from tests.helpers.spies import Recorder, StateSpy

N, S, K, R = 5, 3, 4, 6


def _insert(strategy, part, name, at):
    part.name = name
    strategy.parts.insert(at if at >= 0 else len(strategy.parts), part)
    return part


def _grads(net, batch):
    net.zero_grad(set_to_none=True)
    mse(net, batch).backward()
    return {n: p.grad.detach().clone() for n, p in net.named_parameters()}


# ---------------------------------------------------------------------------------------------------------------
# I3: P = identity -> FedCM with alpha = 1 - beta
# ---------------------------------------------------------------------------------------------------------------
def _fedcm_reference(batch_fn, lr, beta, wd, schedule):
    """FedCM (Xu et al. 2021; spec 001 §5.3): d = α(g + λx) + (1 − α) g_G with α = 1 − β, x ← x − η_r d over K
    steps; server x ← x + mean Δ, g_G ← −mean Δ / (K η_r); g_G⁰ = 0."""
    alpha = 1.0 - beta
    net = MLP(dtype=torch.float64)
    x = {n: p.detach().clone() for n, p in net.named_parameters()}
    gG = {n: torch.zeros_like(t) for n, t in x.items()}
    for r in range(R):
        eta = lr * lr_factor(r, R, schedule)
        total = {n: torch.zeros_like(t) for n, t in x.items()}
        sampled = seeding.sample_clients(0, r, N, S)
        for i in sampled:
            with torch.no_grad():
                for n, p in net.named_parameters():
                    p.copy_(x[n])
            for k in range(K):
                g = _grads(net, batch_fn(i, r, k))
                with torch.no_grad():
                    for n, p in net.named_parameters():
                        p.sub_(eta * (alpha * (g[n] + wd * p) + (1 - alpha) * gG[n]))
            for n, p in net.named_parameters():
                total[n] += p.detach() - x[n]
        mean = {n: t / len(sampled) for n, t in total.items()}
        gG = {n: -mean[n] / (K * eta) for n in x}
        x = {n: x[n] + mean[n] for n in x}
    return {f"net.{n}": t for n, t in x.items()}


@pytest.mark.parametrize("beta,schedule", [(0.5, "constant"), (0.5, "cosine"), (0.9, "cosine")])
def test_identity_preconditioner_is_fedcm(tmp_path, beta, schedule):
    lr, wd = 0.05, 0.01
    batch_fn = regression_batches(N, dtype=torch.float64)  # float64: fp32 used 1/10 of a 1e-5 bound
    ref = _fedcm_reference(batch_fn, lr, beta, wd, schedule)
    cfg = method_config("fedpac_sophia", ["optimizer=sgd", "method.parts.theta=null", "method.parts.hessian=null",
                                          f"method.lr={lr}", f"method.pac_beta={beta}", f"method.weight_decay={wd}",
                                          "method.grad_clip=null"])
    loop = make_loop(build(cfg), LossModule(MLP(dtype=torch.float64), mse), FakeData(batch_fn, N), tmp_path,
                     num_clients=N, per_round=S, rounds=R, local_steps=K, lr_schedule=schedule)
    loop.setup()
    loop.run(progress_enabled=False)
    got = params_of(loop)
    assert got.keys() == ref.keys()
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-10, atol=1e-12)
    assert max((got[n] - MLP().state_dict()[n[4:]]).abs().max() for n in got) > 1e-2  # it did train


# ---------------------------------------------------------------------------------------------------------------
# I4: beta = 0, no alignment -> Local SOAP
# ---------------------------------------------------------------------------------------------------------------
def _local_soap_reference(batch_fn, lr, schedule):
    """Alg. 1 (FedSOA): every sampled client starts from x^r with a fresh SOAP (Θ ← 0), K steps with clip 10, then
    x^{r+1} = x^r + mean_i Δx_i."""
    net = MLP()
    x = {n: p.detach().clone() for n, p in net.named_parameters()}
    for r in range(R):
        total = {n: torch.zeros_like(t) for n, t in x.items()}
        sampled = seeding.sample_clients(0, r, N, S)
        for i in sampled:
            with torch.no_grad():
                for n, p in net.named_parameters():
                    p.copy_(x[n])
            opt = SOAP(net.parameters(), lr=lr * lr_factor(r, R, schedule), betas=(0.95, 0.95), shampoo_beta=0.95,
                       eps=1e-8, weight_decay=0.01, precondition_frequency=2, first_step="init_only")
            for k in range(K):
                net.zero_grad(set_to_none=True)
                mse(net, batch_fn(i, r, k)).backward()
                torch.nn.utils.clip_grad_norm_(list(net.parameters()), 10.0)
                opt.step()
            for n, p in net.named_parameters():
                total[n] += p.detach() - x[n]
        x = {n: x[n] + total[n] / len(sampled) for n in x}
    return {f"net.{n}": t for n, t in x.items()}


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_beta_zero_without_alignment_is_local_soap(tmp_path, schedule):
    lr = 0.01
    batch_fn = regression_batches(N)
    ref = _local_soap_reference(batch_fn, lr, schedule)
    cfg = method_config("fedpac_soap", ["method.parts.theta=null", "method.pac_beta=0.0", f"method.lr={lr}",
                                        "method.precondition_frequency=2"])
    loop = make_loop(build(cfg), LossModule(MLP(), mse), FakeData(batch_fn, N), tmp_path, num_clients=N,
                     per_round=S, rounds=R, local_steps=K, lr_schedule=schedule)
    loop.setup()
    loop.run(progress_enabled=False)
    got = params_of(loop)
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-5, atol=1e-6)
    assert max((got[n] - MLP().state_dict()[n[4:]]).abs().max() for n in got) > 1e-2  # it did train


# ---------------------------------------------------------------------------------------------------------------
# I1, I2: the global direction
# ---------------------------------------------------------------------------------------------------------------
class DirectionSpy(Recorder):
    """First in the parts list: the optimizer's own displacement of every step (params after ``optimizer.step``
    minus params at ``after_backward``; the correction runs later in ``after_step``), summed per round over clients
    and steps; and x^r at every broadcast."""

    def __init__(self):
        self.x, self.opt_sum, self.clients = {}, {}, {}

    def setup(self, server):
        self.server = server

    def broadcast(self, r):
        self.x[r] = {n: t.detach().clone() for n, t in self.server.global_params.items()}
        return {}

    @dataclass
    class Round(RoundState):
        dspy: dict = own(default_factory=dict)  # the weights before the optimizer's step

    def client_start(self, client):
        client.start_state(self, self.Round())

    def after_backward(self, client):
        client.state_of(self).dspy = {n: p.detach().clone() for n, p in client.params.items()}

    def after_step(self, client):
        before = client.state_of(self).dspy
        acc = self.opt_sum.setdefault(client.round, {n: torch.zeros_like(t, dtype=torch.float64) for n, t in before.items()})
        for n, p in client.params.items():
            acc[n] += (p.detach() - before[n]).double()

    def client_end(self, client):
        self.clients[client.round] = self.clients.get(client.round, 0) + 1
        return {}


class DGSpy(Recorder):
    """Last in the parts list: g_G^r as GlobalAlignment just broadcast it."""

    def __init__(self, strategy):
        self.strategy, self.DG = strategy, {}

    def broadcast(self, r):
        alignment = next(p for p in self.strategy.parts if isinstance(p, GlobalAlignment))
        self.DG[r] = {n: t.clone() for n, t in alignment.DG.items()}
        return {}


@pytest.mark.parametrize("method,schedule", [("fedpac_sophia", "constant"), ("fedpac_sophia", "cosine"),
                                             ("fedpac_soap", "cosine"), ("fedpac_muon", "cosine")])
def test_global_direction_is_an_ema_of_preconditioned_directions(tmp_path, method, schedule):
    """I1: g_G^{r+1} = β g_G^r + (1−β) v̂^r with v̂^r = (1/(SK)) Σ_i Σ_k g̃_i^{r,k}, the optimizer step being
    −η_r(1−β) g̃ (weight decay 0, as §3.4 assumes); I2: x^{r+1} = x^r − η_r K g_G^{r+1}."""
    lr, beta = {"fedpac_sophia": 0.01, "fedpac_soap": 0.01, "fedpac_muon": 0.03}[method], 0.5
    extra = ["method.ns_dtype=null"] if method == "fedpac_muon" else []
    cfg = method_config(method, [f"method.lr={lr}", f"method.pac_beta={beta}", "method.weight_decay=0.0", *extra])
    strategy = build(cfg)
    spy = _insert(strategy, DirectionSpy(), "dspy", 0)
    dg = _insert(strategy, DGSpy(strategy), "dgspy", -1)
    loop = make_loop(strategy, LossModule(MLP(dtype=torch.float64), mse),
                     FakeData(regression_batches(N, dtype=torch.float64), N), tmp_path, num_clients=N, per_round=S,
                     rounds=R + 1, local_steps=K, lr_schedule=schedule)
    loop.setup()
    loop.run(progress_enabled=False)
    for r in range(R):
        eta = lr * lr_factor(r, R + 1, schedule)
        assert spy.clients[r] == S
        for n in dg.DG[r]:
            vhat = -spy.opt_sum[r][n] / (S * K * eta * (1 - beta))
            torch.testing.assert_close(dg.DG[r + 1][n], beta * dg.DG[r][n] + (1 - beta) * vhat, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(spy.x[r + 1][n], spy.x[r][n] - eta * K * dg.DG[r + 1][n], rtol=1e-12, atol=1e-14)
    assert max(t.abs().max() for t in dg.DG[R].values()) > 1e-3


# ---------------------------------------------------------------------------------------------------------------
# alignment round-trips the state
# ---------------------------------------------------------------------------------------------------------------
THETA = {"fedpac_soap": ("GG0", "GG1"), "fedpac_sophia": ("hessian",), "fedpac_muon": ("momentum_buffer",)}


@pytest.mark.parametrize("method", sorted(THETA))
def test_clients_start_from_the_mean_theta_and_a_fresh_rest(tmp_path, method):
    extra = {"fedpac_soap": ["method.lr=0.01", "method.precondition_frequency=2"],
             "fedpac_sophia": ["method.lr=0.01", "method.parts.hessian.every=2"],
             "fedpac_muon": ["method.ns_dtype=null"]}[method]
    strategy = build(method_config(method, extra))
    at = next(i for i, p in enumerate(strategy.parts) if isinstance(p, OptimizerStateAverage)) + 1
    spy = _insert(strategy, StateSpy(), "spy", at)
    rounds = 3
    run(strategy, LossModule(MLP(), mse), FakeData(regression_batches(N), N), tmp_path, num_clients=N, per_round=S,
        rounds=rounds, local_steps=K)
    assert all(m == {} or all(v.abs().max() == 0 for v in m.values() if v.ndim) for _, _, s in spy.starts[:S]
               for m in s.values())  # round 0: nothing to align to
    checked = 0
    for r in range(1, rounds):
        starts = [m for rr, _, m in spy.starts if rr == r]
        ends = [m for rr, _, m in spy.ends if rr == r - 1]
        assert len(starts) == len(ends) == S
        for name in starts[0]:
            theta = [e for e in THETA[method] if e in ends[0][name]]
            for e in theta:
                mean = torch.stack([m[name][e] for m in ends]).mean(0)
                assert mean.abs().max() > 0
                for m in starts:
                    torch.testing.assert_close(m[name][e], mean, rtol=1e-6, atol=1e-9)
                    checked += 1
            for m in starts:
                for e, v in m[name].items():
                    if e in theta:
                        continue
                    if method == "fedpac_soap" and e.startswith("Q"):  # Q = eigh of the aligned factor, not averaged
                        assert torch.equal(v, eigenbasis(m[name]["GG" + e[1:]]))
                    else:  # M, V, m, step: fresh
                        assert v.abs().max() == 0, (name, e)
                if not theta:  # SOAP's biases, Muon's aux-AdamW params: nothing travels, a fresh state (none yet,
                    # or the zeros and step 0 the kept optimizer was reset to in place)
                    assert all(float(v.abs().max()) == 0 for v in m[name].values())
    assert checked


# ---------------------------------------------------------------------------------------------------------------
# I6: warm-start share
# ---------------------------------------------------------------------------------------------------------------
def test_sophia_warm_start_share_is_beta2_to_the_n(tmp_path):
    """On a linear least-squares model the Hessian is constant, so Hutchinson's ĥ does not depend on where the
    weights are: two runs whose aligned h^r differ by δ end the round with h differing by β2^n δ, n the number of
    curvature updates in the round (K / f_h)."""
    beta2, every, k = 0.9, 2, 6
    ends = []
    for delta in (0.0, 0.5):
        strategy = build(method_config("fedpac_sophia", ["method.lr=0.01", f"method.beta2={beta2}",
                                                         f"method.parts.hessian.every={every}"]))
        at = next(i for i, p in enumerate(strategy.parts) if isinstance(p, OptimizerStateAverage)) + 1
        spy = _insert(strategy, StateSpy(), "spy", at)
        torch.manual_seed(0)
        loop = make_loop(strategy, LossModule(nn.Linear(4, 3), mse), FakeData(regression_batches(N), N),
                         tmp_path / str(delta), num_clients=N, per_round=S, rounds=2, local_steps=k)
        loop.setup()
        loop.run(stop_after_rounds=1, progress_enabled=False)
        avg = next(p for p in strategy.parts if isinstance(p, OptimizerStateAverage))
        for key in avg.Mbar:
            avg.Mbar[key] = avg.Mbar[key] + delta
        loop.run(progress_enabled=False)
        ends.append({cid: m for rr, cid, m in spy.ends if rr == 1})
    share = beta2 ** (k // every)
    for cid in ends[0]:
        for name in ends[0][cid]:
            diff = ends[1][cid][name]["hessian"] - ends[0][cid][name]["hessian"]
            torch.testing.assert_close(diff, torch.full_like(diff, 0.5 * share), rtol=1e-5, atol=1e-6)
