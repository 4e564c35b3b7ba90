"""Fed-Sophia (Elbakary et al., arXiv 2406.06655; seed 001's baseline, spec 001 §5.5) through the real FederatedLoop
and conf/method/fed_sophia.yaml, against the algorithm written out here: per client a persistent m and v̂,
    m ← β1 m + (1−β1) g;  every τ-th step v̂ ← β2 v̂ + (1−β2) max(B·ĝ⊙ĝ, 0);  θ ← θ(1 − ηλ) − η clip(m / max(v̂, ε), ρ)
with ĝ the gradient of the loss against targets drawn from the model's own predictive distribution (here a Gaussian
one: ŷ = f(x) + z, the draw z carried in the batch so the reference can repeat it), then the server mean."""
from __future__ import annotations

import torch

from fl_lightning import seeding
from tests.helpers.harness import FakeData, LossModule, MLP, build, make_loop, method_config, mse, params_of, regression_batches

N, S, K, R = 4, 2, 4, 5
LR, B1, B2, RHO, EPS, WD, TAU = 0.02, 0.9, 0.95, 0.5, 1e-12, 0.01, 2


def batches():
    base = regression_batches(N, dtype=torch.float64)

    def batch_fn(c, r, k):
        b = base(c, r, k)
        g = torch.Generator().manual_seed(7919 * (c + 3) + 31 * (r + 5) + k)
        b["z"] = torch.randn(b["y"].shape, generator=g, dtype=torch.float64)
        return b

    return batch_fn


def sampled_loss(net, batch):
    """The GNB surrogate: the loss against targets drawn from the model's predictive distribution N(f(x), I)."""
    out = net(batch["x"])
    return 0.5 * ((out - (out.detach() + batch["z"])) ** 2).sum(-1).mean()


class GNBModule(LossModule):
    def sampled_label_loss(self, batch, generator=None):
        return sampled_loss(self.net, batch)


def _grad(net, loss_fn, batch):
    params = list(net.parameters())
    return [g.detach() for g in torch.autograd.grad(loss_fn(net, batch), params)]


def fed_sophia_reference(batch_fn, K=K, TAU=TAU, counter="client"):
    """``counter``: which step index t refreshes v̂ when t mod τ = 0 — the device's own count of its steps
    (Elbakary et al.'s m_t^(i), v̂_t^(i)), or the global index rK + k."""
    net = MLP(dtype=torch.float64)
    x = [p.detach().clone() for p in net.parameters()]
    state = {}  # client -> (m, h, steps taken): persistent across the client's rounds
    for r in range(R):
        sampled = seeding.sample_clients(0, r, N, S)
        total = [torch.zeros_like(t) for t in x]
        for i in sampled:
            m, h, done = state.get(i, ([torch.zeros_like(t) for t in x], [torch.zeros_like(t) for t in x], 0))
            with torch.no_grad():
                for p, t in zip(net.parameters(), x):
                    p.copy_(t)
            for k in range(K):
                batch = batch_fn(i, r, k)
                g = _grad(net, mse, batch)
                t = done + k + 1 if counter == "client" else r * K + k + 1
                if t % TAU == 0:
                    size = batch["x"].shape[0]
                    gh = _grad(net, sampled_loss, batch)
                    h = [B2 * hh + (1 - B2) * (size * t * t).clamp_min(0) for hh, t in zip(h, gh)]
                m = [B1 * mm + (1 - B1) * gg for mm, gg in zip(m, g)]
                with torch.no_grad():
                    for p, mm, hh in zip(net.parameters(), m, h):
                        d = (mm / hh.clamp_min(EPS)).clamp(-RHO, RHO)
                        p.mul_(1 - LR * WD).sub_(LR * d)
            state[i] = (m, h, done + K)
            for j, p in enumerate(net.parameters()):
                total[j] += p.detach()
        x = [t / len(sampled) for t in total]
    return {f"net.{n}": t for (n, _), t in zip(net.named_parameters(), x)}


def test_fed_sophia_matches_the_algorithm_written_out(tmp_path):
    batch_fn = batches()
    ref = fed_sophia_reference(batch_fn)
    cfg = method_config("fed_sophia", [f"method.lr={LR}", f"method.beta1={B1}", f"method.beta2={B2}",
                                       f"method.rho={RHO}", f"method.weight_decay={WD}", "method.grad_clip=null",
                                       f"method.parts.hessian.every={TAU}"])
    loop = make_loop(build(cfg), GNBModule(MLP(dtype=torch.float64), mse), FakeData(batch_fn, N), tmp_path,
                     num_clients=N, per_round=S, rounds=R, local_steps=K)
    loop.setup()
    loop.run(progress_enabled=False)
    got = params_of(loop)
    start = MLP(dtype=torch.float64).state_dict()
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-10, atol=1e-12)
    assert max((got[n] - start[n[4:]]).abs().max() for n in got) > 1e-2  # it did train
    # a client sampled twice carried its m, v̂: the same run with the state reset each round lands elsewhere
    reset = method_config("fed_sophia", [f"method.lr={LR}", f"method.beta1={B1}", f"method.beta2={B2}",
                                         f"method.rho={RHO}", f"method.weight_decay={WD}", "method.grad_clip=null",
                                         f"method.parts.hessian.every={TAU}", "method.parts.local_optimizer.state=reset"])
    loop2 = make_loop(build(reset), GNBModule(MLP(dtype=torch.float64), mse), FakeData(batch_fn, N),
                      tmp_path / "reset", num_clients=N, per_round=S, rounds=R, local_steps=K)
    loop2.setup()
    loop2.run(progress_enabled=False)
    assert max((params_of(loop2)[n] - ref[n]).abs().max() for n in ref) > 1e-6


def test_fed_sophia_refreshes_on_the_devices_own_step_count(tmp_path):
    """Partial participation with K = 3 not a multiple of τ = 2: the device's own count (the default) and the global
    index rK + k refresh on different steps. The loop follows the first; ``counter=global`` follows the second."""
    k, tau = 3, 2
    batch_fn = batches()
    own, glob = (fed_sophia_reference(batch_fn, K=k, TAU=tau, counter=c) for c in ("client", "global"))
    assert max((own[n] - glob[n]).abs().max() for n in own) > 1e-6  # the two counters really differ here
    base = [f"method.lr={LR}", f"method.beta1={B1}", f"method.beta2={B2}", f"method.rho={RHO}",
            f"method.weight_decay={WD}", "method.grad_clip=null", f"method.parts.hessian.every={tau}"]
    for counter, ref in (("client", own), ("global", glob)):
        overrides = base if counter == "client" else base + [f"method.parts.hessian.counter={counter}"]
        loop = make_loop(build(method_config("fed_sophia", overrides)), GNBModule(MLP(dtype=torch.float64), mse),
                         FakeData(batch_fn, N), tmp_path / counter, num_clients=N, per_round=S, rounds=R, local_steps=k)
        loop.setup()
        loop.run(progress_enabled=False)
        got = params_of(loop)
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], rtol=1e-10, atol=1e-12, msg=f"counter={counter}, {n}")
