"""C4 from fabricated ``c4-*.json.gz`` shards (tokenized once, memory-mapped, packed; exact resume; non-IID by
URL host; one-line errors) and LEAF Shakespeare from fabricated json (issue 10)."""
from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest
import torch

from tests.helpers.cli import build_error, build_loop, metric_rows, saved_model
from tests.helpers.text_files import bpe_tokenizer, c4_shards


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("c4")
    return {"root": c4_shards(str(d / "c4")), "tok": bpe_tokenizer(str(d / "tok")), "cache": str(d / "cache")}


def c4_args(c):
    return ["model=llama_tiny", "data=c4", "data.source=files", f"data.root={c['root']}", f"data.tokenizer_path={c['tok']}",
            f"data.cache_dir={c['cache']}", "data.seq_len=32", "data.eval_sequences=8", "data.batch_size=4",
            "fl.num_clients=4", "fl.clients_per_round=2", "fl.local_steps=2", "fl.rounds=2", "trainer.progress=false",
            "trainer.accelerator=cpu", "method=local_adamw", "method.lr=3e-3"]


def test_c4_packs_the_documents_token_stream(corpus, tmp_path):
    """The packed rows are the shard's documents tokenized independently, each followed by </s>, concatenated
    and cut into seq_len rows; the token file is uint16 and memory-mapped; a second build reads the cache."""
    from fl_lightning.data.c4 import c4
    from fl_lightning.data.text import load_tokenizer

    train, test, info = c4(corpus["root"], corpus["tok"], seq_len=32, eval_sequences=8, cache_dir=corpus["cache"])
    tok = load_tokenizer(corpus["tok"])
    stream = []
    with gzip.open(os.path.join(corpus["root"], "c4-train.00000-of-00001.json.gz"), "rt") as f:
        for line in f:
            stream += tok(json.loads(line)["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    n = len(stream) // 32
    assert len(train) == n and len(test) == 8 and info.vocab_size == len(tok)
    assert isinstance(train.rows, np.memmap) and train.rows.dtype == np.uint16
    idx = torch.tensor([n - 1, 0, 5])
    got = train.batch(idx, "cpu")["input_ids"]
    assert got.tolist() == [stream[i * 32:(i + 1) * 32] for i in idx.tolist()]
    mtime = os.path.getmtime(os.path.join(train.folder, "tokens.bin"))
    again, _, _ = c4(corpus["root"], corpus["tok"], seq_len=16, eval_sequences=8, cache_dir=corpus["cache"])
    assert again.folder == train.folder and os.path.getmtime(os.path.join(again.folder, "tokens.bin")) == mtime
    assert len(again) == len(stream) // 16  # the same tokens, packed at another length


def test_c4_run_resumes_bit_exactly(corpus, tmp_path):
    """A 2-round LLaMA run on the fabricated shard; stopping after round 1 and resuming gives the same model
    and metrics bit for bit."""
    args = c4_args(corpus)
    build_loop(args, tmp_path / "straight").run(progress_enabled=False)
    build_loop(args, tmp_path / "chunked").run(stop_after_rounds=1, progress_enabled=False)
    resumed = build_loop(args, tmp_path / "resumed", resume=str(tmp_path / "chunked"))
    assert resumed.round == 1
    resumed.run(progress_enabled=False)
    a, b = saved_model(tmp_path / "straight", 2), saved_model(tmp_path / "resumed", 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = metric_rows(tmp_path / "straight")
    assert rows == metric_rows(tmp_path / "resumed") and len(rows) == 2
    assert float(rows[-1]["test_ppl"]) < float(rows[0]["test_ppl"]) < 300  # the vocabulary is 300


def test_c4_partition_by_url_host_keeps_each_host_on_one_client(corpus, tmp_path):
    loop = build_loop(c4_args(corpus) + ["data/partition=by_group"], tmp_path)
    groups = loop.data.train.tensors["group"]
    owners = [set(groups[i].tolist()) for i in loop.data.client_indices]
    assert sum(len(o) for o in owners) == len(set(groups.tolist())) == 6  # every host on exactly one client
    assert all(owners) and sum(len(i) for i in loop.data.client_indices) == len(loop.data.train)


def test_c4_missing_files_are_one_line_errors(corpus, tmp_path):
    msg = build_error(c4_args(corpus) + [f"data.root={tmp_path}"], tmp_path / "run")
    assert "data.train_files" in msg and str(tmp_path) in msg and "c4-train.00000-of-01024.json.gz" in msg
    msg = build_error(c4_args(corpus) + [f"data.tokenizer_path={tmp_path}/t5"], tmp_path / "run")
    assert "data.tokenizer_path" in msg and "t5" in msg


def test_shakespeare_leaf_selection_and_natural_partition(tmp_path):
    """Roles with > 20 train and > 8 test samples (A, B, E; not C: too few train, not D: too few test), 2 chosen by
    RandomState(0), each cropped to 20 / 8 contiguous samples from RandomState(0 + c); client = role."""
    from fl_lightning.data.shakespeare import ALL_LETTERS
    from tests.helpers.text_files import leaf_shakespeare

    roles = {"A": (30, 12), "B": (25, 9), "C": (10, 12), "D": (40, 3), "E": (22, 10)}
    root = leaf_shakespeare(str(tmp_path / "leaf"), roles)
    args = ["model=char_lstm", "data=shakespeare", f"data.root={root}", "data.train_per_client=20",
            "data.test_per_client=8", "fl.num_clients=2", "fl.clients_per_round=2", "fl.local_steps=2", "fl.rounds=1",
            "data.batch_size=5", "trainer.progress=false", "trainer.accelerator=cpu"]
    loop = build_loop(args, tmp_path / "run")
    eligible = ["A", "B", "E"]
    np.random.RandomState(0).shuffle(eligible)
    with open(os.path.join(root, "train", "all_data_niid_0_keep_0_train_9.json")) as f:
        train = json.load(f)["user_data"]
    data = loop.data
    assert data.num_clients == 2 and dict(data.info.provenance)["data_roles"] == ",".join(eligible[:2])
    for c, role in enumerate(eligible[:2]):
        start = np.random.RandomState(c).randint(len(train[role]["y"]) - 20)
        rows = data.train.tensors["input_ids"][data.client_indices[c]]
        want = ["".join(ch if ch in ALL_LETTERS else " " for ch in s) for s in train[role]["x"][start:start + 20]]
        assert ["".join(ALL_LETTERS[i] for i in r.tolist()) for r in rows] == want
    assert len(data.test) == 16 and data.info.vocab_size == 80
    loop.run(progress_enabled=False)
    assert "data.roles" in build_error(args + ["fl.num_clients=4"], tmp_path / "bad2")


def test_by_group_deals_whole_groups_largest_first():
    """Groups 7, 2, 9, 4, 1 of sizes 5, 4, 3, 3, 1 on two clients, by hand (largest first, to the lighter client,
    ties to client 0): 7 → 0, 2 → 1, then a size-3 group → 1, the other → 0, 1 → 1: loads 8 and 8."""
    from fl_lightning.data.partition import by_group

    groups = np.repeat([7, 2, 9, 4, 1], [5, 4, 3, 3, 1])
    parts = by_group(np.zeros(len(groups)), 2, np.random.default_rng(0), groups=groups)
    assert sorted(np.concatenate(parts).tolist()) == list(range(16))
    assert sorted(len(p) for p in parts) == [8, 8]
    a, b = (set(groups[p].tolist()) for p in parts)
    assert 7 in a and len(a) == 2 and {2, 1} <= b and len(b) == 3 and a | b == {7, 2, 9, 4, 1}
