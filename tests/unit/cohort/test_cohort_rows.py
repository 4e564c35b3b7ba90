"""A cohort's per-client scaling (fl_lightning/cohort/rows.py): the per-tensor result bit for bit on the CPU, and a
fixed number of kernels on CUDA whatever the tensor count (counted by torch.profiler)."""
from __future__ import annotations

import pytest
import torch

from types import SimpleNamespace

from fl_lightning.cohort import CohortContext
from fl_lightning.cohort.rows import scale_rows_


def _clip(stacked: dict, max_norm: float) -> None:
    """The cohort's per-client clipping (``CohortContext.clip_grad_norm_``) of ``stacked``'s gradients."""
    CohortContext.clip_grad_norm_(SimpleNamespace(params=stacked), max_norm)

SHAPES = [(3, 4, 5), (3, 7), (3, 2, 3, 3), (3, 1)]


def _tensors(dtype, device="cpu", shapes=SHAPES, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).to(device) for s in shapes]


def _per_tensor(tensors, x, op):
    """The form it replaces: a (K,) factor broadcast over each tensor, one op per tensor."""
    for t in tensors:
        getattr(t, f"{op}_")(x.view(-1, *([1] * (t.dim() - 1))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("op", ["mul", "div"])
def test_scaling_rows_equals_the_per_tensor_form_bit_for_bit(dtype, op):
    x = torch.tensor([0.3, 1.7, -2.1], dtype=dtype)
    a, b = _tensors(dtype), _tensors(dtype)
    scale_rows_(a, x, op)
    _per_tensor(b, x, op)
    assert all(torch.equal(s, t) for s, t in zip(a, b))
    assert not torch.equal(a[0], _tensors(dtype)[0])  # it scaled


def test_tensors_that_cannot_share_a_buffer_are_scaled_one_by_one():
    x = torch.tensor([0.5, 2.0, 3.0])
    a = _tensors(torch.float32) + [torch.randn(5, 3).t()]  # a transposed (3, 5): not contiguous
    b = [t.clone() for t in a]
    scale_rows_(a, x)
    _per_tensor(b, x, "mul")
    assert all(torch.equal(s, t) for s, t in zip(a, b))


def test_per_client_clipping_equals_each_clients_own_clip():
    """Each row's gradient scaled to max_norm where its norm (over all tensors) exceeds it, as clip_grad_norm_
    on that client alone; the clipped rows' norm is max_norm."""
    grads = _tensors(torch.float64)
    grads = [g * torch.tensor([10.0, 0.01, 3.0], dtype=torch.float64).view(-1, *([1] * (g.dim() - 1))) for g in grads]
    stacked = {str(i): torch.zeros_like(g, requires_grad=True) for i, g in enumerate(grads)}
    for t, g in zip(stacked.values(), grads):
        t.grad = g.clone()
    _clip(stacked, 1.0)
    for i in range(3):
        own = [g[i].clone() for g in grads]
        ps = [torch.nn.Parameter(o.clone()) for o in own]
        for p, o in zip(ps, own):
            p.grad = o.clone()
        torch.nn.utils.clip_grad_norm_(ps, 1.0)
        for t, p in zip(stacked.values(), ps):
            torch.testing.assert_close(t.grad[i], p.grad, rtol=1e-12, atol=0)
    norms = torch.linalg.vector_norm(torch.cat([t.grad.reshape(3, -1) for t in stacked.values()], 1), dim=1)
    assert abs(float(norms[0]) - 1.0) < 1e-5 and abs(float(norms[2]) - 1.0) < 1e-5


def _kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_scaling_a_cohorts_rows_is_a_few_kernels_on_cuda():
    """62 tensors (a ResNet-18's count) of 8 clients: the per-tensor form launches a kernel per tensor; the flat form
    three (cat, the scale, the copy back); per-client clipping a handful more for the norms."""
    shapes = [(8, 64, 3, 3)] * 40 + [(8, 64)] * 22
    x = torch.rand(8, device="cuda")
    ts = _tensors(torch.float32, "cuda", shapes)
    scale_rows_(ts, x)  # warm-up (lazy initialisation)
    _per_tensor(ts, x, "mul")
    assert _kernels(lambda: _per_tensor(ts, x, "mul")) >= 62
    assert _kernels(lambda: scale_rows_(ts, x)) <= 3
    stacked = {str(i): torch.zeros_like(t, requires_grad=True) for i, t in enumerate(ts)}
    for t, g in zip(stacked.values(), ts):
        t.grad = g
    _clip(stacked, 1.0)
    assert _kernels(lambda: _clip(stacked, 1.0)) <= 8
