"""fl_lightning.optim.Muon: agreement with torch.optim.{Muon, SGD, AdamW}, momentum conventions, strategy hooks."""

import copy

import pytest
import torch
from torch import nn

from fl_lightning.optim import Muon, muon_param_names, orthogonalize, split_muon_params, update_scale

SHAPES = [(8, 16), (16, 8), (12, 12)]


def make_params(shapes, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=gen, dtype=dtype)) for s in shapes]


def run(params, opt, steps=5, seed=42, grad_scale=1.0):
    """Feed the same deterministic random gradients to params for `steps` steps; return param copies."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = grad_scale * torch.randn(p.shape, generator=gen, dtype=p.dtype)
        opt.step()
    return [p.detach().clone() for p in params]


def assert_all_close(xs, ys, **kw):
    for x, y in zip(xs, ys):
        torch.testing.assert_close(x, y, **kw)


# --------------------------------------------------------------------------- torch.optim.Muon agreement
TORCH_CASES = [  # (torch adjust_lr_fn, our scale_mode, nesterov, coefficients, ns steps)
    ("original", "spectral", True, "muon", 5),
    ("original", "spectral", False, "muon", 5),
    ("match_rms_adamw", "moonlight", True, "muon", 5),
    ("match_rms_adamw", "moonlight", False, "polar_express", 3),
]


@pytest.mark.parametrize("adjust, scale, nesterov, coeffs, steps", TORCH_CASES)
def test_matches_torch_muon_fp32(monkeypatch, adjust, scale, nesterov, coeffs, steps):
    """torch.optim.Muon always runs NS in bf16 (``grad.bfloat16()``). To compare at fp32 we make that cast an
    fp32 copy for the duration of torch's steps; torch's own kernel then runs in fp32 with its own code."""
    from fl_lightning.optim import NS_COEFFS

    kw = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, ns_steps=steps)
    ref_params = make_params(SHAPES)
    ref = torch.optim.Muon(ref_params, adjust_lr_fn=adjust, ns_coefficients=NS_COEFFS[coeffs], **kw)
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "bfloat16", lambda self: self.float().clone())
        expected = run(ref_params, ref)
    ours_params = make_params(SHAPES)
    ours = Muon(ours_params, momentum_style="ema_beta", scale_mode=scale, ns_coeffs=coeffs, **kw)
    got = run(ours_params, ours)
    assert_all_close(got, expected, rtol=1e-5, atol=1e-5)
    for p, q in zip(ours_params, ref_params):  # same momentum convention, same stored buffer
        torch.testing.assert_close(ours.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"])


def test_matches_torch_muon_bf16():
    """Unpatched torch.optim.Muon (bf16 NS) vs ours with ns_dtype=bfloat16: same op order, so they agree."""
    kw = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True)
    ref_params, ours_params = make_params(SHAPES), make_params(SHAPES)
    expected = run(ref_params, torch.optim.Muon(ref_params, **kw))
    got = run(ours_params, Muon(ours_params, ns_dtype=torch.bfloat16, **kw))
    assert_all_close(got, expected, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- momentum conventions
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_styles_scale_invariant_for_muon_params(nesterov):
    """ema(α), heavy_ball(β = 1-α) and ema_beta(β) give M's that differ by a positive factor (M_ema = α M_hb, also
    for the Nesterov look-ahead), which orthogonalization removes: identical Muon updates for the same lr."""
    alpha = 0.1
    results = []
    for style, mu in [("ema", alpha), ("heavy_ball", 1 - alpha), ("ema_beta", 1 - alpha)]:
        ps = make_params(SHAPES + [(3, 2, 3, 3)])
        opt = Muon(ps, lr=0.01, momentum=mu, momentum_style=style, nesterov=nesterov, ns_coeffs="polar_express")
        results.append(run(ps, opt, steps=6))
        if style == "ema":
            m_ema = [opt.state[p]["momentum_buffer"].clone() for p in ps]
        if style == "heavy_ball":
            m_hb = [opt.state[p]["momentum_buffer"].clone() for p in ps]
    assert_all_close(results[0], results[1], rtol=1e-5, atol=1e-6)
    assert_all_close(results[0], results[2], rtol=1e-5, atol=1e-6)
    assert_all_close(m_ema, [alpha * m for m in m_hb], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
def test_aux_sgd_matches_torch_sgd(nesterov):
    shapes = [(7,), (3,), (5,)]
    ref_params, ours_params = make_params(shapes), make_params(shapes)
    expected = run(ref_params, torch.optim.SGD(ref_params, lr=0.05, momentum=0.9, nesterov=nesterov))
    ours = Muon(ours_params, lr=123.0, aux="sgd", aux_lr=0.05, momentum=0.9, momentum_style="heavy_ball",
                nesterov=nesterov)
    got = run(ours_params, ours)
    assert_all_close(got, expected, rtol=1e-6, atol=1e-7)
    assert all(ours.param_kind(p) == "sgd" for p in ours_params)


def test_aux_sgd_ema_is_one_over_alpha_smaller():
    """Spec 000 A3: for 1-D params the EMA step -η·M is α times the heavy-ball step with the same η."""
    alpha, steps = 0.2, 4
    a_params, b_params = make_params([(6,)]), make_params([(6,)])
    start = a_params[0].detach().clone()
    a = run(a_params, Muon(a_params, lr=0.1, momentum=alpha, momentum_style="ema", nesterov=False), steps)
    b = run(b_params, Muon(b_params, lr=0.1, momentum=1 - alpha, momentum_style="heavy_ball", nesterov=False), steps)
    torch.testing.assert_close(a[0] - start, alpha * (b[0] - start))


def test_aux_adamw_matches_torch_adamw():
    shapes = [(7,), (3,), (4, 5)]  # a 2-D param in an explicit aux group is fine too
    ref_params, ours_params = make_params(shapes), make_params(shapes)
    expected = run(ref_params, torch.optim.AdamW(ref_params, lr=0.01, betas=(0.9, 0.95), eps=1e-10, weight_decay=0.05))
    groups = [{"params": ours_params, "use_muon": False}]
    ours = Muon(groups, lr=1.0, aux="adamw", aux_lr=0.01, aux_betas=(0.9, 0.95), aux_eps=1e-10, aux_weight_decay=0.05)
    got = run(ours_params, ours)
    assert_all_close(got, expected, rtol=1e-6, atol=1e-6)
    assert ours.state[ours_params[0]]["step"] == 5 and "exp_avg" in ours.state[ours_params[0]]


# --------------------------------------------------------------------------- weight decay, scaling, conv
@pytest.mark.parametrize("aux", ["sgd", "adamw"])
def test_weight_decay_is_decoupled(aux):
    lr, wd = 0.05, 0.3
    shapes = [(6, 4), (5,)]
    base, decayed = make_params(shapes), make_params(shapes)
    start = [p.detach().clone() for p in base]
    run(base, Muon(base, lr=lr, aux=aux, weight_decay=0.0), steps=1)
    run(decayed, Muon(decayed, lr=lr, aux=aux, weight_decay=wd), steps=1)
    for x0, xb, xd in zip(start, base, decayed):  # X ← X(1 - lr·wd) + (the wd-free step)
        torch.testing.assert_close(xd, x0 * (1 - lr * wd) + (xb - x0))
    zero = make_params(shapes)
    start = [p.detach().clone() for p in zero]
    opt = Muon(zero, lr=lr, aux=aux, weight_decay=wd)
    for p in zero:
        p.grad = torch.zeros_like(p)
    opt.step()  # zero gradient: only the decay acts (Muon: orthogonalize(0) = 0, no NaN)
    for x0, x in zip(start, zero):
        torch.testing.assert_close(x, x0 * (1 - lr * wd))


@pytest.mark.parametrize("mode", ["spectral", "moonlight", "none"])
def test_update_scale_and_conv(mode):
    w = make_params([(4, 3, 3, 3)])  # conv: rows = 4, cols = 27
    x0 = w[0].detach().clone()
    opt = Muon(w, lr=0.1, scale_mode=mode, nesterov=False, momentum=0.0, momentum_style="heavy_ball")
    g = torch.randn(4, 3, 3, 3)
    w[0].grad = g.clone()
    opt.step()
    expected = x0 - 0.1 * update_scale(mode, 4, 27) * orthogonalize(g.reshape(4, 27)).reshape(g.shape)
    torch.testing.assert_close(w[0].detach(), expected)
    assert update_scale("spectral", 64, 27) == pytest.approx((64 / 27) ** 0.5)
    assert update_scale("moonlight", 64, 27) == pytest.approx(0.2 * 8)
    torch.testing.assert_close(w[0].grad, g)  # p.grad is never modified


def test_svd_method_in_optimizer():
    w = make_params([(5, 9)])
    x0 = w[0].detach().clone()
    opt = Muon(w, lr=1.0, ns_method="svd", scale_mode="none", momentum=0.0, nesterov=False)
    w[0].grad = torch.randn(5, 9)
    opt.step()
    step = x0 - w[0].detach()
    torch.testing.assert_close(step @ step.T, torch.eye(5), atol=1e-5, rtol=0)


def test_ns_steps_zero_is_normalized_momentum():
    beta, lr = 0.5, 0.1
    w = make_params([(6, 10)])
    x0 = w[0].detach().clone()
    opt = Muon(w, lr=lr, ns_steps=0, momentum=beta, momentum_style="heavy_ball", nesterov=False, scale_mode="none")
    gen = torch.Generator().manual_seed(42)
    g1, g2 = torch.randn(6, 10, generator=gen), torch.randn(6, 10, generator=gen)
    run(w, opt, steps=2)
    m1, m2 = g1, beta * g1 + g2
    torch.testing.assert_close(w[0].detach(), x0 - lr * m1 / m1.norm() - lr * m2 / m2.norm())


# --------------------------------------------------------------------------- strategy hooks
def test_momentum_buffer_read_write():
    beta = 0.9
    w = make_params([(4, 6), (4,)])
    opt = Muon(w, lr=0.1, momentum=beta, momentum_style="heavy_ball", nesterov=False)
    assert opt.state[w[0]] == {}  # lazily created
    m0 = [torch.randn(4, 6), torch.randn(4)]
    opt.set_momentum({w[0]: m0[0], w[1]: m0[1]})  # warm start, e.g. the server's M̄
    gen = torch.Generator().manual_seed(42)
    g = [torch.randn(4, 6, generator=gen), torch.randn(4, generator=gen)]
    x0 = [p.detach().clone() for p in w]
    run(w, opt, steps=1)
    for p, m, gi in zip(w, m0, g):
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], beta * m + gi)
    torch.testing.assert_close(w[1].detach(), x0[1] - 0.1 * (beta * m0[1] + g[1]))
    opt.momentum_buffer(w[0]).zero_()  # the live tensor: in-place edits are seen by the next step
    assert torch.all(opt.state[w[0]]["momentum_buffer"] == 0)
    opt.state[w[1]]["momentum_buffer"] = torch.ones(4)  # direct assignment works too
    assert torch.all(opt.momentum_buffer(w[1]) == 1)


def test_set_correction_muon_and_sgd():
    """lmo(M + C) for Muon params, -lr·(M + C) for aux-SGD params; stored momentum and p.grad untouched."""
    alpha, lr = 0.3, 0.1
    kw = dict(lr=lr, momentum=alpha, momentum_style="ema", nesterov=False, ns_coeffs="polar_express",
              scale_mode="moonlight")
    w, ref = make_params([(6, 8), (8,)]), make_params([(6, 8), (8,)])
    opt, opt_ref = Muon(w, **kw), Muon(ref, **kw)
    run(w, opt, steps=2)
    run(ref, opt_ref, steps=2)
    C = {w[0]: torch.randn(6, 8), w[1]: torch.randn(8)}
    opt.set_correction(C)
    x0 = [p.detach().clone() for p in w]
    m_prev = [opt.state[p]["momentum_buffer"].clone() for p in w]
    g = [torch.randn(6, 8), torch.randn(8)]
    for p, gi in zip(w, g):
        p.grad = gi.clone()
    opt.step()
    m = [(1 - alpha) * mp + alpha * gi for mp, gi in zip(m_prev, g)]
    for p, mi in zip(w, m):
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], mi)  # correction never enters M
    torch.testing.assert_close(w[0].grad, g[0])
    upd0 = orthogonalize(m[0] + C[w[0]], coeffs="polar_express") * update_scale("moonlight", 6, 8)
    torch.testing.assert_close(w[0].detach(), x0[0] - lr * upd0)
    torch.testing.assert_close(w[1].detach(), x0[1] - lr * (m[1] + C[w[1]]))
    # clearing restores the plain optimizer (same trajectory as the never-corrected reference from here on)
    opt.set_correction(None)
    for p in ref:
        p.grad = torch.zeros_like(p)
    with torch.no_grad():
        for p, q in zip(ref, w):
            p.copy_(q)
    for q, p in zip(ref, w):
        opt_ref.state[q]["momentum_buffer"] = opt.state[p]["momentum_buffer"].clone()
    assert_all_close(run(w, opt, steps=2, seed=7), run(ref, opt_ref, steps=2, seed=7))
    with pytest.raises(ValueError):
        opt.set_correction({w[0]: torch.zeros(3)})


def test_neg_identity_with_alpha_one_is_scaffold_step():
    """Seed 000 §4.1: lmo → identity, α = 1, correction c - c_i: X ← X - lr·(g - c_i + c), a SCAFFOLD step."""
    lr = 0.05
    w = make_params([(5, 7), (5,), (2, 3, 3, 3)])
    ref = make_params([(5, 7), (5,), (2, 3, 3, 3)])
    opt = Muon(w, lr=lr, momentum=1.0, momentum_style="ema", nesterov=False, lmo="neg_identity", scale_mode="none")
    sgd = torch.optim.SGD(ref, lr=lr)
    corr = [torch.randn(p.shape) for p in w]
    opt.set_correction(dict(zip(w, corr)))
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        for p, q, c in zip(w, ref, corr):
            g = torch.randn(p.shape, generator=gen)
            p.grad, q.grad = g.clone(), g + c
        opt.step()
        sgd.step()
    assert_all_close([p.detach() for p in w], [q.detach() for q in ref])


# --------------------------------------------------------------------------- groups, state, determinism
class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.conv = nn.Conv2d(1, 4, 3)
        self.norm = nn.GroupNorm(2, 4)
        self.fc1 = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)


def test_split_muon_params():
    net = TinyNet()
    muon, aux = muon_param_names(net)  # default: every ndim ≥ 2 param gets Muon
    assert muon == ["emb.weight", "conv.weight", "fc1.weight", "head.weight"]
    assert set(aux) == {"conv.bias", "norm.weight", "norm.bias", "fc1.bias", "head.bias"}
    muon, aux = muon_param_names(net, exclude=("embedding", "first", "classifier"))
    assert muon == ["conv.weight", "fc1.weight"]  # "first" = first ≥2-D param in registration order (emb.weight)
    muon, _ = muon_param_names(net, exclude=("first",))
    assert muon == ["conv.weight", "fc1.weight", "head.weight"]
    muon, aux = muon_param_names(net, exclude=("classifier",))
    assert "head.weight" in aux and "head.weight" not in muon
    groups = split_muon_params(net, exclude=("classifier",), lr=0.5)
    opt = Muon(groups, lr=0.01, aux="adamw")
    assert [g["use_muon"] for g in opt.param_groups] == [True, False]
    assert opt.param_groups[1]["lr"] == 0.5 and opt.param_kind(net.head.weight) == "adamw"
    with pytest.raises(ValueError):
        muon_param_names(net, exclude=("bias",))


def test_plain_param_list_is_split_by_ndim():
    net = TinyNet()
    opt = Muon(net.parameters(), lr=0.02, aux_lr=0.3, aux_momentum=0.5, weight_decay=0.1, aux_weight_decay=0.0)
    muon_g, aux_g = opt.param_groups
    assert muon_g["use_muon"] and all(p.ndim >= 2 for p in muon_g["params"]) and muon_g["lr"] == 0.02
    assert not aux_g["use_muon"] and all(p.ndim < 2 for p in aux_g["params"])
    assert (aux_g["lr"], aux_g["momentum"], aux_g["weight_decay"]) == (0.3, 0.5, 0.0)
    assert Muon(net.parameters(), lr=0.02).param_groups[1]["lr"] == 0.02  # aux_lr=None → same lr
    with pytest.raises(ValueError):
        Muon([{"params": [net.fc1.bias], "use_muon": True}])
    with pytest.raises(ValueError):
        Muon(net.parameters(), momentum_style="adam")
    with pytest.raises(ValueError):
        Muon(net.parameters(), scale_mode="bogus")


@pytest.mark.parametrize("aux", ["sgd", "adamw"])
def test_state_dict_round_trip(aux):
    net = TinyNet()
    params = [net.conv.weight, net.conv.bias, net.fc1.weight, net.fc1.bias, net.norm.weight]
    opt = Muon(params, lr=0.02, aux=aux, weight_decay=0.01, ns_coeffs="polar_express", scale_mode="moonlight")
    run(params, opt, steps=3)
    sd = copy.deepcopy(opt.state_dict())
    net2 = copy.deepcopy(net)
    params2 = [net2.conv.weight, net2.conv.bias, net2.fc1.weight, net2.fc1.bias, net2.norm.weight]
    opt2 = Muon(params2, lr=0.02, aux=aux, weight_decay=0.01, ns_coeffs="polar_express", scale_mode="moonlight")
    opt2.load_state_dict(sd)
    key = "exp_avg" if aux == "adamw" else "momentum_buffer"
    torch.testing.assert_close(opt2.state[params2[1]][key], opt.state[params[1]][key])
    assert_all_close(run(params, opt, steps=2, seed=9), run(params2, opt2, steps=2, seed=9), rtol=0, atol=0)


def test_deterministic_and_trains():
    """Same inputs → bitwise identical; and Muon actually fits a small least-squares matrix problem."""
    torch.manual_seed(0)
    A, B = torch.randn(64, 10), torch.randn(64, 6)
    finals = []
    for _ in range(2):
        W = nn.Parameter(torch.zeros(10, 6))
        b = nn.Parameter(torch.zeros(6))
        opt = Muon([W, b], lr=0.05, aux_lr=0.05, scale_mode="spectral")
        losses = []
        for _ in range(60):  # analytic gradients of the mean squared error (autograd is slow on some CPUs)
            R = A @ W.detach() + b.detach() - B
            W.grad, b.grad = 2 * A.T @ R / R.numel(), 2 * R.sum(0) / R.numel()
            opt.step()
            losses.append((R**2).mean().item())
        finals.append((W.detach().clone(), losses))
    assert torch.equal(finals[0][0], finals[1][0])
    lstsq = torch.linalg.lstsq(torch.cat([A, torch.ones(64, 1)], 1), B).solution
    best = ((torch.cat([A, torch.ones(64, 1)], 1) @ lstsq - B) ** 2).mean().item()
    losses = finals[0][1]
    assert losses[-1] < losses[0] and losses[-1] - best < 0.3 * (losses[0] - best)


def test_same_shape_matrices_are_orthogonalized_as_one_batch_with_the_per_matrix_result(monkeypatch):
    """One Newton–Schulz run per matrix shape and step, not one per matrix; the result is the pure
    ``muon_update`` of each matrix on its own (X ← X(1 - lr·wd) - lr·s·orth(D)) up to float rounding."""
    import fl_lightning.optim.muon_math as muon_module
    from fl_lightning.optim.muon import muon_update

    shapes = [(8, 16), (8, 16), (8, 16), (16, 8), (16, 8), (3, 2, 3, 3), (3, 2, 3, 3), (12, 12)]
    ps, ref = make_params(shapes), [p.detach().clone() for p in make_params(shapes)]
    calls, real = [], muon_module.orthogonalize
    monkeypatch.setattr(muon_module, "orthogonalize", lambda G, **kw: calls.append(tuple(G.shape)) or real(G, **kw))
    got = run(ps, Muon(ps, lr=0.02, momentum=0.9, nesterov=True, weight_decay=0.1), steps=3)
    assert calls[:4] == [(3, 8, 16), (2, 16, 8), (2, 3, 18), (12, 12)] and len(calls) == 12
    bufs, gen = [torch.zeros_like(p) for p in ref], torch.Generator().manual_seed(42)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen) for p in ref]
        for p, g, b in zip(ref, grads, bufs):
            [(o, s)] = muon_update([g], [b], 0.9, nesterov=True)
            p.mul_(1 - 0.02 * 0.1).add_(o, alpha=-0.02 * s)
    assert_all_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tensor_lr", [False, True])
def test_the_multi_tensor_adamw_group_equals_torch_adamw_bit_for_bit(tensor_lr):
    """Muon's AdamW group (``adamw_update_foreach``: all tensors per op) against torch.optim.AdamW's one-tensor
    loop (foreach=False), 4 steps, decoupled weight decay and bias correction: equal bits."""
    from fl_lightning.optim.muon_math import adamw_update_foreach

    g = torch.Generator().manual_seed(0)
    shapes = [(7,), (3, 5), (1,), (4, 2, 3)]
    ours = [torch.randn(s, generator=g) for s in shapes]
    ref = [p.clone().requires_grad_(True) for p in ours]
    opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, foreach=False)
    states = [{} for _ in ours]
    for _ in range(4):
        grads = [torch.randn(s, generator=g) for s in shapes]
        for p, gr in zip(ref, grads):
            p.grad = gr.clone()
        opt.step()
        lr = torch.tensor(1e-2) if tensor_lr else 1e-2
        adamw_update_foreach(ours, grads, states, lr, (0.9, 0.99), 1e-8, 0.1)
    for a, b in zip(ours, ref):
        if tensor_lr:  # a 0-d tensor lr multiplies, then adds (torch's own tensor-lr path differs the same way)
            torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(a, b.detach())
    assert [s["step"] for s in states] == [4] * 4


@pytest.mark.parametrize("style", ["heavy_ball", "ema", "ema_beta"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_the_multi_tensor_momentum_line_equals_the_one_tensor_one(style, nesterov):
    """``momentum_update_foreach`` (Muon's matrices at once) against ``momentum_update`` per tensor (itself torch's
    SGD / Muon arithmetic, bit for bit): equal buffers and directions over 3 steps."""
    from fl_lightning.optim.muon_math import momentum_update, momentum_update_foreach

    g = torch.Generator().manual_seed(1)
    shapes = [(4, 6), (6, 4), (3, 3)]
    one = [torch.zeros(s) for s in shapes]
    many = [torch.zeros(s) for s in shapes]
    for _ in range(3):
        grads = [torch.randn(s, generator=g) for s in shapes]
        d_one = [momentum_update(gr, b, style, 0.9, nesterov).clone() for gr, b in zip(grads, one)]
        d_many = momentum_update_foreach(grads, many, style, 0.9, nesterov)
        assert all(torch.equal(a, b) for a, b in zip(d_one, d_many))
        assert all(torch.equal(a, b) for a, b in zip(one, many))
