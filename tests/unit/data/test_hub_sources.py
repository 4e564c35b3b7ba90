"""Data and weights the way the field gets them (issue 62): GLUE and C4 by their hub names and RoBERTa / the T5
tokenizer by their ``org/name`` ids, from a Hugging Face cache the test writes in the hub cache's own layout
(``<kind>s--org--name/snapshots/<rev>/...`` + ``refs/main``) under a temporary ``HF_HOME``; nothing may open a
socket. The same examples through the GLUE TSV reader and through ``datasets`` give the same tensors."""
from __future__ import annotations

import csv
import gzip
import json
import logging
import os
import random
import socket

import pytest
import torch

from fl_lightning.errors import ConfigError
from tests.helpers.cli import build_loop, cli_in_process, make_cfg, one_line_error
from tests.unit.data.test_text import CORPUS, _tiny_roberta, _tokenizer, _write

from tests.helpers.hub_cache import REV, snapshot  # noqa: F401 (REV: the snapshot's revision)


def rte_rows(n: int, seed: int) -> list[tuple[str, str, int]]:
    rnd = random.Random(seed)
    return [(rnd.choice(CORPUS), rnd.choice(CORPUS), i % 2) for i in range(n)]


def write_glue(home, tsv_root, splits: dict) -> None:
    """RTE as nyu-mll/glue holds it (``rte/<split>-00000-of-00001.parquet``, label 0 = entailment, -1 = unlabelled
    test rows) and as the GLUE download script writes it (``RTE/train.tsv``, ``RTE/dev.tsv``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    snap = snapshot(home, "dataset", "nyu-mll/glue")
    os.makedirs(os.path.join(snap, "rte"), exist_ok=True)
    for split, rows in splits.items():
        table = pa.table({"sentence1": [a for a, _, _ in rows], "sentence2": [b for _, b, _ in rows],
                          "label": pa.array([y for _, _, y in rows], pa.int64()),
                          "idx": pa.array(range(len(rows)), pa.int32())})
        pq.write_table(table, os.path.join(snap, "rte", f"{split}-00000-of-00001.parquet"))
        if split != "test":
            names = ("entailment", "not_entailment")
            _write(os.path.join(tsv_root, "RTE", "train.tsv" if split == "train" else "dev.tsv"),
                   ["index", "sentence1", "sentence2", "label"], [[i, a, b, names[y]] for i, (a, b, y) in enumerate(rows)])


def c4_docs(n: int, seed: int) -> list[dict]:
    rnd = random.Random(seed)
    return [{"text": " ".join(rnd.choice(CORPUS) for _ in range(3)), "url": f"https://site{i % 3}.example/{i}",
             "timestamp": "2019-04-25T12:57:54Z"} for i in range(n)]


def write_c4(home, files_root) -> None:
    """allenai/c4's ``en/c4-train.00000-of-01024.json.gz`` and ``en/c4-validation.00000-of-00008.json.gz`` in the hub
    cache, and the same files in a local folder (``source: files``)."""
    snap = snapshot(home, "dataset", "allenai/c4")
    os.makedirs(os.path.join(snap, "en"), exist_ok=True)
    os.makedirs(files_root, exist_ok=True)
    for name, docs in (("c4-train.00000-of-01024.json.gz", c4_docs(60, 1)),
                       ("c4-validation.00000-of-00008.json.gz", c4_docs(30, 2))):
        for folder in (os.path.join(snap, "en"), files_root):
            with gzip.open(os.path.join(folder, name), "wt", encoding="utf-8") as f:
                f.writelines(json.dumps(d) + "\n" for d in docs)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A Hugging Face home holding nyu-mll/glue (rte), allenai/c4 (one shard per split), FacebookAI/roberta-base (a
    tiny random one with a trained BPE tokenizer) and google-t5/t5-base (a tokenizer); the same data as local files."""
    root = tmp_path_factory.mktemp("hub")
    home = root / "hf"
    _tokenizer(root / "tok")
    _tiny_roberta(snapshot(home, "model", "FacebookAI/roberta-base"), root / "tok")
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(root / "tok"), local_files_only=True).save_pretrained(
        snapshot(home, "model", "google-t5/t5-base"))
    write_glue(home, root / "glue", {"train": rte_rows(40, 0), "validation": rte_rows(12, 1), "test": [("x", "y", -1)] * 3})
    write_c4(home, root / "c4")
    return root


@pytest.fixture
def hub_home(cache, monkeypatch, tmp_path):
    """HF_HOME = the fixture's cache, FL_CACHE_DIR a fresh folder, no local weights folder, and no socket."""
    monkeypatch.setenv("HF_HOME", str(cache / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("FL_CACHE_DIR", str(tmp_path / "fl_cache"))
    monkeypatch.setenv("FL_WEIGHTS_ROOT", str(tmp_path / "no_weights"))
    monkeypatch.delenv("FL_ROBERTA_PATH", raising=False)
    monkeypatch.delenv("FL_T5_TOKENIZER", raising=False)
    monkeypatch.setenv("FL_DOWNLOAD", "0")

    def refuse(*args, **kwargs):
        raise AssertionError("a socket was opened")

    monkeypatch.setattr(socket, "socket", refuse)
    return cache


def test_glue_from_the_hub_cache_equals_the_tsv_files(hub_home, tmp_path):
    """RTE by name (nyu-mll/glue) through ``datasets`` and the same rows as GLUE TSV files: the same tensors; the
    unlabelled test split is not read; the tokenized tensors are cached by the data's fingerprint."""
    from fl_lightning.data.glue import glue

    common = dict(task="rte", tokenizer_path="FacebookAI/roberta-base", cache_dir=str(tmp_path / "c"))
    tr_hub, te_hub, info_hub = glue(source="hub", **common)
    tr_tsv, te_tsv, info_tsv = glue(source="tsv", root=str(hub_home / "glue"), **common)
    for a, b in ((tr_hub, tr_tsv), (te_hub, te_tsv)):
        assert set(a.tensors) == set(b.tensors) == {"input_ids", "attention_mask", "y"}
        for k in a.tensors:
            assert torch.equal(a.tensors[k], b.tensors[k]), k
    # independently: the labels as written, the first pair tokenized by the tokenizer itself
    rows = rte_rows(40, 0)
    assert tr_hub.tensors["y"].tolist() == [y for _, _, y in rows] and len(te_hub) == 12
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.join(hub_home / "hf", "hub", "models--FacebookAI--roberta-base",
                                                     "snapshots", REV), local_files_only=True)
    ids = tok(rows[0][0], rows[0][1], padding="max_length", truncation=True, max_length=128)["input_ids"]
    assert tr_hub.tensors["input_ids"][0].tolist() == ids
    prov = dict(info_hub.provenance)
    assert prov["data_source"] == "hub" and info_hub.tokenizer_path == "FacebookAI/roberta-base"
    entries = sorted(os.listdir(tmp_path / "c" / "glue"))
    fp = prov["data_fingerprint"].split("/")
    assert any(fp[0] in e and e.startswith("rte-train-") for e in entries)


def test_glue_from_a_save_to_disk_folder(hub_home, tmp_path):
    import datasets

    from fl_lightning.data.glue import glue

    rows = rte_rows(10, 5)
    d = {"sentence1": [a for a, _, _ in rows], "sentence2": [b for _, b, _ in rows], "label": [y for _, _, y in rows]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(d), "validation": datasets.Dataset.from_dict(d)}
                         ).save_to_disk(str(tmp_path / "disk" / "rte"))
    tr, te, _ = glue(task="rte", source="disk", root=str(tmp_path / "disk"), tokenizer_path="FacebookAI/roberta-base",
                     cache_dir=None)
    assert tr.tensors["y"].tolist() == te.tensors["y"].tolist() == [y for _, _, y in rows]


def test_glue_lora_on_rte_runs_from_the_cache_with_no_path(hub_home, tmp_path):
    """The issue's "done when": ``experiment=glue_lora data.task=rte`` with nyu-mll/glue and FacebookAI/roberta-base
    in the cache, no path given, two rounds."""
    loop = build_loop(["experiment=glue_lora", "data.task=rte", "fl.rounds=2", "fl.local_steps=2", "fl.eval_every=1",
                       "data.batch_size=4", "trainer.progress=false", "trainer.accelerator=cpu"], tmp_path / "run")
    assert loop.module.net.base_model.model.config.hidden_size == 32  # the tiny cached backbone, by its id
    summary = loop.run(progress_enabled=False)
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert len(rows) == 2 and 0.0 <= float(rows[-1]["test_acc"]) <= 1.0
    assert summary["primary_metric"] == "test_acc"


def test_c4_from_the_hub_cache_equals_the_local_shards(hub_home, tmp_path):
    """allenai/c4 en by name (only the first shard of each split) and the same shards as local files: the same
    packed sequences; the T5 tokenizer by its id."""
    from fl_lightning.data.c4 import c4

    common = dict(tokenizer_path="google-t5/t5-base", seq_len=16, eval_sequences=8, max_train_shards=1,
                  max_val_shards=1)
    hub_sets = c4(source="hub", cache_dir=str(tmp_path / "a"), **common)
    file_sets = c4(source="files", root=str(hub_home / "c4"), cache_dir=str(tmp_path / "b"), **common)
    for a, b in zip(hub_sets[:2], file_sets[:2]):
        assert len(a) == len(b) > 0
        batch = torch.arange(len(a))
        x, y = a.batch(batch, "cpu"), b.batch(batch, "cpu")
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_a_missing_item_is_one_line_naming_it_the_cache_and_the_fetch(hub_home, tmp_path, monkeypatch):
    """Exit 2, one line: the id, the cache folder looked in, ``download=true`` / ``hf download``; no socket."""
    empty = tmp_path / "empty_home"
    monkeypatch.setenv("HF_HOME", str(empty))
    p = cli_in_process(["experiment=glue_lora", "data.task=rte", "fl.rounds=1", "trainer.accelerator=cpu"],
                       tmp_path / "run")
    line = one_line_error(p, "nyu-mll/glue is not in the Hugging Face cache",
                          f"looked in {empty}/hub/datasets--nyu-mll--glue", "download=true",
                          "hf download nyu-mll/glue --include 'rte/train-*.parquet' --include 'rte/validation-*.parquet' "
                          "--repo-type dataset")
    assert "data.source:" in line
    write_glue(empty, tmp_path / "glue", {"train": rte_rows(8, 0), "validation": rte_rows(4, 1)})
    p = cli_in_process(["experiment=glue_lora", "data.task=rte", "fl.rounds=1", "trainer.accelerator=cpu"],
                       tmp_path / "run2")
    one_line_error(p, "model.net.pretrained_path (via data.tokenizer_path):",
                   "FacebookAI/roberta-base is not in the Hugging Face cache",
                   f"{empty}/hub/models--FacebookAI--roberta-base", "hf download FacebookAI/roberta-base")


def test_download_true_without_a_network_is_one_line(hub_home, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    p = cli_in_process(["experiment=glue_lora", "data.task=rte", "download=true", "fl.rounds=1",
                        "trainer.accelerator=cpu"], tmp_path / "run")
    one_line_error(p, "data.source: could not download nyu-mll/glue", "without download=true")


def test_the_old_opt_ins_still_work_with_one_deprecation_line(hub_home, tmp_path, caplog):
    """``hub_offline: false`` and ``data.download: true`` still opt in, each with one warning line (and
    ``download=true`` is what the line asks for)."""
    from fl_lightning.data import hub

    hub._warned.clear()
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        from fl_lightning.data.glue import glue

        glue(task="rte", source="hub", tokenizer_path="FacebookAI/roberta-base", cache_dir=None, hub_offline=False)
        glue(task="rte", source="hub", tokenizer_path="FacebookAI/roberta-base", cache_dir=None, hub_offline=False)
        from fl_lightning.data.vision import cifar10

        cifar10(str(tmp_path), download=True, fake=True)
    lines = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert lines == ["data.hub_offline is deprecated and still works; use the top-level download=true (it fetches "
                     "everything the run needs)",
                     "data.download is deprecated and still works; use the top-level download=true (it fetches "
                     "everything the run needs)"], lines
    assert hub.allow_fetch("data.download", False, lambda v: v is True) is False  # the default opts in to nothing


def test_source_tsv_hashes_as_absent_and_an_old_run_resumes_as_tsv(tmp_path):
    """A GLUE run saved before ``data.source`` (its config has no such key) has the hash of ``data.source=tsv``;
    resuming it with today's default (hub) takes ``tsv`` back, the way ``ns_dtype: auto`` inherits."""
    from omegaconf import OmegaConf, open_dict

    from fl_lightning.config import config_hash
    from fl_lightning.data.hub import inherit_source

    tsv = make_cfg(["experiment=glue_lora", "data.source=tsv"])
    old = make_cfg(["experiment=glue_lora", "data.source=tsv"])
    with open_dict(old.data):
        del old.data["source"]
    assert config_hash(old) == config_hash(tsv)
    hub_cfg = make_cfg(["experiment=glue_lora"])
    assert config_hash(hub_cfg) != config_hash(tsv)
    saved = OmegaConf.create(OmegaConf.to_container(old))
    assert inherit_source(hub_cfg, saved) and hub_cfg.data.source == "tsv"
    assert config_hash(hub_cfg) == config_hash(old)
    c4_cfg, c4_old = make_cfg(["data=c4"]), make_cfg(["data=c4"])
    with open_dict(c4_old.data):
        del c4_old.data["source"]
    assert inherit_source(c4_cfg, c4_old) and c4_cfg.data.source == "files"
    assert not inherit_source(c4_cfg, c4_cfg)  # a run that saved its source keeps it


def test_download_is_outside_the_result_hash():
    from fl_lightning.config import config_hash

    assert config_hash(make_cfg(["download=true"])) == config_hash(make_cfg([]))


def test_bad_source_is_one_line():
    with pytest.raises(ConfigError, match="source"):
        from fl_lightning.data.glue import glue

        glue(source="web")


def test_one_download_per_node(tmp_path, monkeypatch):
    """Four workers of one node asking for the same missing file with download=true: one fetches it under the file
    lock (data/cache.py's), the others wait and read it from the cache; all get the same path."""
    import threading
    import time

    import huggingface_hub

    from fl_lightning.data import hub

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("FL_CACHE_DIR", str(tmp_path / "fl"))
    calls = []

    def fake_download(repo, filename, repo_type=None, cache_dir=None, **kw):  # the hub's downloader, offline
        calls.append(repo)
        time.sleep(0.3)
        folder = os.path.join(cache_dir, f"models--{repo.replace('/', '--')}")
        os.makedirs(os.path.join(folder, "refs"), exist_ok=True)
        os.makedirs(os.path.join(folder, "snapshots", REV), exist_ok=True)
        with open(os.path.join(folder, "snapshots", REV, filename), "w") as f:
            f.write("weights")
        with open(os.path.join(folder, "refs", "main"), "w") as f:
            f.write(REV)
        return os.path.join(folder, "snapshots", REV, filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    got = []
    workers = [threading.Thread(target=lambda: got.append(hub.resolve_file("org/w", "model.safetensors", "k",
                                                                           fetch=True))) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert calls == ["org/w"] and len(got) == 4 and len(set(got)) == 1 and open(got[0]).read() == "weights"


def test_download_switch_reaches_torchvision(tmp_path, monkeypatch):
    """Without download=true a missing CIFAR-10 is a one-line miss and no socket is opened; with it torchvision is
    asked to fetch (here the network is absent: one line too)."""
    from fl_lightning.data.vision import cifar10

    def refuse(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setenv("FL_CACHE_DIR", str(tmp_path / "fl"))
    monkeypatch.setenv("FL_DOWNLOAD", "0")
    opened = []
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: opened.append(a) or refuse())
    with pytest.raises(ConfigError, match="CIFAR10 not found under") as err:
        cifar10(str(tmp_path / "data"))
    assert "add download=true" in str(err.value) and not opened
    monkeypatch.setenv("FL_DOWNLOAD", "1")
    with pytest.raises(ConfigError, match="could not download CIFAR10") as err:
        cifar10(str(tmp_path / "data"))
    assert "\n" not in str(err.value) and opened


def test_an_old_glue_run_resumes_as_tsv_through_the_resume_check(tmp_path):
    """``run_dir.resume_config`` on a run directory whose saved config predates ``data.source``: accepted (no
    difference in a result key), and the run continues reading TSV files."""
    from omegaconf import OmegaConf, open_dict

    from fl_lightning.run.run_dir import resume_config

    old = make_cfg(["experiment=glue_lora", "data.source=tsv"])
    with open_dict(old.data):
        del old.data["source"]
    OmegaConf.save(old, tmp_path / "config.yaml")
    now = resume_config(make_cfg(["experiment=glue_lora"]), str(tmp_path), force=False)
    assert now.data.source == "tsv"
