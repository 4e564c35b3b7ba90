"""Language models (issue 10): the LLaMA sizes and seed 002's character LSTM (parameter counts), the causal-LM
module's metrics against a hand computation, the embedded ``pydoc_chars`` task, bf16-mixed on CPU."""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.data.info import DataInfo
from tests.helpers.cli import ROOT, build_loop, make_cfg, metric_rows


def built(model: str, info: DataInfo, device: str = "cpu"):
    from fl_lightning.models import build_model

    with torch.device(device):
        torch.manual_seed(0)
        return build_model(make_cfg([f"model={model}"], "unused").model, info)


def count(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("model, params", [("llama_60m", 58_073_600), ("llama_130m", 134_105_856),
                                           ("llama_350m", 367_969_280)])
def test_llama_sizes_on_the_meta_device(model, params):
    """The literature's LLaMA 60M / 130M / 350M (58.1 / 134.1 / 368.0 M, vocabulary 32,000, untied embeddings);
    by hand: 2·V·d + L·(4d² + 3·d·d_ff + 2d) + d."""
    module = built(model, DataInfo(vocab_size=32_000), "meta")
    cfg = module.net.config
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    assert count(module) == params == 2 * 32_000 * d + L * (4 * d * d + 3 * d * f + 2 * d) + d
    assert not cfg.tie_word_embeddings and cfg.max_position_embeddings == 256


def test_t5_sentinel_ids_fit_the_32000_vocabulary_only_when_unused():
    from fl_lightning.errors import ConfigError

    fits = DataInfo(vocab_size=32_100, provenance={"max_token_id": 31_999})
    assert built("llama_60m", fits, "meta").net.config.vocab_size == 32_000
    with pytest.raises(ConfigError, match="vocab_size"):
        built("llama_60m", DataInfo(vocab_size=32_100, provenance={"max_token_id": 32_050}), "meta")


def test_char_lstm_is_seed_002s_133520_parameters():
    module = built("char_lstm", DataInfo(num_classes=80, vocab_size=80))
    # Embedding 80·8, LSTM 4·100·(8 + 100 + 2) and 4·100·(100 + 100 + 2), Linear 100·80 + 80
    assert count(module) == 133_520 == 80 * 8 + 4 * 100 * 110 + 4 * 100 * 202 + 100 * 80 + 80
    out = module.net(torch.randint(0, 80, (3, 80)))
    assert out.shape == (3, 80)


def test_causal_lm_metrics_are_token_means_over_all_batches():
    """test_loss / test_ppl / test_acc against a hand computation over two unequal batches (token means, not batch
    means), and the windowed sets' sequence = window + next character."""
    module = built("llama_tiny", DataInfo(vocab_size=11))
    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 11, (3, 9), generator=g)},
               {"input_ids": torch.randint(0, 11, (1, 4), generator=g), "y": torch.tensor([5])}]
    nll, right, n = 0.0, 0, 0
    with torch.no_grad():
        for b in batches:
            seq = torch.cat([b["input_ids"], b["y"].view(-1, 1)], 1) if "y" in b else b["input_ids"]
            logp = torch.log_softmax(module.net(input_ids=seq).logits.double(), -1)[:, :-1]
            tgt = seq[:, 1:]
            nll -= logp.gather(-1, tgt.unsqueeze(-1)).sum().item()
            right += (logp.argmax(-1) == tgt).sum().item()
            n += tgt.numel()
    module.eval()
    for i, b in enumerate(batches):
        module.validation_step(b, i)
    out = module.compute_eval()
    assert n == 3 * 8 + 4
    assert out["test_loss"] == pytest.approx(nll / n, rel=1e-6)
    assert out["test_ppl"] == pytest.approx(math.exp(nll / n), rel=1e-6)
    assert out["test_acc"] == pytest.approx(right / n)
    train = module.training_step(batches[0])
    logits = module.net(input_ids=batches[0]["input_ids"]).logits[:, :-1]
    assert train.item() == pytest.approx(F.cross_entropy(logits.reshape(-1, 11), batches[0]["input_ids"][:, 1:].reshape(-1)).item(), rel=1e-6)


def test_sharded_evaluation_sums_equal_the_whole():
    """The loop's sharded evaluation gives each process rows rank::world of every test batch; the sum states of
    the two halves add up to the whole set's metrics (what torchmetrics' sync does across processes)."""
    module = built("llama_tiny", DataInfo(vocab_size=13)).eval()
    batch = {"input_ids": torch.randint(0, 13, (5, 7), generator=torch.Generator().manual_seed(1))}
    module.validation_step(batch)
    whole = module.compute_eval()
    for rank in range(2):
        module.validation_step({k: v[rank::2] for k, v in batch.items()})
    assert module.compute_eval() == pytest.approx(whole, rel=1e-12)


def test_pydoc_chars_is_80_symbol_windows_one_client_per_topic():
    from fl_lightning.data.pydoc_chars import pydoc_chars
    from fl_lightning.data.pydoc_topics import corpus

    train, test, info = pydoc_chars(num_topics=3, window=10, test_windows=50)
    topics, text_hash = corpus()
    assert info.vocab_size == info.num_classes == 80 and dict(info.provenance)["data_text_sha256"] == text_hash
    x, y, grp = (train.tensors[k] for k in ("input_ids", "y", "group"))
    assert x.shape[1] == 10 and len(test) == 50 and set(grp.tolist()) == {0, 1, 2}
    first = topics[dict(info.provenance)["data_topics"].split(",")[0]]
    assert (x[0] < 79).all()  # the opening characters of the longest topic are in the alphabet
    from fl_lightning.data.pydoc_chars import alphabet

    chars = alphabet("".join(topics.values()))
    assert "".join(chars[i] for i in x[0].tolist()) == first[:10] and chars[int(y[0])] == first[10]
    assert torch.equal(x[1, :-1], x[0, 1:]) and int(x[1, -1]) == int(y[0])  # stride 1 (LEAF's)


SMALL = ["data=pydoc_chars", "data.num_topics=4", "fl.num_clients=4", "fl.clients_per_round=2", "fl.local_steps=3",
         "fl.rounds=2", "data.test_windows=100", "data.batch_size=16", "trainer.progress=false", "trainer.accelerator=cpu",
         "method=local_adamw", "method.lr=3e-3"]


@pytest.mark.parametrize("model", ["llama_tiny", "char_lstm"])
def test_bf16_mixed_on_cpu_trains_close_to_fp32(tmp_path, model):
    """trainer.precision=bf16-mixed runs these models on the CPU (autocast to bfloat16) and learns like fp32: the
    loss falls, and the first round's metrics agree to bf16 precision."""
    for prec in ("32-true", "bf16-mixed"):
        build_loop([f"model={model}", f"trainer.precision={prec}", *SMALL], tmp_path / prec).run(progress_enabled=False)
    a, b = metric_rows(tmp_path / "32-true"), metric_rows(tmp_path / "bf16-mixed")
    assert float(b[-1]["test_loss"]) < float(b[0]["train_loss"])
    assert float(b[0]["test_loss"]) == pytest.approx(float(a[0]["test_loss"]), rel=2e-2)
    assert a[0]["test_loss"] != b[0]["test_loss"]  # bf16 did run


def _char_lstm_bf16_step() -> torch.dtype:
    from fl_lightning.models.char_lstm import CharLSTM

    torch.manual_seed(0)
    net = CharLSTM(80, 8, 16, 2)
    ids = torch.randint(0, 80, (4, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = net(ids)
    logits.float().sum().backward()
    assert all(p.grad is not None and bool(p.grad.isfinite().all()) for p in net.parameters())
    return logits.dtype


def test_char_lstm_under_cpu_bf16_without_onednn_bf16_runs_its_lstm_in_fp32(monkeypatch):
    """Where oneDNN has no bf16 LSTM (an AVX2 CPU), the LSTM runs in fp32 and the layers around it in bf16; where it
    has one, the LSTM runs in bf16 (fl_lightning/models/recurrent_precision.py)."""
    from fl_lightning.models import recurrent_precision
    from fl_lightning.models.char_lstm import CharLSTM

    seen = []
    monkeypatch.setattr(recurrent_precision, "onednn_has_bf16", lambda: False)
    net = CharLSTM(80, 8, 16, 2)
    net.lstm.register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out[0].dtype)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = net(torch.randint(0, 80, (4, 12)))
    assert seen == [(torch.float32, torch.float32)] and logits.dtype == torch.bfloat16  # the Linear after it: bf16
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        monkeypatch.setattr(recurrent_precision, "onednn_has_bf16", lambda: True)
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            net(torch.randint(0, 80, (4, 12)))
        assert seen[0][1] == torch.bfloat16


def test_char_lstm_bf16_runs_where_onednn_is_capped_at_avx2():
    """The crash seen on an AVX2 CPU ('could not create a primitive descriptor for the LSTM forward propagation
    primitive'), reproduced on any x86 CPU by capping oneDNN's ISA: the char LSTM trains a step under bf16 autocast."""
    import platform
    import subprocess
    import sys

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("ONEDNN_MAX_CPU_ISA=AVX2 is an x86 setting")
    code = ("import torch; from tests.unit.models.test_language_models import _char_lstm_bf16_step as f; "
            "assert not torch.ops.mkldnn._is_mkldnn_bf16_supported(); print(f())")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().endswith("torch.bfloat16")
