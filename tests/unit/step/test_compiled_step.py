"""``trainer.compile``'s pieces that run without compiling: its keys' one-line errors, the one optimizer object reset
in place for each client, and the scaled in-place steps that take a float or a 0-d tensor learning rate (the compiled
runs themselves: tests/system/test_compile.py)."""
from __future__ import annotations

import pytest
import torch

from fl_lightning.optim import Muon
from fl_lightning.optim.scalars import add_scaled_, addcdiv_scaled_, foreach_add_scaled_
from fl_lightning.optim.state import reset_in_place
from tests.helpers.cli import FAST, build_error


@pytest.mark.parametrize("overrides,needle", [
    (["trainer.compile=graphs"], "trainer.compile: graphs replays the step as CUDA graphs, and this run is on cpu"),
    (["trainer.compile=fast"], "trainer.compile:"),
    (["trainer.compile=graphs", "trainer.compile_backend=aot_eager"], "trainer.compile:"),
])
def test_bad_compile_keys_are_one_line(overrides, needle, tmp_path):
    msg = build_error(FAST + overrides, tmp_path)
    assert needle in msg and "fix:" in msg, msg


def _muon(params):
    return Muon(params, lr=0.02, momentum=0.9, nesterov=True, aux="adamw", aux_lr=0.01)


def _steps(opt, params, grads, correction=None):
    if correction is not None:
        opt.set_correction({params[0]: correction})
    for g in grads:
        for p, gp in zip(params, g):
            p.grad = gp.clone()
        opt.step()


def test_an_optimizer_reset_in_place_steps_as_a_fresh_one_bit_for_bit():
    torch.manual_seed(0)
    init = [torch.randn(6, 4), torch.randn(4)]
    grads = [[torch.randn(6, 4), torch.randn(4)] for _ in range(3)]
    used = [torch.nn.Parameter(t.clone()) for t in init]
    opt = _muon(used)
    _steps(opt, used, grads, correction=torch.ones(6, 4))  # state, counters and a correction from a first client
    groups, state = [id(g) for g in opt.param_groups], id(opt.state)
    with torch.no_grad():
        for p, t in zip(used, init):
            p.copy_(t)
    tensors = [id(v) for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
    same = reset_in_place(opt, _muon(used))
    assert same is opt and [id(g) for g in opt.param_groups] == groups and id(opt.state) == state
    assert not opt.corrections  # the first client's correction is gone; its state zeroed in the same tensors
    assert [id(v) for st in opt.state.values() for v in st.values() if torch.is_tensor(v)] == tensors
    assert all(not torch.is_tensor(v) and v == 0 or torch.is_tensor(v) and not v.any()
               for st in opt.state.values() for v in st.values())
    fresh_params = [torch.nn.Parameter(t.clone()) for t in init]
    fresh = _muon(fresh_params)
    _steps(opt, used, grads)
    _steps(fresh, fresh_params, grads)
    for a, b in zip(used, fresh_params):
        assert torch.equal(a, b)


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=True),
    lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, foreach=False),
    lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, dampening=0.1),
    lambda ps: __import__("fl_lightning.optim", fromlist=["Sophia"]).Sophia(ps, lr=1e-2, rho=0.1),
    lambda ps: __import__("fl_lightning.optim", fromlist=["Lion"]).Lion(ps, lr=1e-2),
    lambda ps: __import__("fl_lightning.optim", fromlist=["SOAP"]).SOAP(ps, lr=1e-2),
], ids=["adamw", "adam_amsgrad", "sgd_dampening", "sophia", "lion", "soap"])
def test_every_optimizer_reset_in_place_steps_as_a_fresh_one_bit_for_bit(make):
    """Zeroed in place where a zero state is the fresh one (Adam(W), Sophia, Lion), emptied where it is not (SGD's
    first step copies the gradient, SOAP's initialises its bases): either way the next client's steps equal a fresh
    optimizer's bit for bit."""
    torch.manual_seed(0)
    init = [torch.randn(6, 4), torch.randn(4)]
    grads = [[torch.randn(6, 4), torch.randn(4)] for _ in range(3)]
    used = [torch.nn.Parameter(t.clone()) for t in init]
    opt = make(used)
    for gs in grads:
        for p, g in zip(used, gs):
            p.grad = g.clone()
        opt.step()
    with torch.no_grad():
        for p, t in zip(used, init):
            p.copy_(t)
    reset_in_place(opt, make(used))
    fresh_params = [torch.nn.Parameter(t.clone()) for t in init]
    fresh = make(fresh_params)
    for o, ps in ((opt, used), (fresh, fresh_params)):
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = g.clone()
            o.step()
    for a, b in zip(used, fresh_params):
        assert torch.equal(a, b)


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, amsgrad=True, foreach=True),
    lambda ps: __import__("fl_lightning.optim", fromlist=["Sophia"]).Sophia(ps, lr=1e-2, rho=0.1),
    lambda ps: __import__("fl_lightning.optim", fromlist=["Lion"]).Lion(ps, lr=1e-2),
    _muon,
], ids=["adam", "adamw_amsgrad", "sophia", "lion", "muon"])
def test_an_imported_state_is_written_into_the_allocated_tensors_bit_for_bit(make):
    """A client's stored state (``state: persistent``) imported into the run's optimizer, reset in place for it:
    copied into the tensors already there (a compiled step guards on torch.optim.Adam's ``step`` tensor by its
    identity), with the values and types ``load_state_dict`` gives, so the steps after it are the same bits. An
    adapter's import of one number (FedLADA's averaged ``step``) writes into the step tensor too."""
    from fl_lightning.optim import adapter_for
    from fl_lightning.optim.state import allocate, export_optimizer_state, import_optimizer_state

    torch.manual_seed(0)
    init = [torch.randn(6, 4), torch.randn(4)]
    grads = [[torch.randn(6, 4), torch.randn(4)] for _ in range(3)]

    def stepped(opt, ps, gs):
        for g in gs:
            for p, gp in zip(ps, g):
                p.grad = gp.clone()
            opt.step()

    first = [torch.nn.Parameter(t.clone()) for t in init]
    donor = make(first)
    stepped(donor, first, grads[:2])
    flat = {k: v.clone() for k, v in export_optimizer_state(donor).items()}
    used = [torch.nn.Parameter(t.clone()) for t in init]
    opt = make(used)
    allocate(opt)
    stepped(opt, used, grads[2:])  # another client's steps, then this one's state
    reset_in_place(opt, make(used))
    tensors = [id(v) for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
    import_optimizer_state(opt, flat)
    assert [id(v) for st in opt.state.values() for v in st.values() if torch.is_tensor(v)] == tensors
    loaded_params = [torch.nn.Parameter(t.clone()) for t in init]
    loaded = make(loaded_params)
    loaded.load_state_dict(donor.state_dict())  # what the import did before: new tensors
    with torch.no_grad():
        for p, t in zip(used, init):
            p.copy_(t)
    for p, q in zip(used, loaded_params):
        a, b = opt.state[p], loaded.state[q]
        assert set(a) == set(b)
        for k in a:
            assert type(a[k]) is type(b[k]) and (not torch.is_tensor(a[k]) or a[k].dtype == b[k].dtype), k
            assert torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])), k
    stepped(opt, used, grads)
    stepped(loaded, loaded_params, grads)
    for a, b in zip(used, loaded_params):
        assert torch.equal(a, b)
    if isinstance(opt, torch.optim.Adam):
        step = opt.state[used[0]]["step"]
        adapter_for(opt).import_state(used[0], {"step": torch.tensor(7.0, dtype=torch.float64)})
        assert opt.state[used[0]]["step"] is step and float(step) == 7.0


def test_reset_in_place_refuses_other_parameters():
    a, b = torch.nn.Parameter(torch.zeros(3, 3)), torch.nn.Parameter(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="other parameters"):
        reset_in_place(torch.optim.SGD([a], lr=0.1), torch.optim.SGD([b], lr=0.1))


def test_scaled_steps_take_a_float_exactly_and_a_tensor_closely():
    torch.manual_seed(1)
    p, x, m, d = torch.randn(50), torch.randn(50), torch.randn(50), torch.rand(50) + 0.5
    for a in (-0.037, torch.tensor(-0.037)):
        q = p.clone()
        add_scaled_(q, x, a)
        want = p.clone().add_(x, alpha=-0.037)
        assert torch.equal(q, want) if isinstance(a, float) else torch.allclose(q, want, rtol=1e-6, atol=1e-7)
        q = p.clone()
        addcdiv_scaled_(q, m, d, a)
        want = p.clone().addcdiv_(m, d, value=-0.037)
        assert torch.equal(q, want) if isinstance(a, float) else torch.allclose(q, want, rtol=1e-6, atol=1e-7)
        qs = [p.clone(), x.clone()]
        foreach_add_scaled_(qs, [m, d], a)
        assert torch.allclose(qs[0], p + (-0.037) * m, rtol=1e-6, atol=1e-7)
        assert torch.allclose(qs[1], x + (-0.037) * d, rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["step"])
def test_compiled_step_on_cuda_equals_eager(mode, tmp_path, monkeypatch):
    """On a GPU: the step compiled by inductor gives eager's model up to float order after 2 rounds, and compiles a
    bounded number of graphs (``graphs``: tests/unit/step/test_graphed_step.py). Convolutions in full fp32 on both sides: with
    cuDNN's default TF32 the two sides' different kernels differ by TF32's rounding (7e-4 relative, seen on an H100)."""
    import torch

    from tests.helpers.cli import build_loop

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)

    over = ["method=fedavg", "fl.num_clients=6", "fl.clients_per_round=3", "fl.rounds=2", "fl.local_steps=3",
            "trainer.progress=false", "trainer.accelerator=cuda", "checkpoint.every=100", "trainer.cohort=1"]
    runs = {}
    for m in ("none", mode):
        loop = build_loop(over + [f"trainer.compile={m}"], tmp_path / m)
        summary = loop.run(progress_enabled=False)
        runs[m] = ({k: v.detach().cpu() for k, v in loop.global_params.items()}, summary)
    a, b = runs["none"][0], runs[mode][0]
    assert max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)) for k in a) <= 1e-4
    assert runs[mode][1]["compile"]["recompiles"] <= 8
