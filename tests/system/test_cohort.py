"""trainer.cohort=K (fl_lightning/cohort/): a round's clients trained K at a time in one batched step equal the
sequential loop's clients, which the method tests check against their papers. The sequential run is the
independent computation here: another code path (one client's module and optimizer at a time) for the same
equations."""
from __future__ import annotations

import os

import pytest
import torch

from tests.helpers.cli import CONF, build_error, build_loop, cli_in_process, make_cfg, saved_model

# The fast subset (-m "not slow") keeps one cheap case of each feature (a cohort equal to the sequential clients in
# float64 and in fp32, finished clients' rows, phantom rows of a remainder cohort, dropout, a resumed run, a compiled
# cohort); the other methods' cases of the same feature are marked slow and run with the whole suite.
slow = pytest.mark.slow


def fast_first(*cases, fast=1):
    """Parametrize values: the first ``fast`` cases as they are, the rest marked slow (the test ids unchanged)."""
    return [c if i < fast else pytest.param(*(c if isinstance(c, tuple) else (c,)), marks=slow)
            for i, c in enumerate(cases)]

# the methods that run batched, with the keys that make their Newton-Schulz exact in float64 (the automatic bf16 of
# a CPU with native bf16 rounds differently in a batch of another size)
NS64 = ["method.ns_dtype=null"]
# the fp32 comparisons' bound: a cohort against the sequential clients moved the model by <= 1.6e-6 relative (FedMuon;
# under tests/helpers/golden.py's native, aten_default and all_avx2 settings on an AVX-512/AMX Xeon), and the compiled
# step against eager by up to 4.8e-5 on that CPU (tests/system/test_compile.py in fp32): ten times the larger
FP32 = 5e-4
BATCHED = {"fedavg": [], "scaffold": [], "fedpac_sophia": [], "fedmuon": NS64, "fedmuon_avg": NS64}
# unequal clients (Dirichlet sizes under local epochs: unequal step counts and a short last batch), a schedule,
# and 5 clients a round in cohorts of 4 (K does not divide the round)
SETTING = ["fl.rounds=3", "fl.num_clients=10", "fl.clients_per_round=5", "fl.local_steps=null", "fl.local_epochs=1",
           "data.partition.alpha=0.3", "fl.lr_schedule=cosine"]


def _run(overrides, tmp_path, name, rounds=3):
    loop = build_loop(overrides, tmp_path / name)
    losses = [loop.run_round(r)["train_loss"] for r in range(rounds)]
    return {k: v.detach().clone() for k, v in loop.global_params.items()}, losses, loop


def _rel(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-30)) for k in a)


@pytest.mark.parametrize("method", fast_first("scaffold", *sorted(set(BATCHED) - {"scaffold"})))
def test_a_cohort_equals_the_sequential_clients_in_float64(method, tmp_path):
    ov = [f"method={method}", "trainer.precision=64-true", *SETTING, *BATCHED[method]]
    seq, seq_loss, loop = _run(ov, tmp_path, "seq")
    steps = {loop.data.steps_per_round(c, loop.budget) for c in range(loop.n)}
    assert len(steps) > 1  # the clients take different numbers of steps: finished clients are frozen
    assert any(loop.data.num_samples(c) % loop.data.batch_size for c in range(loop.n))  # a short last batch
    coh, coh_loss, cloop = _run(ov + ["trainer.cohort=4"], tmp_path, "cohort")
    assert cloop.cohort is not None and cloop.cohort.size == 4
    assert _rel(seq, coh) <= 1e-12
    assert seq_loss == pytest.approx(coh_loss, rel=1e-12)


METHODS = sorted(f[:-5] for f in os.listdir(os.path.join(CONF, "method")) if f.endswith(".yaml"))
# SOAP's factors wider than a gradient's rank have a zero eigenspace whose basis eigh picks arbitrarily, so a 1e-17
# change of a gradient (another kernel's rounding) moves SOAP's update by O(1) in float64: the sequential run is that
# sensitive to itself. With factors of dimensions <= 5 (full rank here) and a refresh every 2 steps it is
# well-conditioned, and the cohort (each client's own SOAP on its rows) is held to the same bound as the others
SOAP_CONDITIONED = ["optimizer.max_precond_dim=5", "optimizer.precondition_frequency=2"]


@slow  # the core methods' cases: test_a_cohort_equals_the_sequential_clients_in_float64
@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_batched_exactly(method, tmp_path):
    """All of the package's methods: a cohort equals the sequential clients (float64, unequal clients, a schedule,
    K not dividing the round: within 1e-10; the Adam-family methods' second-moment square roots amplify the last
    bits, the core methods stay within 1e-12: test_a_cohort_equals_the_sequential_clients_in_float64)."""
    ov = [f"method={method}", "trainer.precision=64-true", *SETTING[1:], "fl.rounds=2", "fl.num_clients=8"]
    if "ns_dtype" in make_cfg(ov, tmp_path / "cfg").method:
        ov.append("method.ns_dtype=null")
    if "soap" in method:
        ov += SOAP_CONDITIONED
    seq, _, _ = _run(ov, tmp_path, "seq", rounds=2)
    coh, _, _ = _run(ov + ["trainer.cohort=3"], tmp_path, "cohort", rounds=2)
    assert _rel(seq, coh) <= 1e-10


@pytest.mark.parametrize("method,extra", fast_first(("fedavg", []), ("scaffold", []),
                                                    ("fedmuon", ["method.ns_dtype=float32"]), fast=2))
def test_a_cohort_equals_the_sequential_clients_in_float32(method, extra, tmp_path):
    ov = [f"method={method}", *SETTING, *extra]
    seq, _, _ = _run(ov, tmp_path, "seq")
    coh, _, _ = _run(ov + ["trainer.cohort=3"], tmp_path, "cohort")
    assert _rel(seq, coh) <= FP32
    assert _rel(seq, coh) > 0 or method == "fedavg"  # the batched kernels round differently: another code path


def test_per_client_clipping_and_fixed_steps(tmp_path):
    """method.grad_clip clips each client's own gradient norm; a client smaller than the batch takes smaller batches
    under fl.local_steps (padded in the cohort)."""
    ov = ["method=fedavg", "method.grad_clip=0.05", "trainer.precision=64-true", "fl.rounds=2", "fl.num_clients=60",
          "fl.clients_per_round=6", "fl.local_steps=3"]
    seq, _, loop = _run(ov, tmp_path, "seq", rounds=2)
    assert min(loop.data.num_samples(c) for c in range(loop.n)) < loop.data.batch_size
    coh, _, _ = _run(ov + ["trainer.cohort=6"], tmp_path, "cohort", rounds=2)
    assert _rel(seq, coh) <= 1e-12


@pytest.mark.parametrize("overrides,why", [
    (["method=fedavg_adam", "+optimizer.amsgrad=true"], "state=persistent with Adam's per-client counter 'step'"),
    (["method=local_soap"], "SOAP has no batched form"),
])
def test_an_optimizer_without_a_batched_form_steps_each_clients_rows_with_its_own(overrides, why, tmp_path, caplog):
    """SOAP (per-client eigenbases at per-client counts), and a persistent Adam with AMSGrad: each client's own
    optimizer on its rows (the step's forward, backward and parts stay batched), said in one line."""
    import logging

    with caplog.at_level(logging.INFO, logger="fl_lightning"):
        loop = build_loop(overrides + ["trainer.cohort=4"], tmp_path)
    assert loop.cohort.per_client
    lines = [r.getMessage() for r in caplog.records if "own optimizer" in r.getMessage()]
    assert len(lines) == 1 and why in lines[0] and "\n" not in lines[0]


def test_a_model_without_sampled_labels_is_one_line_for_gnb(tmp_path):
    """Sophia's Gauss-Newton-Bartlett estimate in a cohort draws each client's labels from its own outputs: a model
    that does not give both apart is refused at build, naming the part."""
    from fl_lightning.cohort import check_cohort
    from fl_lightning.errors import ConfigError

    loop = build_loop(["method=fed_sophia"], tmp_path)

    class Losses(torch.nn.Module):
        def sample_losses(self, batch):
            return batch["x"].sum(1)

    with pytest.raises(ConfigError, match="part 'hessian' \\(SophiaHessian\\): estimator=gnb needs the model's outputs"):
        check_cohort(loop.strategy, Losses(), 4)
    check_cohort(loop.strategy, loop.module, 4)


@pytest.mark.parametrize("method", fast_first("fedavg_adam", "fed_sophia"))
def test_persistent_optimizer_state_keeps_each_clients_own_counts(method, tmp_path):
    """Clients that keep their Adam or Sophia state across rounds have trained different numbers of steps (sampled
    in different rounds, Dirichlet sizes under local epochs): a cohort holds each one's step count per client
    (RowAdam's bias corrections per row), so it equals the sequential run, and each client's stored counter is its
    own."""
    ov = [f"method={method}", "trainer.precision=64-true", *SETTING[1:], "fl.rounds=4", "fl.num_clients=8"]
    seq, seq_loss, loop = _run(ov, tmp_path, "seq", rounds=4)
    coh, coh_loss, cloop = _run(ov + ["trainer.cohort=3"], tmp_path, "cohort", rounds=4)
    assert _rel(seq, coh) <= 1e-10 and seq_loss == pytest.approx(coh_loss, rel=1e-10)
    counts = lambda lp: {c: {k: float(v) for k, v in lp.store.checkout(c).items() if k.endswith(("/step", "/step#py"))}
                         for c in range(lp.n)}  # noqa: E731
    seq_counts, coh_counts = counts(loop), counts(cloop)
    assert seq_counts == coh_counts
    assert len({tuple(sorted(v.values())) for v in seq_counts.values() if v}) > 1  # the clients' counts differ


@pytest.mark.parametrize("method,tol", fast_first(("scaffold", 1e-12), ("fedavg_adam", 1e-10), ("local_soap", None)))
def test_a_resumed_cohort_run_is_bit_identical_and_checkpoints_cross_over(method, tol, tmp_path):
    """A cohort run stopped and resumed equals the same run uninterrupted, bit for bit; a sequential run's checkpoint
    resumes under a cohort (and the other way round): the checkpoint is the same either way. Also with each client's
    Adam state kept across rounds (RowAdam's per-client counts go back to the clients' stored states) and with SOAP
    stepped client by client (its crossings not compared: SOAP's own conditioning, see SOAP_CONDITIONED)."""
    base = [f"method={method}", "fl.rounds=4", "fl.num_clients=10", "fl.clients_per_round=5", "fl.local_steps=3",
            "trainer.precision=64-true", "trainer.progress=false"]
    whole = tmp_path / "whole"
    assert cli_in_process(base + ["trainer.cohort=4"], whole)[0] == 0
    crossings = (("trainer.cohort=1", "trainer.cohort=4", "seq_then_cohort"),
                 ("trainer.cohort=4", "trainer.cohort=1", "cohort_then_seq")) if tol else ()
    for first, then, name in (("trainer.cohort=4", "trainer.cohort=4", "same"), *crossings):
        d = tmp_path / name
        code, err = cli_in_process(base + [first, "stop_after_rounds=2"], d)
        assert code == 0, err
        code, err = cli_in_process(base + [then, f"resume={d}"], d)
        assert code == 0, err
        a, b = saved_model(whole, 4), saved_model(d, 4)
        if name == "same":
            assert all(torch.equal(a[k], b[k]) for k in a)
        else:
            assert _rel(a, b) <= tol


def test_augmented_data_keeps_each_clients_draws(tmp_path):
    """A transform that draws per batch (CIFAR-10's crop and flip, on data.fake images): each client's batches come
    from its own stream, stacked by the cohort (the other path of the data)."""
    ov = ["method=fedavg", "data=cifar10", "data.fake=true", "fl.rounds=2", "fl.num_clients=10",
          "fl.clients_per_round=4", "fl.local_steps=2", "data.batch_size=8", "trainer.precision=64-true"]
    seq, _, loop = _run(ov, tmp_path, "seq", rounds=2)
    assert loop.data.train.transform is not None
    coh, _, _ = _run(ov + ["trainer.cohort=3"], tmp_path, "cohort", rounds=2)
    assert _rel(seq, coh) <= 1e-12


VIT_TINY_SMALL = ["model.net.depth=2", "model.net.embed_dim=64", "model.net.num_heads=2"]


def test_vit_tiny_fedmuon(tmp_path):
    """The paper's transformer: FedMuon on ViT-Tiny (attention written out under a cohort on the CPU, where torch's
    fused attention has no vmap rule). This run is ill-conditioned: the sequential run itself moves by ~3e-9 in
    float64 when only its attention is written out instead of fused (Newton-Schulz amplifies the last bits of
    near-zero singular directions), so the cohort is held to that: no further from the sequential run than one
    rounding change of the attention moves it. Shrunk to two blocks of width 64 and two heads (the layout is what a
    cohort handles: the attention written out, the 3-D CLS token and positions in Muon's rows; 5x faster than seed
    004's depth 6, width 192): spread 9.3e-10, the cohort 1.3 of it (full size: 2.0e-9 and 1.6 of it); an lr change of
    the cohort's clients by 1e-8 moves it by 1.7e-8 and is caught, as at full size (4.2e-8)."""
    ov = ["method=fedmuon", "model=vit_tiny", *VIT_TINY_SMALL, "method.ns_dtype=null", "trainer.precision=64-true",
          "fl.rounds=2", "fl.num_clients=10", "fl.clients_per_round=3", "fl.local_steps=2", "data.batch_size=8"]
    seq, _, _ = _run(ov, tmp_path, "seq", rounds=2)
    loop = build_loop(ov, tmp_path / "unfused")
    unfused = [m for m in loop.module.modules() if isinstance(getattr(m, "fused_attn", None), bool)]
    assert unfused
    for m in unfused:
        m.fused_attn = False
    for r in range(2):
        loop.run_round(r)
    spread = _rel(seq, {k: v.detach().clone() for k, v in loop.global_params.items()})
    coh, _, _ = _run(ov + ["trainer.cohort=3"], tmp_path, "cohort", rounds=2)
    assert 0 < spread < 1e-7
    assert _rel(seq, coh) <= 3 * spread


# seed 003's ViT (dropout 0.1 on the embedding, the attention output and the MLP), small
VIT_CIFAR = ["model=vit_cifar", "model.net.dim=16", "model.net.depth=2", "model.net.heads=2", "model.net.dim_head=8",
             "model.net.mlp_dim=16"]


@pytest.mark.parametrize("method,extra", fast_first(("fedavg", []), ("fafed", []), ("fedpac_sophia", []),
                                                    ("scaffold_vr", []), ("fedmuon", NS64)))
def test_dropout_draws_each_clients_masks_from_its_own_stream(method, extra, tmp_path):
    """A model with dropout: each client's masks are its own (seed, client, round) stream's draws, as in the sequential
    loop, including the forwards a part adds (FAFED's and SCAFFOLD-VR's gradient at the previous point, Sophia's
    Hessian-vector product on its refresh steps only), so the result equals the sequential run whatever K (2 and 4,
    unequal clients, K not dividing the round)."""
    ov = [f"method={method}", *VIT_CIFAR, "trainer.precision=64-true", *SETTING, *extra]
    seq, seq_loss, loop = _run(ov, tmp_path, "seq")
    assert loop.cohort is None and any(type(m) is torch.nn.Dropout and m.p > 0 for m in loop.module.modules())
    for k in (2, 4):
        coh, coh_loss, cloop = _run(ov + [f"trainer.cohort={k}"], tmp_path, f"cohort{k}")
        assert cloop.cohort.dropout.sites
        assert _rel(seq, coh) <= 1e-12
        assert seq_loss == pytest.approx(coh_loss, rel=1e-12)
    if method == "fedavg":  # the masks matter: without dropout the run is another one
        off, _, _ = _run(ov + ["model.net.dropout=0", "model.net.emb_dropout=0", "trainer.cohort=4"], tmp_path, "off")
        assert _rel(seq, off) > 1e-3


@pytest.mark.parametrize("overrides,needle", [
    (["model=vit_tiny", "model.net.depth=1", "model.net.dropout=0.1"],
     "draws attention dropout inside the fused attention kernel"),
    (VIT_CIFAR + ["trainer.compile=step"], "which trainer.compile=step does not trace"),
])
def test_dropout_a_cohort_cannot_draw_per_client_is_one_line(overrides, needle, tmp_path):
    msg = build_error(["method=fedavg", *overrides, "trainer.cohort=4"], tmp_path)
    assert msg.startswith("config error: trainer.cohort: ") and needle in msg and "\n" not in msg


def test_a_cohort_that_does_not_fit_is_one_line(tmp_path, monkeypatch):
    """K clients' stacked tensors against the memory free on the device: FedAvg's plain SGD holds each client's
    weights and gradients (no optimizer state)."""
    from fl_lightning.run import build

    monkeypatch.setattr(build, "available_memory", lambda device: 3 << 20)  # 3 MiB free
    msg = build_error(["method=fedavg", "trainer.cohort=16"], tmp_path)
    assert msg.startswith("config error: trainer.cohort: 16 clients stacked need about") and "3.0 MiB is free" in msg
    assert "\n" not in msg
    fit = int(msg.split("fix: use trainer.cohort=")[1].split()[0])
    loop = build_loop(["method=fedavg"], tmp_path / "r")
    per_client = 2 * sum(p.numel() * p.element_size() for p in loop.params.values())
    assert fit * per_client <= 3 << 20 < (fit + 1) * per_client


@pytest.mark.parametrize("backend,precision,tol", fast_first(("aot_eager", "64-true", 1e-12),
                                                             ("inductor", "32-true", FP32)))
def test_a_compiled_cohort_equals_the_sequential_clients_and_compiles_once(backend, precision, tol, tmp_path):
    """``trainer.compile=step``: the cohort's whole step goes through the one capture wrapper (the forward under
    ``vmap``, the backward, the parts' hooks, the optimizer), compiled in the first round and never again (here every
    cohort has K clients; the cohort's optimizer is the run's one object, reset in place); the run's summary reports
    the counts of the cohort's compiled step, what actually ran."""
    import torch._dynamo

    ov = ["method=scaffold", f"trainer.precision={precision}", "fl.rounds=3", "fl.num_clients=10",
          "fl.clients_per_round=4", "fl.local_steps=3", "fl.lr_schedule=cosine"]
    seq, _, _ = _run(ov, tmp_path, "seq")
    torch._dynamo.reset()
    loop = build_loop(ov + ["trainer.cohort=4", "trainer.compile=step", f"trainer.compile_backend={backend}"],
                      tmp_path / "compiled")
    loop.run_round(0)
    after_first = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for r in (1, 2):
        loop.run_round(r)
    assert after_first >= 1 and torch._dynamo.utils.counters["stats"]["unique_graphs"] == after_first
    assert loop.client_step is None and loop.summary()["compile"]["compiled_graphs"] >= 1
    coh = {k: v.detach().clone() for k, v in loop.global_params.items()}
    assert _rel(seq, coh) <= tol


def test_auto_is_the_sequential_loop_off_cuda_and_what_fits_on_cuda(tmp_path, caplog):
    """``trainer.cohort=auto``: 1 on the CPU (logged); on CUDA the most clients whose stacked copies and measured
    activations fit 80% of the free memory, capped by the clients a process trains; 1 for a method that cannot run
    batched, with its reason."""
    import logging

    from fl_lightning.cohort import auto_cohort

    with caplog.at_level(logging.DEBUG, logger="fl_lightning"):  # DEBUG: nothing is chosen off CUDA (issue 65)
        loop = build_loop(["method=fedavg", "trainer.cohort=auto"], tmp_path / "cpu")
    assert loop.cohort is None and "trainer.cohort=auto trainer.compile=auto -> cohort=1 compile=none on cpu" in \
        caplog.text
    cuda = torch.device("cuda")
    weights = sum(p.numel() * p.element_size() for p in loop.params.values())
    per_client = 2 * weights + 1000  # FedAvg's SGD: weights and gradients; the activations 1000 bytes
    k, why = auto_cohort(loop.strategy, loop.module, cuda, 50, 10 * per_client, lambda: 1000)
    assert k == 8 and why.startswith("8 clients a step")  # int(0.8 * 10)
    assert auto_cohort(loop.strategy, loop.module, cuda, 5, 10 * per_client, lambda: 1000)[0] == 5
    drop = build_loop(["method=fedavg", "model=vit_tiny", "model.net.depth=1", "model.net.dropout=0.1"],
                      tmp_path / "attn_drop")
    k, why = auto_cohort(drop.strategy, drop.module, cuda, 50, 10 * per_client, lambda: 1000)
    assert k == 1 and "attention dropout inside the fused attention kernel" in why


def test_a_cohorts_memory_counts_soaps_factors_per_client():
    """``client_bytes`` against a hand count of one client's tensors for a small two-layer model under SOAP (each
    client's own optimizer, ``ClientByClient``): weights and gradients, SOAP's two moments, and for each matrix
    dimension a factor GG and an eigenbasis Q (n × n; 1-D parameters have none)."""
    import functools

    from fl_lightning.cohort.memory import client_bytes
    from fl_lightning.optim.soap import SOAP
    from fl_lightning.strategies.base import Strategy
    from fl_lightning.strategies.parts import LocalOptimizer, ScaffoldCorrection

    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))  # W1 3x4, b1 3, W2 2x3, b2 2
    params = 12 + 3 + 6 + 2
    factors = 2 * (3 * 3 + 4 * 4) + 2 * (2 * 2 + 3 * 3)  # W1: GG0, Q0 (3x3), GG1, Q1 (4x4); W2: 2x2 and 3x3
    soap = LocalOptimizer(functools.partial(SOAP, lr=1e-3))
    from fl_lightning.cohort.optimizer import optimizer_mode

    assert optimizer_mode(soap)[0] == "per_client"
    floats = 2 * params + 2 * params + factors  # weights, gradients; exp_avg, exp_avg_sq; the factors and bases
    assert client_bytes(Strategy("soap", {"opt": soap}), module) == 4 * floats
    with_scaffold = Strategy("soap", {"opt": LocalOptimizer(functools.partial(SOAP, lr=1e-3)),
                                      "cv": ScaffoldCorrection()}, grad_clip=1.0)
    # SCAFFOLD's correction and gradient sum per client, and clipping's (K, P) buffer
    assert client_bytes(with_scaffold, module) == 4 * (floats + 3 * params)
    sgd = Strategy("sgd", {"opt": LocalOptimizer(functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9))})
    assert client_bytes(sgd, module) == 4 * 3 * params  # weights, gradients, the momentum buffer


def _rows_of(ctx, optimizer, i: int) -> dict:
    """Row ``i`` of everything a cohort stacks, by name: weights, the optimizer's state, the parts' round state."""
    K = len(ctx.clients)
    out = {f"weights {n}": t[i].detach().clone() for n, t in ctx.params.items()}
    for j, st in enumerate(optimizer.state.values()):
        out.update({f"optimizer {j} {k}": v[i].clone() for k, v in st.items()
                    if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == K})
    for name, state in ctx._states.items():
        for f, v in vars(state).items():
            for j, t in enumerate(v.values() if isinstance(v, dict) else v if isinstance(v, list) else [v]):
                if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == K:
                    out[f"{name}.{f} {j}"] = t[i].clone()
    return out


def _watch_masked_rows(monkeypatch) -> list:
    """Every cohort step checks that the rows of the clients not taking it are unchanged, bit for bit; returns the
    list of (rows checked' tensor count, K) it fills."""
    from fl_lightning.cohort.step import CohortStep

    real, checked = CohortStep.__call__, []

    def step(self, ctx, *args, **kw):
        optimizer = ctx.optimizer
        done = [i for i, a in enumerate(ctx.active.tolist()) if not a]
        before = {i: _rows_of(ctx, optimizer, i) for i in done}
        loss = real(self, ctx, *args, **kw)
        for i, old in before.items():  # as they were; optimizer state the step created: a fresh one's zeros
            new = _rows_of(ctx, optimizer, i)
            changed = [k for k, v in new.items() if not torch.equal(v, old[k] if k in old else torch.zeros_like(v))]
            assert old.keys() <= new.keys() and not changed, (ctx.step, i, changed)
            checked.append((len(new), len(ctx.clients)))
        return loss
    monkeypatch.setattr(CohortStep, "__call__", step)
    return checked


@pytest.mark.parametrize("method,extra", fast_first(("scaffold", ["method.momentum=0.9"]), ("local_adamw", []),
                                                    ("fedmuon", NS64), fast=2))
def test_a_finished_clients_rows_stay_bit_for_bit(method, extra, tmp_path, monkeypatch):
    """The row mask of the eager cohort (the groundwork for one shape a run): at every step a client no longer takes
    (its steps are done), its rows of the stacked weights, of the optimizer's state and of the parts' round state
    are exactly what they were before the step."""
    checked = _watch_masked_rows(monkeypatch)
    loop = build_loop([f"method={method}", *SETTING, *extra, "trainer.cohort=4", "fl.rounds=2"], tmp_path)
    for r in range(2):
        loop.run_round(r)
    n_params = len(loop.params)
    assert checked and max(c for c, _ in checked) > n_params  # optimizer or part state among the rows checked


@pytest.mark.parametrize("method,extra", fast_first(("scaffold", ["method.momentum=0.9"]), ("fafed", []),
                                                    ("local_adamw", []), ("fedpac_sophia", []), ("fedmuon_avg", NS64),
                                                    ("fedpac_soap", SOAP_CONDITIONED)))
def test_a_remainder_cohort_padded_with_phantom_rows_is_one_shape_and_equals_the_sequential_run(
        method, extra, tmp_path, monkeypatch):
    """``Cohort.pad_remainder``: 5 clients a round in cohorts of 4 train as two cohorts of 4 rows (the second with 3
    phantom rows: the first client's start again, no steps, no upload), so every step has one shape; the phantom
    rows' weights, optimizer state and round state stay bit for bit, and the run equals the sequential one (float64,
    the bound of the tests above)."""
    from fl_lightning.cohort.engine import Cohort

    ov = [f"method={method}", "trainer.precision=64-true", *SETTING, *extra]
    seq, seq_loss, _ = _run(ov, tmp_path, "seq", rounds=2)
    monkeypatch.setattr(Cohort, "pad_remainder", True)
    checked = _watch_masked_rows(monkeypatch)
    shapes = set()
    real_stacked = Cohort.stacked

    def stacked(self, K):
        shapes.add(K)
        return real_stacked(self, K)
    monkeypatch.setattr(Cohort, "stacked", stacked)
    coh, coh_loss, _ = _run(ov + ["trainer.cohort=4"], tmp_path, "cohort", rounds=2)
    assert shapes == {4} and checked and all(k == 4 for _, k in checked)
    tol = 1e-10 if method in ("local_adamw",) else 1e-12
    assert _rel(seq, coh) <= tol
    assert seq_loss == pytest.approx(coh_loss, rel=tol)
