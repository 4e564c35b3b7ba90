"""A cohort's step through the one capture wrapper's ``graphs`` mode (fl_lightning/step/graphed.py): what a replay
needs, checked on the CPU (every tensor the captured step reads and writes keeps its address from one cohort to
the next), and on a GPU the replayed cohort against the eager cohort and the sequential run."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.cli import build_loop

# 5 clients a round in cohorts of 4: a full cohort and a remainder padded to 4 rows by phantom rows (one shape a run)
SETTING = ["fl.rounds=2", "fl.num_clients=10", "fl.clients_per_round=5", "fl.local_steps=3", "trainer.cohort=4",
           "trainer.progress=false"]


def _watch_addresses(monkeypatch) -> list:
    """Each cohort step's memory as a replay reads it (``step.graphed.addresses``, what ``GraphedStep`` compares at a
    client's start) and its plan, recorded at every step; returns the list it fills."""
    from fl_lightning.cohort.engine import Cohort
    from fl_lightning.cohort.step import CohortStep
    from fl_lightning.step.graphed import addresses
    from fl_lightning.step.plan import planned

    monkeypatch.setattr(Cohort, "pad_remainder", True)
    real, seen = CohortStep.__call__, []

    def step(self, ctx, batch, k):
        seen.append((k, addresses(ctx, self.strategy), planned(ctx, self.strategy)))
        return real(self, ctx, batch, k)
    monkeypatch.setattr(CohortStep, "__call__", step)
    return seen


@pytest.mark.parametrize("method,extra", [("fedavg", []), ("scaffold", []), ("local_adamw", []),
                                          ("fedmuon_avg", ["method.ns_dtype=null"])])
def test_a_cohorts_step_reads_the_same_memory_from_one_cohort_to_the_next(method, extra, tmp_path, monkeypatch):
    """The stacked parameters, the optimizer's state, the parts' stacked round states and the step's row mask and
    counts are allocated once a run and filled in place: at a given step every cohort (two rounds, a remainder
    cohort padded to K among them) reads the same addresses, so a graph captured in the first replays in the others."""
    seen = _watch_addresses(monkeypatch)
    loop = build_loop([f"method={method}", *SETTING, *extra], tmp_path)
    for r in range(2):
        loop.run_round(r)
    by_step: dict[int, set] = {}
    for k, addr, _ in seen:
        by_step.setdefault(k, set()).add(tuple(addr))
    assert len([k for k, _, _ in seen if k == 0]) == 4  # 2 rounds x (a full cohort and a padded remainder)
    n_params = len(loop.params)
    assert all(len(a) > n_params for k, a, _ in seen)  # the row mask and counts, optimizer or part state among them
    assert {k: len(v) for k, v in by_step.items()} == {k: 1 for k in by_step}


# ------------------------------------------------------------------------------------------------ on a GPU
GPU_CASES = [("fedavg", []), ("scaffold", ["method.momentum=0.0"]),
             ("fedmuon", ["model=vit_tiny", "method.ns_dtype=null", "data.batch_size=8"]),
             ("fedpac_sophia", ["model=cnn"])]


def _final(overrides: list[str], tmp_path, name: str) -> dict:
    loop = build_loop(overrides, tmp_path / name)
    for r in range(2):
        loop.run_round(r)
    return {k: v.detach().double().cpu() for k, v in loop.global_params.items()}, loop


def _rel(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-30)) for k in a)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("method,extra", GPU_CASES)
def test_a_replayed_cohort_equals_the_eager_cohort_and_the_sequential_run(method, extra, tmp_path, monkeypatch):
    """``trainer.cohort=4 trainer.compile=graphs`` on CUDA (TF32 off), a remainder cohort padded to K: the replayed
    cohort equals the eager cohort and the sequential clients within 1e-4, and its steps were replayed."""
    from fl_lightning.cohort.engine import Cohort

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(Cohort, "pad_remainder", True)
    base = [f"method={method}", *SETTING, *extra, "trainer.accelerator=cuda", "trainer.precision=32-true"]
    seq, _ = _final([*base, "trainer.cohort=1", "trainer.compile=none"], tmp_path, "seq")
    eager, _ = _final([*base, "trainer.compile=none"], tmp_path, "eager")
    graphs, loop = _final([*base, "trainer.compile=graphs"], tmp_path, "graphs")
    counts = loop.cohort.step.counts()
    assert counts["eager_reason"] is None and counts["replays"] > 0, counts
    assert _rel(eager, graphs) <= 1e-4
    assert _rel(seq, graphs) <= 1e-4
