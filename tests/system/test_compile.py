"""``trainer.compile=step``: the local step through ``torch.compile``, compiled once per run and reused by every client.

Each test builds its runs in this process (tests/helpers/cli.build_loop, as ``train.py`` builds them). Most use the
``aot_eager`` backend: Dynamo's capture of the whole step (backward included) and AOT autograd, as with inductor, but
no code generation, which would take minutes per method on a CPU; one test runs the default backend, inductor.
The equality tests keep the lr constant, so the compiled step runs the eager arithmetic (a constant lr stays a float;
under a schedule it is a 0-d tensor, one more rounding, which SOAP's eigenbasis choice can amplify). Muon's
Newton–Schulz runs in the run's precision here (``method.ns_dtype=null``): in bf16 any change of float order, a
compiled graph's or another process count's, grows to ~1e-2 over a few rounds (tests/system/test_multiprocess.py does
the same). The equality tests run in float64 (``F64``), so their bounds hold on any CPU."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.cli import build_loop

pytestmark = pytest.mark.slow

BASE = ["fl.num_clients=6", "fl.clients_per_round=3", "fl.rounds=3", "fl.local_steps=3", "trainer.progress=false",
        "trainer.accelerator=cpu", "trainer.threads=1", "checkpoint.every=100"]
COSINE = ["fl.lr_schedule=cosine"]
# The equality tests run in float64 (F64). In fp32 the compiled and the eager step's float orders moved the model by
# up to 4.8e-5 relative after 3 rounds on an AVX-512/AMX Xeon (< 1e-5 on the AMD EPYC that wrote the tests: it
# depends on the CPU's kernels). In float64, measured under tests/helpers/golden.py's native, aten_default and
# all_avx2 settings: <= 1.5e-15 (0 at a constant lr), so TIGHT; the Muon family 1.5e-7 to 3.7e-6, the same under all
# three settings (a difference of the compiled code, not of the CPU's kernels), so MUON. docs/decisions.md, "Two-path
# comparisons on any CPU", has the figures and the smallest lr change each bound catches.
F64 = ["trainer.precision=64-true"]
TIGHT = 1e-12
MUON = 5e-5


def _bound(method: str) -> float:
    return MUON if method.startswith("fedmuon") else TIGHT
STEP = ["trainer.compile=step", "trainer.compile_backend=aot_eager"]
FP32_NS = {"fedmuon": ["method.ns_dtype=null"], "fedmuon_avg": ["method.ns_dtype=null"]}
METHODS = ["fedavg", "scaffold", "fedprox", "fedmuon", "fedmuon_avg", "fedpac_soap", "fedpac_sophia", "fedsmu",
           "fedlion", "fed_sophia", "adam_biclip"]


def _run(overrides, run_dir, rounds=None, resume=None):
    loop = build_loop(overrides, run_dir, resume=resume)
    summary = loop.run(stop_after_rounds=rounds, progress_enabled=False)
    return {k: v.detach().clone() for k, v in loop.global_params.items()}, summary, loop


def _rel(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)) for k in a)


# SOAP's reference: the compiled run's own code run eagerly (the eager backend: Dynamo's capture, no AOT autograd).
# Under compile its counts live on the device and its branches are planned on the host, and float64 counts give the
# eager bias correction, but the update's multiply-add rounds once more (a tensor scale), and SOAP turns any
# difference into another eigenbasis order of its rank-deficient early factors: a 1e-7 relative change of the lr
# alone moves the model by 0.1 after 3 rounds. The planned steps equal Alg. 3 written out in float64
# (tests/unit/optim/test_soap.py); here the compiled graph must equal that code.
SOAP_REFERENCE = ["trainer.compile=step", "trainer.compile_backend=eager"]


def _reference(method: str, over: list[str]) -> list[str]:
    return over + SOAP_REFERENCE if method.startswith("fedpac_soap") else over


@pytest.mark.parametrize("method", METHODS)
def test_compiled_step_equals_eager_after_three_rounds(method, tmp_path):
    over = [f"method={method}", *BASE, *F64, *FP32_NS.get(method, [])]
    eager, _, _ = _run(_reference(method, over), tmp_path / "eager")
    compiled, summary, loop = _run(over + STEP, tmp_path / "step")
    assert _rel(eager, compiled) <= _bound(method)
    counts = summary["compile"]
    assert counts["compiled_graphs"] >= 1  # it did compile, and the step ran through it
    assert counts["recompiles"] <= 8, counts  # reused by every client: 9 clients' rounds, 27 steps


@pytest.mark.parametrize("method", ["fedavg", "fedmuon"])  # a torch.optim optimizer; this package's Muon + alignment
def test_a_scheduled_lr_is_an_input_of_the_graph_not_a_recompile_per_round(method, tmp_path):
    """Under a cosine schedule every round has another lr: the compiled step takes it as a 0-d tensor (the optimizer's
    groups; FedMuon's alignment step η_r·α), so rounds 3-5 compile nothing new, and the run equals eager up to float
    order (a tensor lr multiplies, then adds). Every method's counts per round: tools/compile_check.py --run."""
    over = [f"method={method}", *BASE, *F64, *COSINE, "fl.rounds=5", *FP32_NS.get(method, [])]
    eager, _, _ = _run(_reference(method, over), tmp_path / "eager")
    loop = build_loop(over + STEP, tmp_path / "step")
    for r in range(2):
        loop.run_round(r)
    early = loop.client_step.counts()
    for r in range(2, 5):
        loop.run_round(r)
    assert early["compiled_graphs"] >= 1 and loop.client_step.counts() == early
    assert _rel(eager, {k: v.detach() for k, v in loop.global_params.items()}) <= _bound(method)


def test_inductor_step_equals_eager(tmp_path):
    """The default backend generates code for the step (C++ on a CPU)."""
    over = ["method=fedavg", *BASE, *F64, "fl.rounds=2"]
    eager, _, _ = _run(over, tmp_path / "eager")
    compiled, summary, _ = _run(over + ["trainer.compile=step"], tmp_path / "step")
    assert _rel(eager, compiled) <= TIGHT
    assert summary["compile"]["compiled_graphs"] >= 1


def test_compiles_stay_bounded_over_clients_rounds_refreshes_and_short_batches(tmp_path):
    """FedSophia refreshes its Hessian estimate every τ=2 steps (a per-step branch) and trains by local epochs over
    clients of unequal size (a short last batch whose size differs between clients): after the first rounds, further
    rounds compile nothing new."""
    over = ["method=fed_sophia", *BASE, *COSINE, "fl.rounds=6", "fl.local_steps=null", "fl.local_epochs=1",
            "data.batch_size=16", "method.parts.hessian.every=2", *STEP]
    loop = build_loop(over, tmp_path)
    for r in range(3):
        loop.run_round(r)
    early = loop.client_step.counts()
    for r in range(3, 6):
        loop.run_round(r)
    assert early["compiled_graphs"] >= 1 and loop.client_step.counts() == early, (early, loop.client_step.counts())
    assert early["recompiles"] <= 12, early  # each a number or size seen changing once, then symbolic


def test_a_compiled_run_resumed_is_bit_identical_to_it_uninterrupted(tmp_path):
    """fed_sophia keeps each client's optimizer state (moments, Hessian estimate, step count) across rounds: the
    resumed run copies it back into the one optimizer object the compiled step was built around."""
    over = ["method=fed_sophia", *BASE, *COSINE, "fl.rounds=4", "checkpoint.every=1", *STEP]
    straight, _, _ = _run(over, tmp_path / "straight")
    _run(over, tmp_path / "halves", rounds=2)
    resumed, summary, _ = _run(over, tmp_path / "halves2", resume=str(tmp_path / "halves"))
    assert summary["rounds_done"] == 4
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


# on both models the optimizers' and the step's own state; on the CNN the causes that lie in a part or in the way
# optimizer state is imported, whatever the model
ONCE = [(m, model) for m in ["fedavg", "scaffold", "fedmuon", "fedpac_sophia", "fedpac_soap"] for model in ("cnn", "vit_tiny")]
ONCE += [("fedavg_adam", "cnn"), ("fedlada", "cnn"), ("adam_biclip", "cnn"), ("fafed", "cnn"), ("fedmuon_avg", "cnn")]
VARIANTS = {"fedpac_sophia": 1, "fedmuon_avg": 1}  # recompiles in round 1: a refresh step; Alg. 1's last step (lr 0)
# the ViT shrunk to two blocks of width 64, two heads: what compiles once is the layout's frame (attention, LayerNorm,
# the 3-D CLS token and positions in Muon's and SOAP's groups), not the width; the five cases take 181 s instead of
# 527 s (seed 004's depth 6, width 192) and the same compile counts. Equality to eager: fedmuon 1.7e-7 (3.4e-7 at full
# size), the others <= 1e-15; an lr change of 1e-3 in the eager run moves FedMuon by 1.7e-2 (0.15 at full size), one of
# 1e-9 the others by >= 1.2e-9, each caught by its bound
MODEL = {"vit_tiny": ["model.net.depth=2", "model.net.embed_dim=64", "model.net.num_heads=2"]}


@pytest.mark.parametrize("method,model", ONCE)
def test_the_step_frame_is_compiled_once_per_run(method, model, tmp_path):
    """Static state: the optimizer's state allocated once per run and zeroed in place for each client, step counters
    as device tensors (Muon's AdamW group, Sophia), the run's step count kept outside the traced frame, the lr a 0-d
    tensor under the cosine schedule, Sophia's refresh every τ steps decided before the step (``before_step``). So
    each frame of the step compiles in round 1 and never again (FedMuon's one frame without a recompile; it compiled
    4 times before, on ``client.step == 0``, an empty state and AdamW's count; FedPAC-Sophia's refresh step is its
    one recompile, and it recompiled in round 2 before; FedPAC-SOAP, whose first step and refreshes are planned on
    the host and run eagerly, one frame and no recompile: 6 compiles before), and the run equals eager up to float
    order (SOAP: its own code run eagerly, see ``SOAP_REFERENCE``). A client's imported optimizer state is written
    into the run's state tensors, not loaded as new ones (``torch.optim.Adam``'s ``step`` is guarded by identity:
    FedAvg-Adam's persistent state, FedLADA's averaged ``step``, a recompile per client from round 2 on before), and
    a part's per-round or per-step numbers are decided in ``before_step`` (BiClip's thresholds, guarded on
    ``client.round`` before; FAFED's 1 − α and η, 0-d tensors under compile: guarded on ``client.step`` and its
    ``t0`` before, 2 recompiles in round 2; FedMuon-avg's Alg. 1 last step, a flag instead of ``client.step ==
    client.num_steps - 1``: 2 recompiles in round 1 before, and more under local epochs, one for each new K)."""
    extra = {"fedpac_sophia": ["method.parts.hessian.every=2"],
             "fedpac_soap": ["method.precondition_frequency=2"]}.get(method, [])
    # not compared with eager (below): the compile counts alone, in fp32 and without the eager run
    compared = method not in ("fedavg_adam", "fedlada") and (method, model) != ("fedpac_sophia", "vit_tiny")
    over = [f"method={method}", f"model={model}", *MODEL.get(model, []), *BASE, *(F64 if compared else []), *COSINE,
            *FP32_NS.get(method, []), *extra]
    loop = build_loop(over + STEP, tmp_path / "step")
    loop.run_round(0)
    first = loop.client_step.counts()
    for r in range(1, 3):
        loop.run_round(r)
    assert first["compiled_graphs"] >= 1 and loop.client_step.counts() == first
    assert first["recompiles"] == VARIANTS.get(method, 0), first  # SOAP: its branching steps eager
    if compared:
        eager, _, _ = _run(_reference(method, over), tmp_path / "eager")
    if method == "fedpac_sophia" and model == "vit_tiny":
        return  # equal on the CNN; on the ViT Sophia's clip(m / max(h, ε), ρ) makes ±ρ sign steps wherever the
        # curvature estimate is ~0, and their signs follow the float order (1.7e-3 relative after 3 rounds in fp32)
    if method in ("fedavg_adam", "fedlada"):
        return  # torch.optim.Adam: its first steps are ±lr wherever |g| ≫ ε, so a gradient within rounding of 0
        # steps by the float order's sign (3.5e-3 and 2.4e-5 relative after 3 rounds in fp32; not this test's point)
    # not the attention's qkv biases: the key third has a zero gradient (softmax ignores a shift), so AdamW steps
    # along its rounding noise, O(lr) whatever the order of the float sums (any two orders differ there by ~0.25)
    keep = [k for k in eager if not k.endswith("qkv.bias")]
    assert _rel({k: eager[k] for k in keep}, {k: loop.global_params[k].detach() for k in keep}) <= _bound(method)


def test_a_sweeps_later_runs_load_the_step_from_the_compile_cache(tmp_path):
    """Two runs one after the other, as a sweep's jobs: inductor's code for the step is generated by the first and
    loaded by the second from the compile cache under ``$FL_CACHE_DIR`` (``inductor/<arch>-<cpu ISA>``, not torch's
    default in /tmp), so a sweep compiles once."""
    import json
    import os
    import platform
    import subprocess
    import sys

    from tests.helpers.cli import ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "HYDRA_FULL_ERROR")}
    env["FL_CACHE_DIR"] = str(tmp_path / "cache")
    counts = []
    for i in range(2):
        run = tmp_path / f"run{i}"
        p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "method=fedavg", *BASE, "fl.rounds=1",
                            "trainer.compile=step", f"hydra.run.dir={run}"], capture_output=True, text=True,
                           timeout=600, cwd=ROOT, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        counts.append(json.loads((run / "summary.json").read_text())["compile"])
    assert counts[0]["generated"] >= 1 and counts[0]["from_cache"] == 0, counts
    assert counts[1]["generated"] == 0 and counts[1]["from_cache"] == counts[0]["generated"], counts
    isa = f"{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}".lower()
    assert (tmp_path / "cache" / "inductor" / isa).is_dir()
