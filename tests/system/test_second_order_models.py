"""Every method whose parts take a Hutchinson Hessian estimate (a double backward: Sophia's ``hutchinson``
estimator) on every model family with attention or recurrence: one client, as many local steps as the estimate's own
period (its ``every``, read from the composed method) plus two, so the estimate fires; the loss stays finite and the
weights move. Before the estimate's forward ran on SDPA's math backend, the ViT and LLaMA cells crashed at step 10
(``derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented``)."""
from __future__ import annotations

import math
import os

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers.cli import CONF, build_loop, make_cfg

pytestmark = pytest.mark.slow

# tiny widths: what breaks here is the op, not the size
FAMILIES = {
    "vit_tiny": ["model=vit_tiny"],
    "swin_micro": ["model=swin_micro"],
    "llama_tiny": ["model=llama_tiny", "data=pydoc_chars", "data.num_topics=2", "fl.num_clients=auto"],
    "char_lstm": ["model=char_lstm", "model.net.hidden=16", "data=pydoc_chars", "data.num_topics=2",
                  "fl.num_clients=auto"],
}


def hutchinson_methods() -> dict[str, int]:
    """``{method: the largest estimate period}`` for every method yaml with a Hutchinson estimator."""
    out = {}
    for f in sorted(os.listdir(os.path.join(CONF, "method"))):
        name = f[:-5]
        parts = OmegaConf.to_container(make_cfg([f"method={name}"], "unused").method.get("parts") or {}, resolve=True)
        every = [int(p.get("every", 1)) for p in parts.values() if isinstance(p, dict)
                 and str(p.get("_target_", "")).endswith("SophiaHessian") and p.get("estimator") == "hutchinson"]
        if every:
            out[name] = max(every)
    return out


METHODS = hutchinson_methods()


def test_the_hutchinson_methods_are_found():
    assert {"fedpac_sophia", "fedpac_sophia_light", "fedpm", "local_sophia"} <= set(METHODS)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_hutchinson_method_trains_past_its_first_estimate(method, family, tmp_path):
    steps = METHODS[method] + 2
    loop = build_loop([f"method={method}", *FAMILIES[family], "fl.clients_per_round=1", "fl.rounds=1",
                       f"fl.local_steps={steps}", "trainer.progress=false", "trainer.accelerator=cpu",
                       "trainer.threads=1"], tmp_path)
    before = {k: v.clone() for k, v in loop.global_params.items()}
    summary = loop.run(progress_enabled=False)
    assert summary["rounds_done"] == 1 and math.isfinite(summary["final_train_loss"])
    assert any(not torch.equal(before[k], v) for k, v in loop.global_params.items())
