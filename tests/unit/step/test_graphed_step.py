"""``trainer.compile=graphs`` (fl_lightning/step/graphed.py): which methods' steps replay as a CUDA graph, and why
the others run eagerly (CPU); on a GPU, graph replays against eager steps, with and without an lr schedule."""
from __future__ import annotations

import pytest
import torch

from fl_lightning.config import StepBudget
from fl_lightning.step.graphed import unsupported
from tests.helpers.cli import build_loop

BASE = ["fl.num_clients=6", "fl.clients_per_round=3", "fl.rounds=2", "fl.local_steps=6", "trainer.progress=false",
        "checkpoint.every=100", "trainer.cohort=1"]  # the GPU tests give trainer.compile


def _reason(method: str, tmp_path, extra=()) -> str | None:
    loop = build_loop([f"method={method}", *BASE, "trainer.accelerator=cpu", *extra], tmp_path)
    loop.strategy.setup(loop.server_context())
    received = {k: m.tensor for k, m in loop.strategy.broadcast(0).items()}
    client = loop.start_client(loop.owned[0], 0, received, 1.0)
    return unsupported(loop.strategy, client.optimizer)


@pytest.mark.parametrize("method", ["fedavg", "fedmuon", "fedavg_server_momentum", "fedadam", "local_muon_reset",
                                    "fedmuon_bc", "scaffold", "fed_sophia", "local_muon", "fafed", "fedprox"])
def test_these_methods_steps_replay(method, tmp_path):
    """FedAvg's stateless SGD, seed 004's FedMuon (Muon's state allocated once and zeroed in place, its alignment
    reading the server's Δ_G), server optimizers (outside the step), a reset Local Muon, and seed 000's FedMuon, whose
    corrections C_glob − C_i are new tensors for each client (so its step is captured again for each client);
    SCAFFOLD's correction, Sophia (its refresh steps planned before the step, run eagerly), a persistent Local Muon
    (each client's state imported in place), FAFED (its step's numbers as 0-d tensors) and FedProx."""
    assert _reason(method, tmp_path) is None


@pytest.mark.parametrize("method,needle", [
    ("fedpac_soap", "rebuilds its state"),  # its first step initialises its bases
    ("fedavg_adam", "counts its steps on the host"),  # torch's Adam: its step count a host-side tensor
])
def test_the_others_say_why_they_run_eagerly(method, needle, tmp_path):
    reason = _reason(method, tmp_path)
    assert reason is not None and needle in reason, reason


def test_a_part_with_step_hooks_and_no_step_plan_runs_eagerly(tmp_path):
    from fl_lightning.strategies.base import Part

    class Hooked(Part):
        def after_backward(self, client):
            pass
    loop = build_loop(["method=fedavg", *BASE, "trainer.accelerator=cpu"], tmp_path)
    part = Hooked()
    part.name = "hooked"
    loop.strategy.parts.append(part)
    assert unsupported(loop.strategy, object()) == "part 'hooked' (Hooked) declares no step plan (Part.step_plan)"


def test_the_plan_is_the_parts_planned_host_values(tmp_path):
    """``step.plan.planned``: seed 003's step order marks the round's last step, Sophia its refresh steps, planned
    before each step (``before_step``); what a replay compares with the captured plan."""
    from fl_lightning.step.plan import planned

    seen = {}
    for method in ("fedmuon_avg", "fed_sophia"):
        loop = build_loop([f"method={method}", *BASE, "trainer.accelerator=cpu", "method.parts.hessian.every=4"]
                          if method == "fed_sophia" else [f"method={method}", *BASE, "trainer.accelerator=cpu"],
                          tmp_path / method)
        loop.strategy.setup(loop.server_context())
        received = {k: m.tensor for k, m in loop.strategy.broadcast(0).items()}
        client = loop.start_client(loop.owned[0], 0, received, 1.0)
        plans = []
        for k, batch in enumerate(loop.data.client_batches(client.id, 0, loop.device, StepBudget(steps=6))):
            loop.strategy.before_step(client)
            plans.append(planned(client, loop.strategy))
            loop.step(client, batch, k)
            client.step += 1
        seen[method] = plans
    assert seen["fedmuon_avg"] == [((False,),)] * 5 + [((True,),)]
    assert seen["fed_sophia"] == [((k % 4 == 3,),) for k in range(6)]


def test_sgd_with_momentum_rebuilds_its_state(tmp_path):
    reason = _reason("fedavg", tmp_path, ["method.momentum=0.9"])
    assert reason is not None and "rebuilds its state" in reason, reason


def test_the_step_is_captured_again_when_what_it_reads_moves(tmp_path):
    """The addresses a replay reads, at a client's start: the same for FedMuon's next client (its state zeroed in
    place, the server's Δ_G written in place); another once a part hands the step a new tensor."""
    from fl_lightning.step.graphed import addresses

    loop = build_loop(["method=fedmuon", *BASE, "trainer.accelerator=cpu"], tmp_path)
    loop.strategy.setup(loop.server_context())
    received = {k: m.tensor for k, m in loop.strategy.broadcast(0).items()}
    first = loop.start_client(loop.owned[0], 0, received, 1.0)
    for k, batch in enumerate(loop.data.client_batches(first.id, 0, loop.device, StepBudget(steps=2))):
        loop.step(first, batch, k)
    before = addresses(first, loop.strategy)
    loop.strategy.client_end(first)
    second = loop.start_client(loop.owned[1], 0, received, 1.0)
    assert addresses(second, loop.strategy) == before
    part = next(p for p in loop.strategy.parts if type(p).__name__ == "GlobalAlignment")
    state = second.state_of(part)
    state.deltas = {n: t.clone() for n, t in state.deltas.items()}
    assert addresses(second, loop.strategy) != before


def _rel(a: dict, b: dict) -> float:
    keep = [k for k in a if not k.endswith("qkv.bias")]  # AdamW on the key bias's zero gradient: rounding noise
    return max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)) for k in keep)


def _eager_and_graphs(over, tmp_path, monkeypatch) -> dict:
    """The run eagerly and with its steps replayed as a CUDA graph, TF32 off on both sides: mode -> (weights, summary)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    runs = {}
    for mode in ("none", "graphs"):
        loop = build_loop(over + [f"trainer.compile={mode}"], tmp_path / mode)
        summary = loop.run(progress_enabled=False)
        runs[mode] = ({k: v.detach().cpu() for k, v in loop.global_params.items()}, summary)
    return runs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("method,model,extra", [
    ("fedavg", "cnn", []),
    ("fedavg", "cnn", ["fl.lr_schedule=cosine", "fl.rounds=3"]),
    ("fedmuon", "cnn", ["method.ns_dtype=null"]),
    ("fedmuon", "vit_tiny", ["method.ns_dtype=null", "fl.lr_schedule=cosine"]),
])
def test_graph_replays_equal_eager_steps(method, model, extra, tmp_path, monkeypatch):
    """The run with its steps replayed as a CUDA graph gives eager's model up to float order (TF32 off on both
    sides); the graph is captured once per run, or once a round under a schedule, and most steps are replays."""
    runs = _eager_and_graphs([f"method={method}", f"model={model}", *BASE, "trainer.accelerator=cuda", *extra],
                             tmp_path, monkeypatch)
    counts = runs["graphs"][1]["compile"]
    assert counts["eager_reason"] is None, counts
    rounds = runs["graphs"][1]["rounds_done"]
    assert 1 <= counts["graphs_captured"] <= rounds and counts["replays"] > counts["eager_steps"], counts
    assert _rel(runs["none"][0], runs["graphs"][0]) <= 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("method,extra", [
    ("scaffold", []), ("fedprox", []), ("scallion", []), ("adam_biclip", []), ("padamfed_vr", []), ("fafed", []),
    ("fed_sophia", ["method.parts.hessian.every=4"]), ("fedmuon_avg", ["method.ns_dtype=null"]),
])
def test_the_parts_with_a_step_plan_replay_as_eager(method, extra, tmp_path, monkeypatch):
    """The parts that declare a step plan, on the CNN: replayed runs give eager's model up to float order, most
    steps replayed (a planned step, Sophia's refresh or seed 003's last step, eagerly; a client bringing new tensors
    captures again)."""
    runs = _eager_and_graphs([f"method={method}", "model=cnn", *BASE, "trainer.accelerator=cuda", *extra], tmp_path,
                             monkeypatch)
    counts = runs["graphs"][1]["compile"]
    assert counts["eager_reason"] is None and counts["graphs_captured"] >= 1, counts
    assert counts["replays"] > counts["eager_steps"], counts
    assert _rel(runs["none"][0], runs["graphs"][0]) <= 1e-4


@pytest.mark.slow
def test_the_usage_table_of_replaying_methods_is_the_declarations():
    """docs/usage.md's table of which methods replay (and why the others do not) is what the declarations give
    (``python3 -m tests.helpers.graph_table`` rewrites it)."""
    from tests.helpers.graph_table import current, table

    assert current() == table()
