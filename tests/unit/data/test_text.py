"""Text classification (issue 9): RoBERTa + LoRA through peft, GLUE TSV files through the real loader with each
task's official metric, the embedded pydoc_topics task. Every file is fabricated here in the real format: a tiny
random RoBERTa saved with ``save_pretrained``, a byte-level BPE tokenizer trained on the fly, GLUE TSV folders."""
from __future__ import annotations

import csv
import hashlib
import json
import os

import pytest
import torch

from fl_lightning.errors import ConfigError, ResumeError
from tests.helpers.cli import build_loop, make_cfg, one_line_error, run_cli

CORPUS = [
    "the cat sat on the mat and looked at the dog", "a dog barked at the cat in the garden today",
    "stocks rose sharply as markets rallied on strong earnings", "the central bank raised interest rates again",
    "the team won the final match after extra time", "fans cheered as the striker scored a late goal",
    "it is not the case that the book was read by him", "the old man the boats with care every morning",
] * 3


def _tokenizer(path):
    from fl_lightning.data.pretrain import train_tokenizer

    train_tokenizer(CORPUS, str(path), vocab_size=300)


def _tiny_roberta(path, tok_dir, seed=0, max_len=130):
    """A random RoBERTa (hidden 32, 2 layers) + the tokenizer, as a save_pretrained directory."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    torch.manual_seed(seed)
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=max_len + 2, type_vocab_size=1,
                        pad_token_id=tok.pad_token_id)
    RobertaForSequenceClassification(cfg).save_pretrained(str(path))
    tok.save_pretrained(str(path))


def _write(path, header, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
        if header:
            w.writerow(header)
        w.writerows(rows)


def _glue_dir(root):
    """CoLA (single sentence, no header: source, label, original label, sentence) and MRPC (pair, header)."""
    import random

    rnd = random.Random(0)
    for split, n in (("train", 64), ("dev", 24)):
        cola = [["gj04", str(i % 2), "" if i % 2 else "*", rnd.choice(CORPUS)] for i in range(n)]
        _write(os.path.join(root, "CoLA", f"{split}.tsv"), None, cola)
        mrpc = [[str(i % 2), str(i), str(i + 1), rnd.choice(CORPUS), rnd.choice(CORPUS)] for i in range(n)]
        mrpc.append(["0", "1", "2", "a row with a missing field"])  # malformed: skipped, as GLUE's loaders do
        _write(os.path.join(root, "MRPC", f"{split}.tsv"), ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], mrpc)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    _tokenizer(root / "tok")
    _tiny_roberta(root / "roberta", root / "tok")
    _glue_dir(root / "glue")
    return root


def _overrides(files, tmp_path, task, *extra):
    return ["experiment=glue_lora", f"data.task={task}", "data.source=tsv", f"data.root={files / 'glue'}",
            f"model.net.pretrained_path={files / 'roberta'}", f"data.cache_dir={tmp_path / 'cache'}",
            "fl.rounds=2", "fl.local_steps=3", "fl.eval_every=1", "data.batch_size=8", "trainer.progress=false",
            "trainer.accelerator=cpu", *extra]


def _lora_and_head(module):
    """Independent count: the LoRA factors and peft's trainable copy of the classification head, by name."""
    return {n: p for n, p in module.named_parameters()
            if ".lora_A." in n or ".lora_B." in n or "classifier.modules_to_save." in n}


# ----------------------------------------------------------------------------------------------- the model


def test_roberta_base_lora_trainable_count_on_meta():
    """roberta-base (vocab 50265, 514 positions, 1 token type) + the authors' LoRA: 3,246,338 of 127.9 M."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    from fl_lightning.models.roberta_lora import add_lora

    cfg = RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, num_labels=2)
    with torch.device("meta"):
        model = add_lora(RobertaForSequenceClassification(cfg))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    # by hand: 12 layers x LoRA r=16 on q, k, v, attn-out (768->768), intermediate (768->3072), output (3072->768)
    lora = 12 * 16 * (4 * (768 + 768) + (768 + 3072) + (3072 + 768))
    head = 768 * 768 + 768 + 768 * 2 + 2
    assert trainable == lora + head == 3_246_338
    assert total == 127_893_508


def test_frozen_backbone_and_fresh_head(files):
    from fl_lightning.data.info import DataInfo
    from fl_lightning.models.roberta_lora import roberta_lora
    from transformers import AutoModelForSequenceClassification

    net = roberta_lora(DataInfo(num_classes=3), str(files / "roberta"))
    src = AutoModelForSequenceClassification.from_pretrained(str(files / "roberta"), local_files_only=True)
    w = net.base_model.model.roberta.encoder.layer[0].attention.self.query.base_layer.weight
    assert not w.requires_grad and torch.equal(w, src.roberta.encoder.layer[0].attention.self.query.weight)
    trainable = {n for n, p in net.named_parameters() if p.requires_grad}
    assert trainable == set(_lora_and_head(net)) and trainable
    assert net.base_model.model.classifier.modules_to_save.default.out_proj.weight.shape == (3, 32)
    assert len(net.backbone_fingerprint) == 16


def test_loading_the_backbone_draws_no_bar_of_transformers(files, capfd):
    """transformers 5 draws ``Loading weights: 100%|...`` while it loads; a run shows only its own progress, and
    transformers' bars are as they were afterwards (on, then off)."""
    from transformers.utils import logging as hf_logging

    from fl_lightning.data.info import DataInfo
    from fl_lightning.models.roberta_lora import roberta_lora

    capfd.readouterr()
    for enabled in (True, False):
        (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
        roberta_lora(DataInfo(num_classes=2), str(files / "roberta"))
        assert hf_logging.is_progress_bar_enabled() is enabled
    hf_logging.enable_progress_bar()
    out, err = capfd.readouterr()
    assert "Loading weights" not in out + err and "%|" not in out + err, (out + err)[-500:]


@pytest.mark.parametrize("path, needle", [(None, "model.net.pretrained_path: is not set"),
                                          ("/nowhere/roberta-base", "model.net.pretrained_path: no directory /nowhere/roberta-base")])
def test_missing_backbone_is_one_config_error(files, tmp_path, path, needle):
    cfg = make_cfg(_overrides(files, tmp_path, "cola", f"model.net.pretrained_path={path or 'null'}",
                              f"data.tokenizer_path={files / 'tok'}"), tmp_path)
    from fl_lightning.run.build import build

    with pytest.raises(ConfigError) as err:
        build(cfg, str(tmp_path))
    msg = str(err.value)
    assert needle in msg and "save_pretrained" in msg and "\n" not in msg


# ----------------------------------------------------------------------------------------------- GLUE


@pytest.mark.parametrize("task, metrics, primary", [("cola", ("test_mcc", "test_acc"), "test_mcc"),
                                                    ("mrpc", ("test_f1", "test_acc"), "test_f1")])
def test_glue_two_rounds_through_the_real_loader(files, tmp_path, task, metrics, primary):
    """The TSV files -> tokenized tensors -> a 2-round fedavg run; the task's official metric reaches metrics.csv
    and is the summary's primary metric; the upload is exactly the LoRA factors and the head; the frozen backbone
    is bit-identical to the saved weights after the rounds."""
    from transformers import AutoModelForSequenceClassification

    loop = build_loop(_overrides(files, tmp_path, task, "method=fedavg"), tmp_path)
    assert loop.data.info.input_shape == ((64,) if task == "cola" else (128,))
    before = {k: v.clone() for k, v in loop.global_params.items()}
    summary = loop.run(progress_enabled=False)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert len(rows) == 2 and all(rows[-1][m] != "" for m in metrics)
    assert summary["primary_metric"] == primary and summary["final"] == pytest.approx(float(rows[-1][primary]))
    # communicated: LoRA + head only, 32 bits each, every client each round (fedavg: P up per client)
    sent = _lora_and_head(loop.module)
    assert set(loop.global_params) == set(sent)
    bits = 32 * sum(p.numel() for p in sent.values()) * loop.S
    assert [int(r["round_uplink_bits"]) for r in rows] == [bits, bits]
    assert any(not torch.equal(before[k], loop.global_params[k]) for k in before)  # adapters/head trained
    src = AutoModelForSequenceClassification.from_pretrained(str(files / "roberta"), local_files_only=True)
    frozen = {n: p for n, p in loop.module.net.base_model.model.roberta.named_parameters() if not p.requires_grad}
    assert len(frozen) == len(dict(src.roberta.named_parameters()))
    for n, p in src.roberta.named_parameters():
        assert torch.equal(frozen[n] if n in frozen else frozen[_lora_base(n)], p), n


def _lora_base(name):
    """A frozen weight's name after peft wrapped its Linear (``....dense.weight`` -> ``....dense.base_layer.weight``)."""
    head, _, leaf = name.rpartition(".")
    return f"{head}.base_layer.{leaf}"


def test_glue_tokenized_once_and_cached(files, tmp_path):
    from fl_lightning.data.glue import glue

    cache = tmp_path / "cache"
    tr, te, info = glue("mrpc", str(files / "glue"), str(files / "roberta"), cache_dir=str(cache))
    stored = sorted(s for s in os.listdir(cache / "glue") if not s.startswith("."))  # .locks: fl_lightning/data/cache.py
    assert len(stored) == 2 and all(s.startswith("mrpc-") for s in stored)
    assert len(tr) == 64 and len(te) == 24  # the malformed row is skipped
    tr2, _, _ = glue("mrpc", str(files / "glue"), str(files / "roberta"), cache_dir=str(cache))
    assert torch.equal(tr.tensors["input_ids"], tr2.tensors["input_ids"])
    # the pair is encoded as RoBERTa does: <s> a </s></s> b </s> <pad>...
    ids = tr.tensors["input_ids"][0].tolist()
    assert ids[0] == 0 and ids.count(2) == 3 and ids[-1] == 1
    assert info.metrics == ("f1", "acc") and info.num_classes == 2


@pytest.mark.parametrize("task, header, row, expect", [
    ("sst2", ["sentence", "label"], ["a fine film", "1"], ("a fine film", None, 1)),
    ("qqp", ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"], ["1", "2", "3", "q one", "q two", "0"],
     ("q one", "q two", 0)),
    ("qnli", ["index", "question", "sentence", "label"], ["0", "who?", "him.", "not_entailment"], ("who?", "him.", 1)),
    ("rte", ["index", "sentence1", "sentence2", "label"], ["0", "a b", "c d", "entailment"], ("a b", "c d", 0)),
    ("mnli", ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"],
     ["0", "1", "1e", "fiction", "(", "(", "(", "(", "p", "h", "contradiction", "contradiction"], ("p", "h", 2)),
])
def test_glue_tsv_layouts(tmp_path, task, header, row, expect):
    """Each task's columns and label names as the GLUE download script writes them (HF datasets' label order)."""
    from fl_lightning.data.glue import TASKS, read_tsv

    folder, test_file, has_header, c1, c2, lab, labels, _ = TASKS[task]
    path = str(tmp_path / folder / test_file)
    _write(path, header, [row, [*row[:-1], "-"]])  # MNLI's '-' gold labels (no consensus) are skipped
    a, b, y = read_tsv(path, has_header, (c1, c2), lab, labels)
    assert (a[0], None if b is None else b[0], y[0]) == expect and len(y) == 1


def test_resume_onto_another_base_model_is_refused(files, tmp_path):
    """The checkpoint holds the frozen backbone's fingerprint: the same base model resumes, another one put at the
    same path (so the config hash is unchanged) is refused."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(files / "roberta", base)
    ov = [o.replace(str(files / "roberta"), str(base)) for o in _overrides(files, tmp_path, "cola", "method=fedavg")]
    loop = build_loop(ov, tmp_path / "run")
    loop.run(stop_after_rounds=1, progress_enabled=False)
    meta = json.load(open(tmp_path / "run" / "checkpoints" / "round_000001" / "meta.json"))
    assert meta["state"]["base_model"]["backbone"] == loop.module.net.backbone_fingerprint
    assert meta["state"]["base_model"]["tokenizer"] == dict(loop.data.info.provenance)["tokenizer_sha256"]
    assert build_loop(ov, tmp_path / "run2", resume=str(tmp_path / "run")).round == 1
    shutil.rmtree(base)
    _tiny_roberta(base, files / "tok", seed=1)
    with pytest.raises(ResumeError, match="another backbone"):
        build_loop(ov, tmp_path / "run3", resume=str(tmp_path / "run"))

# ----------------------------------------------------------------------------------------------- pydoc_topics


def test_pydoc_topics_end_to_end(tmp_path):
    """No files: the embedded corpus, an in-process tokenizer, a (briefly) MLM-pretrained small RoBERTa and a
    federated LoRA round; summary.json records the text's hash (computed here independently)."""
    from pydoc_data.topics import topics

    ov = ["experiment=glue_lora", "data=pydoc_topics", f"data.cache_dir={tmp_path / 'cache'}", "data.pretrain.steps=3",
          "data.backbone.hidden_size=32", "data.backbone.intermediate_size=64", "fl.rounds=1", "fl.local_steps=2",
          "trainer.progress=false", "trainer.accelerator=cpu"]
    loop = build_loop(ov, tmp_path / "run")
    info = loop.data.info
    assert info.num_classes == 10 and len(loop.data.train) + len(loop.data.test) > 1000
    assert json.load(open(os.path.join(info.pretrained_path, "fl_lightning_pretraining.json")))["pretrained"]
    summary = loop.run(progress_enabled=False)
    text = json.dumps(topics, sort_keys=True, ensure_ascii=False)
    assert summary["data_text_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert json.load(open(tmp_path / "run" / "summary.json"))["data_topics"].split(",")[0] == "types"
    assert 0.0 <= summary["final_test_acc"] <= 1.0 and summary["primary_metric"] == "test_acc"
    # the test sentences never reach the unlabelled corpus the tokenizer and the backbone were trained on
    from fl_lightning.data.pydoc_topics import split

    texts, labels, names, tr, te, unlabelled = split(topics, 10, 0.2)
    assert len(te) == len(loop.data.test) and not {texts[i] for i in te} & set(unlabelled)
    assert {texts[i] for i in tr} <= set(unlabelled) and len(set(labels)) == 10


TINY = {"backbone": {"hidden_size": 32, "layers": 1, "heads": 2, "intermediate_size": 64},
        "pretrain": {"steps": 4, "batch_size": 8}}


def test_pydoc_topics_pretraining_is_cached_and_keyed_by_its_recipe(tmp_path, monkeypatch, caplog):
    """The MLM pre-training runs once: a second call finds the cached backbone and trains nothing; a change of the
    recipe (its settings or its code's version, ``pretrain.RECIPE``) gives another cache entry, not the old one.
    Off a terminal the progress is a few log lines, never a bar's control codes."""
    import fl_lightning.data.pydoc_topics as pt

    calls = []
    real = pt.mlm_pretrain
    monkeypatch.setattr(pt, "mlm_pretrain", lambda *a, **k: (calls.append(k), real(*a, **k))[1])
    with caplog.at_level("INFO", logger="fl_lightning"):
        first = pt.pydoc_topics(cache_dir=str(tmp_path), **TINY)[2].pretrained_path
    assert len(calls) == 1 and calls[0]["steps"] == 4 and calls[0]["batch_size"] == 8
    made = json.load(open(os.path.join(first, "fl_lightning_pretraining.json")))
    assert made["pretrained"] and made["recipe"] == pt.RECIPE and made["steps"] == 4
    lines = [r.getMessage() for r in caplog.records if "pre-training" in r.getMessage()]
    assert 1 <= len(lines) <= 6 and "4 steps in" in lines[-1], lines
    assert not any("\x1b" in m for m in lines)
    assert pt.pydoc_topics(cache_dir=str(tmp_path), **TINY)[2].pretrained_path == first and len(calls) == 1
    other = pt.pydoc_topics(cache_dir=str(tmp_path), **{**TINY, "pretrain": {"steps": 5, "batch_size": 8}})
    assert other[2].pretrained_path != first and len(calls) == 2
    monkeypatch.setattr(pt, "RECIPE", pt.RECIPE + 1)
    assert pt.pydoc_topics(cache_dir=str(tmp_path), **TINY)[2].pretrained_path not in (first, other[2].pretrained_path)
    assert len(calls) == 3


def test_step_progress_draws_only_on_a_terminal_and_when_enabled():
    """The pre-training's bar: drawn (with its ETA) on a terminal; nothing written to a non-terminal stream or
    with ``trainer.progress=false``."""
    import io

    from rich.console import Console

    from fl_lightning.progress import StepProgress, set_enabled

    set_enabled(True)  # the default (a run in this process may have set trainer.progress=false)
    for terminal, enabled in ((False, True), (True, False)):
        buf = io.StringIO()
        with StepProgress("MLM pre-training", 10, enabled, Console(file=buf, force_terminal=terminal)) as bar:
            bar.update(5, "loss 1.0")
            assert not bar.live
        assert buf.getvalue() == ""
    buf = io.StringIO()
    with StepProgress("MLM pre-training", 10, console=Console(file=buf, force_terminal=True, width=120)) as bar:
        assert bar.live
        bar.update(10, "loss 1.0")
    assert "MLM pre-training" in buf.getvalue() and "10/10" in buf.getvalue() and "ETA" in buf.getvalue()
    try:
        set_enabled(False)
        assert not StepProgress("x", 1, console=Console(file=io.StringIO(), force_terminal=True)).live
    finally:
        set_enabled(True)


def test_pydoc_topics_sentences_drop_rules_and_code():
    from fl_lightning.data.pydoc_topics import sentences

    text = "Title\n*****\n\nFirst sentence has five words. Second one also has five words!\n\n>>> x = 1 + 2 + 3 + 4\n"
    assert sentences(text) == ["First sentence has five words.", "Second one also has five words!"]


# ----------------------------------------------------------------------------------------------- as a user types it


@pytest.mark.slow
def test_cli_glue_without_files_is_one_line(tmp_path):
    p = run_cli(["experiment=glue_lora", "data.source=tsv", f"data.root={tmp_path / 'glue'}", f"run_dir={tmp_path / 'run'}"])
    one_line_error(p, "data.root: no RTE/ directory under", "put the GLUE task folders there")


@pytest.mark.slow
def test_cli_glue_with_files_and_pydoc_topics(files, tmp_path):
    p = run_cli(["experiment=glue_lora", "data.task=cola", "data.source=tsv", f"data.root={files / 'glue'}", f"data.cache_dir={tmp_path}",
                 "model.net.pretrained_path=null", f"data.tokenizer_path={files / 'tok'}", f"run_dir={tmp_path / 'a'}"])
    one_line_error(p, "model.net.pretrained_path: is not set", "save_pretrained directory of roberta-base")
    p = run_cli(["experiment=glue_lora", "data.task=cola", "data.source=tsv", f"data.root={files / 'glue'}", f"data.cache_dir={tmp_path}",
                 f"model.net.pretrained_path={files / 'roberta'}", "fl.rounds=1", "fl.local_steps=2",
                 "trainer.progress=false", f"run_dir={tmp_path / 'b'}"])
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.load(open(tmp_path / "b" / "summary.json"))
    assert summary["primary_metric"] == "test_mcc" and "final_test_acc" in summary
    p = run_cli(["experiment=glue_lora", "data=pydoc_topics", f"data.cache_dir={tmp_path}", "data.pretrain.steps=2",
                 "data.backbone.hidden_size=32", "fl.rounds=1", "fl.local_steps=2", "trainer.progress=false",
                 f"run_dir={tmp_path / 'c'}"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.load(open(tmp_path / "c" / "summary.json"))["backbone_pretrained"] == "true"


# ----------------------------------------------------------------------------------------------- Sentiment140 + RNN


def _sentiment140(root, n_train=400):
    """The two CSVs of trainingandtestdata.zip (latin-1, every field quoted), with a few neutral test tweets."""
    import random

    from fl_lightning.data.sentiment140 import TEST_FILE, TRAIN_FILE

    rnd = random.Random(0)
    good, bad = ["love", "great", "happy", "awesome"], ["hate", "awful", "sad", "terrible"]

    def rows(n, neutral):
        out = []
        for i in range(n):
            pol = [0, 4, 2][i % 3] if neutral else [0, 4][i % 2]
            word = rnd.choice(good if pol == 4 else bad) if pol != 2 else "the"
            out.append([str(pol), str(i), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", f"user{i % 7}",
                        f"@friend i {word} this caf\xe9 http://t.co/x {rnd.choice(['today', 'now', '!'])}"])
        return out

    os.makedirs(root, exist_ok=True)
    for name, data in ((TRAIN_FILE, rows(n_train, False)), (TEST_FILE, rows(30, True))):
        with open(os.path.join(root, name), "w", encoding="latin-1", newline="") as f:
            csv.writer(f, quoting=csv.QUOTE_ALL).writerows(data)


def test_sentiment140_loader_subsamples_and_drops_neutral(tmp_path):
    from fl_lightning.data.sentiment140 import sentiment140, words

    _sentiment140(tmp_path / "s140")
    tr, te, info = sentiment140(str(tmp_path / "s140"), fraction=0.1, cache_dir=str(tmp_path / "cache"))
    assert len(tr) == 40 and len(te) == 20  # 1 of 10 training tweets; the 10 neutral test tweets dropped
    assert set(te.labels.tolist()) == {0, 1} and info.num_classes == 2
    vocab = open(info.tokenizer_path, encoding="utf-8").read().split("\n")
    assert vocab[:2] == ["<pad>", "<unk>"] and "<user>" in vocab and "<url>" in vocab and len(vocab) - 1 == info.vocab_size
    assert words("@bob I LOVE it!! http://x.y/z") == ["<user>", "i", "love", "it", "!", "!", "<url>"]
    ids = tr.tensors["input_ids"][0]
    assert ids[0] == vocab.index("<user>") and ids[-1] == 0  # padded at the end


def test_elman_rnn_is_seed_003s_shape_and_reads_the_last_token():
    from fl_lightning.data.info import DataInfo
    from fl_lightning.models.rnn import elman_rnn

    net = elman_rnn(DataInfo(input_shape=(64,), num_classes=2, vocab_size=1000))
    assert net.rnn.weight_ih_l0.shape == (4096, 300) and net.rnn.weight_hh_l0.shape == (4096, 4096)
    assert net.fc.weight.shape == (2, 4096) and net.embedding.weight.requires_grad
    small = elman_rnn(DataInfo(input_shape=(6,), num_classes=2, vocab_size=50), embed_dim=8, hidden=16)
    a = torch.tensor([[5, 7, 9, 0, 0, 0]])
    b = torch.tensor([[5, 7, 9, 11, 12, 0]])
    # by hand: h_t = tanh(W_ih e_t + b_ih + W_hh h_{t-1} + b_hh), logits = fc(h at the last real token)
    with torch.no_grad():
        h = torch.zeros(16)
        for t in (5, 7, 9):
            e = small.embedding.weight[t]
            h = torch.tanh(small.rnn.weight_ih_l0 @ e + small.rnn.bias_ih_l0 + small.rnn.weight_hh_l0 @ h + small.rnn.bias_hh_l0)
        assert torch.allclose(small(a)[0], small.fc(h), atol=1e-5)
        assert not torch.allclose(small(b)[0], small.fc(h), atol=1e-3)


def test_sentiment140_glove_and_two_rounds(tmp_path):
    """The CSVs through the real loader, GloVe rows from a local text file, a 2-round fedavg run with accuracy."""
    _sentiment140(tmp_path / "s140")
    glove = tmp_path / "glove.txt"
    glove.write_text("love 1 2 3 4\nhate -1 -2 -3 -4\nunseenword 9 9 9 9\n")
    ov = ["model=elman_rnn", "data=sentiment140", f"data.root={tmp_path / 's140'}", "data.fraction=0.5",
          f"data.cache_dir={tmp_path / 'cache'}", "model.net.embed_dim=4", "model.net.hidden=32",
          f"model.net.glove_path={glove}", "model.net.freeze_embeddings=true", "fl.num_clients=4",
          "fl.clients_per_round=4", "fl.rounds=2", "fl.local_steps=3", "data.batch_size=16", "trainer.progress=false",
          "trainer.accelerator=cpu", "method=fedavg", "method.lr=0.1"]
    loop = build_loop(ov, tmp_path / "run")
    vocab = open(loop.data.info.tokenizer_path, encoding="utf-8").read().split("\n")
    emb = loop.module.net.embedding.weight
    assert emb[vocab.index("love")].tolist() == [1, 2, 3, 4] and emb[vocab.index("hate")].tolist() == [-1, -2, -3, -4]
    assert "net.embedding.weight" not in loop.global_params  # frozen: neither trained nor sent
    summary = loop.run(progress_enabled=False)
    assert summary["primary_metric"] == "test_acc" and 0.0 <= summary["final_test_acc"] <= 1.0
    assert torch.equal(emb[vocab.index("love")], torch.tensor([1.0, 2, 3, 4]))


def test_natural_partition_client_is_user(tmp_path):
    """data/partition=natural with fl.num_clients=auto: one client per user of the subsample (counted here from the
    CSV independently), each holding exactly that user's tweets; a fixed count that differs is one config error."""
    from fl_lightning.data.sentiment140 import TRAIN_FILE

    _sentiment140(tmp_path / "s140", n_train=200)
    ov = ["model=elman_rnn", "data=sentiment140", f"data.root={tmp_path / 's140'}", "data.fraction=1.0",
          f"data.cache_dir={tmp_path / 'cache'}", "model.net.embed_dim=4", "model.net.hidden=8", "data/partition=natural",
          "fl.num_clients=auto", "fl.clients_per_round=3", "fl.rounds=1", "fl.local_steps=1", "data.batch_size=8",
          "trainer.progress=false", "trainer.accelerator=cpu", "method=fedavg"]
    loop = build_loop(ov, tmp_path / "run")
    rows = list(csv.reader(open(tmp_path / "s140" / TRAIN_FILE, encoding="latin-1")))
    users = sorted({r[4] for r in rows})
    assert loop.n == len(users) == 7
    for c, u in enumerate(users):
        texts = sorted(r[5] for r in rows if r[4] == u)
        assert loop.data.num_samples(c) == len(texts)
    loop.run(progress_enabled=False)
    with pytest.raises(ConfigError, match="fl.num_clients: is 5 but the partition by natural groups gives 7 clients"):
        build_loop([o.replace("fl.num_clients=auto", "fl.num_clients=5") for o in ov], tmp_path / "run2")
    with pytest.raises(ConfigError, match="fl.num_clients: auto needs a partition by natural groups"):
        build_loop([o.replace("data/partition=natural", "data/partition=iid") for o in ov], tmp_path / "run3")
