"""Seed 001's Table 3 setting (``experiment=fedpac_llama_c4``), shrunk, with its Hutchinson-Sophia methods: LLaMA on
C4 as the experiment has it (its model, data loader, partition and per-method lr table) on tiny C4 shards in the
real format and a small BPE tokenizer, one round. Before the Hessian estimate's forward ran on SDPA's math backend,
these methods crashed at their first estimate."""
from __future__ import annotations

import math

import pytest

from tests.helpers.cli import build_loop
from tests.helpers.text_files import bpe_tokenizer, c4_shards

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("c4")
    return {"root": c4_shards(str(d / "c4")), "tok": bpe_tokenizer(str(d / "tok")), "cache": str(d / "cache")}


@pytest.mark.parametrize("method", ["fedpac_sophia", "fedpac_sophia_light", "local_sophia"])
def test_the_table_3_setting_runs_a_sophia_method_past_its_first_estimate(method, corpus, tmp_path):
    loop = build_loop(["experiment=fedpac_llama_c4", f"method={method}", "data.source=files", f"data.root={corpus['root']}",
                       f"data.tokenizer_path={corpus['tok']}", f"data.cache_dir={corpus['cache']}", "data.seq_len=16",
                       "data.eval_sequences=8", "model.net.layers=1", "model.net.hidden_size=16", "model.net.heads=2",
                       "model.net.intermediate_size=32", "fl.num_clients=4", "fl.clients_per_round=1", "fl.rounds=1",
                       "fl.local_steps=12", "data.batch_size=4", "trainer.progress=false", "trainer.accelerator=cpu"],
                      tmp_path)
    assert loop.strategy.name == method and type(loop.module).__name__ == "CausalLMModule"
    summary = loop.run(progress_enabled=False)
    assert summary["rounds_done"] == 1 and math.isfinite(summary["final_train_loss"])
    assert math.isfinite(summary["final_test_ppl"])
