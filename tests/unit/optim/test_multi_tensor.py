"""The multi-tensor optimizers against their one-tensor-at-a-time forms: Sophia's foreach step (elementwise: equal
bits) against a hand-written recursion of Alg. 8; SOAP's batched projections and factors against SOAP run one
parameter at a time; Muon's zero-padded Newton–Schulz batch against the per-shape batches and against one matrix at
a time."""
from __future__ import annotations

import pytest
import torch

from fl_lightning.optim import Muon
from fl_lightning.optim.muon_math import orthogonalize_batched, orthogonalize_padded
from fl_lightning.optim.newton_schulz import orthogonalize
from fl_lightning.optim.soap import SOAP
from fl_lightning.optim.sophia import Sophia

SHAPES = [(6, 4), (6, 4), (7,), (2, 3, 4), (4, 6), (6, 4)]


def _params(shapes, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g, dtype=dtype)) for s in shapes]


def _grads(params, step, seed=1):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]


@pytest.mark.parametrize("denominator", ["max", "add"])
def test_sophia_foreach_step_equals_the_one_tensor_recursion_bit_for_bit(denominator):
    """Alg. 8 written out per tensor (m, h, the clipped ratio, decoupled decay), the Hessian line every 2nd step."""
    lr, (b1, b2), rho, gamma, eps, wd = 0.1, (0.9, 0.99), 0.05, 2.0, 1e-12, 0.1
    ours = _params(SHAPES)
    ref = [p.detach().clone() for p in ours]
    m = [torch.zeros_like(p) for p in ref]
    h = [torch.zeros_like(p) for p in ref]
    opt = Sophia(ours, lr=lr, betas=(b1, b2), rho=rho, gamma=gamma, eps=eps, weight_decay=wd, denominator=denominator)
    for t in range(5):
        grads = _grads(ours, t)
        if t % 2 == 0:
            est = _grads(ours, t, seed=7)
            opt.update_hessian({p: e for p, e in zip(ours[:4], est)})
            for i in range(4):
                h[i].mul_(b2).add_(est[i].clamp(min=0), alpha=1 - b2)
        for p, g in zip(ours, grads):
            p.grad = g
        opt.step()
        for i, g in enumerate(grads):
            m[i].lerp_(g, 1 - b1)
            den = (h[i] * gamma).clamp_(min=eps) if denominator == "max" else (h[i] * gamma).add_(eps)
            d = (m[i] / den).clamp_(-rho, rho)
            ref[i].mul_(1 - lr * wd).add_(d, alpha=-lr)
    for p, r in zip(ours, ref):
        assert torch.equal(p.detach(), r)


@pytest.mark.parametrize("first_step", ["init_only", "adam"])
def test_soap_batched_step_equals_soap_one_parameter_at_a_time(first_step):
    """One SOAP over all params (same-shape matrices batched: projections, G Gᵀ, Gᵀ G, the first eigh) against one
    SOAP per param (nothing to batch), 5 steps with a QR refresh every 2: equal up to float rounding."""
    shapes = [(24, 16)] * 3 + [(16, 24), (7,), (2, 3, 4)]
    together = _params(shapes)
    alone = [torch.nn.Parameter(p.detach().clone()) for p in together]
    kw = dict(lr=0.05, precondition_frequency=2, first_step=first_step, weight_decay=0.01)
    opt = SOAP(together, **kw)
    opts = [SOAP([p], **kw) for p in alone]
    for t in range(5):
        for a, b, g in zip(together, alone, _grads(together, t)):
            a.grad, b.grad = g, g.clone()
        opt.step()
        for o in opts:
            o.step()
    for a, b, o in zip(together, alone, opts):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
        for k, v in o.state[b].items():
            if torch.is_tensor(v):
                # eigenvectors are defined up to sign: compare the factors and moments, whose values do not depend on it
                if k.startswith("GG") or k == "exp_avg":
                    torch.testing.assert_close(opt.state[a][k], v, rtol=1e-5, atol=1e-6)
            else:
                assert opt.state[a][k] == v


def test_soap_batches_only_same_shape_matrices():
    from fl_lightning.optim.soap import batch_groups

    xs = [torch.zeros(6, 4), torch.zeros(6, 4), torch.zeros(4, 6), torch.zeros(7), torch.zeros(6, 4)]
    Q = lambda n: torch.eye(n)  # noqa: E731
    Qss = [[Q(6), Q(4)], [Q(6), Q(4)], [Q(4), Q(6)], [None], [Q(6), Q(4)]]
    assert sorted(map(sorted, batch_groups(xs, Qss))) == [[0, 1, 4], [2], [3]]


def _matrices(seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, 1, 12), (1, 5, 12), (12, 1, 2, 2), (18, 6), (6, 6), (24, 6), (6, 24), (24, 6), (3, 6), (2, 3, 7)]
    return [torch.randn(s, generator=g, dtype=dtype) for s in shapes]


def test_padded_newton_schulz_equals_each_matrix_on_its_own():
    """Zero-padding (tall ones transposed, 3-D ones as consecutive matrices, conv kernels as (out, in·kh·kw)) leaves
    each matrix's Newton–Schulz iterate in its corner: equal to the matrix alone up to float64 rounding."""
    ds = _matrices(0)
    padded = orthogonalize_padded(ds, steps=5, coeffs="muon")
    for d, o in zip(ds, padded):
        assert o.shape == d.shape
        torch.testing.assert_close(o, orthogonalize(d, steps=5, coeffs="muon"), rtol=1e-12, atol=1e-12)


def test_padding_stays_exactly_zero_in_bf16():
    """In bf16 the padded block's zeros stay zeros (0·x and sums of zeros are exact), so the corner equals the
    per-shape batch's result bit for bit here."""
    ds = _matrices(1, torch.float32)
    for a, b in zip(orthogonalize_batched(ds, "pad", dtype=torch.bfloat16),
                    orthogonalize_batched(ds, "shape", dtype=torch.bfloat16)):
        assert torch.equal(a, b)


def _muon_run(batching, steps=3):
    params = [torch.nn.Parameter(d.float()) for d in _matrices(2)] + _params([(12,), (6,)])
    opt = Muon(params, lr=0.02, ns_dtype=None, ns_batching=batching, aux="adamw", weight_decay=0.01)
    for t in range(steps):
        for p, g in zip(params, _grads(params, t)):
            p.grad = g
        opt.step()
    return [p.detach() for p in params]


def test_muon_padded_batch_equals_per_shape_batches_after_three_steps():
    """The GPU's one padded batch against the per-shape batches, fp32 Newton–Schulz, 3 steps: ≤ 1e-5 relative."""
    for a, b in zip(_muon_run("pad"), _muon_run("shape")):
        assert ((a - b).norm() / b.norm()).item() <= 1e-5


def test_auto_batching_is_per_shape_on_the_cpu():
    """``auto`` pads only on CUDA: on the CPU a run keeps the per-shape batches (and the recorded digests)."""
    for a, b in zip(_muon_run("auto"), _muon_run("shape")):
        assert torch.equal(a, b)


def test_bad_batching_is_refused():
    with pytest.raises(ValueError, match="ns_batching must be one of"):
        Muon([torch.nn.Parameter(torch.zeros(3, 3))], ns_batching="all")


@pytest.mark.parametrize("tensor_lr", [False, True])
def test_adamw_with_device_step_counters_equals_torch_adamw(tensor_lr):
    """Muon's AdamW group with 0-d tensor step counters (a compiled step's: the bias corrections computed on the
    device) against torch.optim.AdamW, 5 steps: equal up to float rounding."""
    from fl_lightning.optim.muon_math import adamw_update_foreach

    init = _params([(5, 3), (7,)])
    ref = [torch.nn.Parameter(p.detach().clone()) for p in init]
    ours = [p.detach().clone() for p in init]
    opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, foreach=False)
    states = [{"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
              for p in ours]
    lr = torch.tensor(1e-2, dtype=torch.float64) if tensor_lr else 1e-2
    for t in range(5):
        grads = _grads(ours, t)
        for p, g in zip(ref, grads):
            p.grad = g.clone()
        opt.step()
        adamw_update_foreach(ours, grads, states, lr, (0.9, 0.99), 1e-8, 0.1)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-7)
    assert all(float(st["step"]) == 5 for st in states)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_auto_pads_into_one_batch_and_equals_the_per_shape_batches():
    """On CUDA ``auto`` is the one zero-padded batch, equal to the per-shape batches up to rounding in fp32; in bf16
    (where two orders of the sums differ by a few percent: 2.6 % seen on an H200) as close to the float64 result as
    the per-shape batches are. Muon's fp32 steps there, both ways, agree after 3 steps."""
    ds = [d.float().cuda() for d in _matrices(3)]
    exact = orthogonalize_batched([d.double() for d in ds], "shape")
    for a, b in zip(orthogonalize_batched(ds, "auto"), orthogonalize_batched(ds, "shape")):
        assert a.device.type == "cuda" and ((a - b).norm() / b.norm()).item() <= 1e-5
    pad = orthogonalize_batched(ds, "auto", dtype=torch.bfloat16)
    shape = orthogonalize_batched(ds, "shape", dtype=torch.bfloat16)
    for a, b, x in zip(pad, shape, exact):
        err_pad, err_shape = ((a.double() - x).norm() / x.norm()).item(), ((b.double() - x).norm() / x.norm()).item()
        assert err_pad <= max(2 * err_shape, 2e-2), (err_pad, err_shape)
    params = [torch.nn.Parameter(d.clone()) for d in ds]
    twins = [torch.nn.Parameter(d.clone()) for d in ds]
    opts = [Muon(ps, lr=0.02, ns_batching=b) for ps, b in ((params, "auto"), (twins, "shape"))]
    for t in range(3):
        for p, q, g in zip(params, twins, _grads([d.cpu() for d in ds], t)):
            p.grad, q.grad = g.cuda(), g.cuda()
        for o in opts:
            o.step()
    for a, b in zip(params, twins):
        assert ((a - b).norm() / b.norm()).item() <= 1e-4
