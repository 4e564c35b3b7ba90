"""SCAFFOLD option I (Karimireddy et al. 2020, Alg. 1 line 12, option I): c_i+ = the gradient at the server model x
on a fresh minibatch, taken through ClientContext.extra_gradient from the client's own (seed, client, round) stream."""
from __future__ import annotations

from fl_lightning.config import StepBudget
import torch

from fl_lightning import seeding
from tests.helpers.cli import FAST, build_loop


def test_option1_control_variate_is_gradient_at_server_model(tmp_path):
    loop = build_loop(FAST + ["method=scaffold", "method.control=option1", "fl.rounds=1"], tmp_path)
    x0 = {k: v.clone() for k, v in loop.global_params.items()}
    loop.run_round(0)
    sampled = seeding.sample_clients(loop.seed, 0, loop.n, loop.S)
    # the expected c_i+ : the gradient at x0 on the client's extra batch of round 0
    with torch.no_grad():
        for k, t in loop.local.items():
            t.copy_(x0[k])
    for cid in sampled:
        want = loop.services.gradient(loop.data.extra_batch(cid, 0, loop.device))
        got = loop.store.get(cid)
        for n, g in want.items():
            torch.testing.assert_close(got[f"correction/c_i/{n}"], g, rtol=1e-5, atol=1e-7)
    # server c = (1/n) sum of the sampled clients' c_i (all started at 0)
    from fl_lightning.strategies.parts import ScaffoldCorrection

    corr = next(p for p in loop.strategy.parts if isinstance(p, ScaffoldCorrection))
    for n, c in corr.c.items():
        expect = sum(loop.store.get(cid)[f"correction/c_i/{n}"] for cid in sampled) / loop.n
        torch.testing.assert_close(c, expect, rtol=1e-5, atol=1e-7)


def test_extra_batches_do_not_shift_local_steps(tmp_path):
    """The extra gradient draws from its own stream: the local steps' batches are those of control=mean_grad."""
    a = build_loop(FAST + ["method=scaffold", "method.control=option1", "method.lr=0.0"], tmp_path / "a")
    b = build_loop(FAST + ["method=scaffold", "method.control=mean_grad", "method.lr=0.0"], tmp_path / "b")
    ba = list(a.data.client_batches(2, 1, a.device, StepBudget(steps=3)))
    bb = list(b.data.client_batches(2, 1, b.device, StepBudget(steps=3)))
    assert all(torch.equal(x["y"], y["y"]) for x, y in zip(ba, bb))
    e = a.data.extra_batch(2, 1, a.device)
    assert not all(torch.equal(e["y"], x["y"]) for x in ba) or len(e["y"]) != len(ba[0]["y"])
