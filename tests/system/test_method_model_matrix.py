"""The method configs on every model family the package ships (every part, optimizer and pairing on each family;
every method on at least one: :func:`cells`), one client, for as many local steps as the
method's longest declared period (Sophia's Hessian ``every``, SOAP's ``precondition_frequency``, read from the
composed config) plus two, so every periodic event fires: the loss stays finite and the weights move. What breaks
across families is the op (a double backward through fused attention, a bf16 kernel), not the size, so the widths
are tiny. The CNN family is every golden record (tests/fidelity/test_golden.py). No cell refuses (all 54 x 7 ran when
the matrix was written; docs/usage.md)."""
from __future__ import annotations

import math
import os

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers.cli import CONF, build_loop, make_cfg
from tests.helpers.cover import FAST

pytestmark = pytest.mark.slow

CHARS = ["data=pydoc_chars", "data.num_topics=2", "fl.num_clients=auto", "data.test_windows=32"]
FAMILIES = {
    "vit_tiny": ["model=vit_tiny", "model.net.depth=1", "model.net.embed_dim=24", "model.net.num_heads=2"],
    "swin_micro": ["model=swin_micro", "model.net.depths=[1,1]", "model.net.embed_dim=12", "model.net.num_heads=[1,2]"],
    "resnet18_gn": ["model=resnet18_gn", "model.net.width=4"],
    "char_lstm": ["model=char_lstm", "model.net.hidden=8", *CHARS],
    "elman_rnn": ["model=elman_rnn", "model.net.hidden=8", "model.net.embed_dim=8", *CHARS],
    "llama_tiny": ["model=llama_tiny", "model.net.layers=1", "model.net.hidden_size=16", "model.net.heads=2",
                   "model.net.intermediate_size=32", *CHARS],
    # RoBERTa-LoRA on the embedded topic task, its backbone random and tiny (pre-training is not what is tested)
    "roberta_lora": ["model=roberta_lora", "data=pydoc_topics", "data.pretrain=null", "data.vocab_size=300",
                     "data.backbone={hidden_size:16,layers:1,heads:2,intermediate_size:32}", "fl.num_clients=4",
                     "data.cache_dir={cache}"],
}
PERIOD_KEYS = ("every", "precondition_frequency")


def periods(node) -> list[int]:
    if isinstance(node, dict):
        return [int(v) for k, v in node.items() if k in PERIOD_KEYS and isinstance(v, int)] + \
            [p for v in node.values() for p in periods(v)]
    if isinstance(node, list):
        return [p for v in node for p in periods(v)]
    return []


def methods() -> dict[str, int]:
    out = {}
    for f in sorted(os.listdir(os.path.join(CONF, "method"))):
        cfg = make_cfg([f"method={f[:-5]}"], "unused")
        tree = OmegaConf.to_container(cfg, resolve=True)
        out[f[:-5]] = max([1, *periods(tree["method"]), *periods(tree.get("optimizer") or {})])
    return out


METHODS = methods()


def test_the_periods_are_read_from_the_configs():
    assert METHODS["fedpac_sophia"] == 10 and METHODS["fedpac_soap"] == 10 and METHODS["fedavg"] == 1


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))  # the topic task's tokenizer and backbone, built once per worker


def cells() -> list[tuple[str, str]]:
    """What breaks across families is an op, and a method's ops are its parts' and its optimizer's: the methods that
    hold every part class, optimizer class and pairing (tests/helpers/cover.py) run on every family, and every other
    method, which repeats those with other settings, on one family in turn (so every method runs, and each family
    meets about a seventh of them)."""
    families = sorted(FAMILIES)
    out = [(m, f) for m in sorted(METHODS) if m in FAST for f in families]
    rest = [m for m in sorted(METHODS) if m not in FAST]
    return out + [(m, families[i % len(families)]) for i, m in enumerate(rest)]


@pytest.mark.parametrize("method,family", cells())
def test_method_on_model_family(method, family, tmp_path, cache):
    over = [f"method={method}", *(o.replace("{cache}", cache) for o in FAMILIES[family]), "fl.clients_per_round=1", "fl.rounds=1",
            f"fl.local_steps={METHODS[method] + 2}", "trainer.progress=false", "trainer.accelerator=cpu",
            "trainer.threads=1", "data.batch_size=4"]
    loop = build_loop(over, tmp_path)
    before = {k: v.clone() for k, v in loop.global_params.items()}
    summary = loop.run(progress_enabled=False)
    assert summary["rounds_done"] == 1 and math.isfinite(summary["final_train_loss"])
    assert any(not torch.equal(before[k], v) for k, v in loop.global_params.items())
