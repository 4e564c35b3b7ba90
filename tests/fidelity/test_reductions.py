"""Reductions: where a paper builds its method on another, the method in its degenerate setting IS the other method.

Each pair runs through the path ``python train.py`` takes (the composed Hydra config, ``fl_lightning.run.build.build``,
the real FederatedLoop on the embedded digits data with its Dirichlet partition), in float64 (``trainer.precision
=64-true``), 6 clients, 3 sampled per round, 3 rounds of 3 local steps, with the MLP; the final global weights must
agree to 1e-12. The other side of each pair is that method's own yaml, not a config built from the same part. Every
pair has a control: a small step away from the degenerate value must break the equality, so the test can fail.

One client, one step per round (the centralized optimizer) is checked against an independent optimizer run on the
same minibatches: lion-pytorch's ``Lion`` for FedSMU (spec 002 §1: "with K = 1 and one client the whole thing is
exactly Lion"), and Muon applied directly for LocalMuon and FedMuon-avg.
"""
from __future__ import annotations

import importlib

from fl_lightning.config import StepBudget
import pytest
import torch

from tests.helpers.cli import build_loop

BASE = ["model=mlp", "trainer.precision=64-true", "trainer.accelerator=cpu", "trainer.progress=false",
        "fl.num_clients=6", "fl.clients_per_round=3", "fl.rounds=3", "fl.local_steps=3", "fl.eval_every=1000",
        "checkpoint.every=1000"]
TOL = 1e-12
_RUNS: dict = {}


def final(method: str, overrides, tmp_path_factory, base=BASE, train=True) -> dict[str, torch.Tensor]:
    """The global weights after a run of ``method=<method>`` with ``overrides`` (cached within the module); with
    ``train=False`` the starting weights."""
    key = (method, tuple(overrides), tuple(base), train)
    if key not in _RUNS:
        loop = build_loop([f"method={method}", *base, *overrides], tmp_path_factory.mktemp(method))
        if train:
            loop.run(progress_enabled=False)
        _RUNS[key] = {k: v.detach().clone() for k, v in loop.global_params.items()}
    return _RUNS[key]


def gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# (method, its degenerate overrides, the method it reduces to, that method's overrides, a perturbed control)
PAIRS = [
    pytest.param("scallion", ["method.randk_frac=1.0", "method.alpha=1.0"], "scaffold", [],
                 ["method.randk_frac=1.0", "method.alpha=0.9"], id="scallion=scaffold"),
    pytest.param("scallion", ["method.randk_frac=1.0"], "scaffold", [],   # the default alpha = k/d = 1 at k = d
                 ["method.randk_frac=0.99"], id="scallion_default_alpha=scaffold"),
    pytest.param("fedef_topk", ["method.topk_frac=1.0", "method.server_lr=0.7"],
                 "fedavg", ["method.parts.aggregation.weighting=uniform", "method.parts.aggregation.server_lr=0.7"],
                 ["method.topk_frac=0.9", "method.server_lr=0.7"], id="fedef_topk=fedavg"),
    pytest.param("fedcams", ["method.parts.aggregation.codec.inner._target_=fl_lightning.codecs.Dense"],
                 "fedams", [],
                 ["method.parts.aggregation.codec.inner._target_=fl_lightning.codecs.TopK",
                  "+method.parts.aggregation.codec.inner.frac=0.9"], id="fedcams=fedams"),
    pytest.param("fedef_hs", ["method.hs_frac=1.0"], "fedef_topk", ["method.topk_frac=1.0"],
                 ["method.hs_frac=0.9"], id="fedef_hs=fedef_topk"),
    pytest.param("fedprox", ["method.mu=0.0"], "fedavg", [], ["method.mu=0.001"], id="fedprox=fedavg"),
    pytest.param("fedavgm", ["method.global_momentum=0.0"], "fedavg", ["method.parts.aggregation.weighting=uniform"],
                 ["method.global_momentum=0.01"], id="fedavgm=fedavg"),
    pytest.param("fedcm", ["method.gamma=0.0"],
                 "fedavg", ["method.parts.aggregation.weighting=uniform", "method.lr=0.1", "method.weight_decay=0.001",
                            "method.grad_clip=10.0"],
                 ["method.gamma=0.01"], id="fedcm=fedavg"),
    # FedPAC with beta = 0 and no alignment is the local optimizer's FedAvg, FedSOA (spec 001 identity I4)
    pytest.param("fedpac_soap", ["method.pac_beta=0.0", "~method.parts.theta"], "local_soap", [],
                 ["method.pac_beta=0.01", "~method.parts.theta"], id="fedpac_soap=local_soap"),
    pytest.param("fedpac_sophia", ["method.pac_beta=0.0", "~method.parts.theta"], "local_sophia", [],
                 ["method.pac_beta=0.01", "~method.parts.theta"], id="fedpac_sophia=local_sophia"),
]


@pytest.mark.parametrize("method,degenerate,other,other_overrides,control", PAIRS)
def test_method_reduces_to_the_method_it_builds_on(method, degenerate, other, other_overrides, control,
                                                   tmp_path_factory):
    want = final(other, other_overrides, tmp_path_factory)
    start = final("fedavg", [], tmp_path_factory, train=False)
    assert gap(want, start) > 1e-3  # the reference trained
    assert gap(final(method, degenerate, tmp_path_factory), want) <= TOL
    assert gap(final(method, control, tmp_path_factory), want) > 1e-9  # the control breaks it


# ------------------------------------------------------------------------------ one client, one step: centralized
ONE = ["model=mlp", "trainer.precision=64-true", "trainer.accelerator=cpu", "trainer.progress=false",
       "data/partition=iid", "fl.num_clients=1", "fl.clients_per_round=1", "fl.rounds=6", "fl.local_steps=1",
       "fl.eval_every=1000", "checkpoint.every=1000"]


def centralized(overrides, tmp_path, make_optimizer):
    """The optimizer run on its own over the minibatches the loop gives its one client, from the same start."""
    loop = build_loop(["method=fedavg", *ONE, *overrides], tmp_path)
    module = loop.module
    opt = make_optimizer(module)
    for r in range(loop.R):
        for batch in loop.data.client_batches(0, r, loop.device, StepBudget(steps=1)):
            opt.zero_grad()
            module.training_step(loop.services.cast_floats(batch), 0).backward()
            opt.step()
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("control", [False, True])
def test_fedsmu_one_client_one_step_is_lion(tmp_path, tmp_path_factory, control):
    """FedSMU with n = 1, K = 1 is Lion (lr gamma1, weight decay gamma2) on the same minibatches."""
    lion_pytorch = importlib.import_module("lion_pytorch")
    g1, g2, b1, b2 = 0.01, 0.5, 0.9, 0.99
    ov = [f"method.gamma1={g1}", f"method.gamma2={g2}", f"method.beta1={b1}", f"method.beta2={b2}"]
    got = final("fedsmu", ov + (["method.beta1=0.91"] if control else []), tmp_path_factory, base=ONE)
    want = centralized([], tmp_path / "ref",
                       lambda m: lion_pytorch.Lion(m.parameters(), lr=g1, betas=(b1, b2), weight_decay=g2))
    if control:
        assert gap(got, want) > 1e-9
    else:
        assert gap(got, want) <= TOL


# FedMuon-avg: Alg. 1's order (step, then the gradient at the new point) and its probe-gradient M_0 are not
# Muon's; with order=standard, M_0 = 0 and Newton-Schulz in the working precision it is Muon step for step.
FEDMUON_AVG = ["method.order=standard", "method.init=zero", "method.ns_dtype=null"]
MUON = [pytest.param("local_muon", [], [], id="local_muon"),
        pytest.param("local_muon", [], ["method.aux_lr=0.11"], id="local_muon-control"),
        pytest.param("fedmuon_avg", FEDMUON_AVG, [], id="fedmuon_avg"),
        pytest.param("fedmuon_avg", FEDMUON_AVG, ["method.init=grad"], id="fedmuon_avg-control")]


@pytest.mark.parametrize("method,overrides,control", MUON)
def test_muon_family_one_client_is_centralized_muon(tmp_path, tmp_path_factory, method, overrides, control):
    """LocalMuon (seed 000) and FedMuon-avg (seed 003) with one client carry its momentum from round to round, so
    R rounds of one step are R steps of Muon (the optimizer the method's yaml picks, applied directly)."""
    from hydra.utils import instantiate

    from tests.helpers.cli import make_cfg

    got = final(method, overrides + control, tmp_path_factory, base=ONE)
    cfg = make_cfg([f"method={method}", *ONE, *overrides], tmp_path)
    groups = cfg.method.parts.local_optimizer.get("param_groups")

    def make(module):
        factory = instantiate(cfg.optimizer)
        params = instantiate(groups)(module) if groups is not None else list(module.parameters())
        return factory(params)

    want = centralized([], tmp_path / "ref", make)
    assert gap(got, want) > 1e-9 if control else gap(got, want) <= TOL
