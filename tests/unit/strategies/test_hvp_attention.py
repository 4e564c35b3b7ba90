"""The Hessian-vector product (Sophia's Hutchinson estimate) through models with fused attention: the estimate's
forward runs SDPA on its math backend, which has a double backward (fl_lightning/loop/services.py, twice_differentiable),
and equals the same product with the model's own non-fused attention, to float rounding."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.cli import build_loop

SMALL = ["fl.num_clients=2", "fl.clients_per_round=1", "fl.rounds=1", "fl.local_steps=1", "trainer.progress=false",
         "trainer.accelerator=cpu", "method=local_sophia"]
MODELS = {
    "vit_tiny": ["model=vit_tiny"],
    "llama_tiny": ["model=llama_tiny", "data=pydoc_chars", "data.num_topics=2"],
}


def _unfused(module, name: str):
    """Switch the model to its own attention arithmetic (no SDPA call): timm's ``fused_attn = False``, transformers'
    eager attention."""
    if name == "vit_tiny":
        blocks = [m for m in module.modules() if hasattr(m, "fused_attn")]
        assert blocks
        for m in blocks:
            m.fused_attn = False
    else:
        configs = [m.config for m in module.modules() if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")]
        assert configs
        for c in configs:
            c._attn_implementation = "eager"


@pytest.mark.parametrize("name", list(MODELS))
def test_hvp_through_fused_attention_equals_the_unfused_one(name, tmp_path):
    loop = build_loop([*MODELS[name], *SMALL], tmp_path)
    services, params = loop.services, loop.services.params
    batch = loop.data.probe_batch(0, loop.device)
    g = torch.Generator().manual_seed(0)
    vector = {n: torch.randint(0, 2, p.shape, generator=g).to(p.dtype) * 2 - 1 for n, p in params.items()}  # Rademacher
    loop.module.eval()  # no dropout: both products see the same function
    with pytest.raises(RuntimeError, match="derivative for .* is not implemented"):  # what crashed before
        grads = torch.autograd.grad(services.loss(batch), list(params.values()), create_graph=True, allow_unused=True)
        torch.autograd.grad(sum((gr * vector[n]).sum() for n, gr in zip(params, grads) if gr is not None),
                            list(params.values()), allow_unused=True)
    fused = services.hvp(vector, batch)
    _unfused(loop.module, name)
    plain = services.hvp(vector, batch)
    assert set(fused) == set(plain) == set(params)
    num = sum(float((fused[n].double() - plain[n].double()).norm() ** 2) for n in params) ** 0.5
    den = sum(float(plain[n].double().norm() ** 2) for n in params) ** 0.5
    assert den > 0 and num / den < 1e-5, num / den
