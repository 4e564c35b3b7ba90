"""Fabricated text corpora in the real on-disk formats: C4 ``c4-*.json.gz`` shards, LEAF Shakespeare json, and a
small BPE tokenizer trained in-process (a ``save_pretrained`` directory), from CPython's pydoc topics."""
from __future__ import annotations

import gzip
import json
import os


def pydoc_paragraphs() -> list[str]:
    from fl_lightning.data.pydoc_topics import corpus

    topics, _ = corpus()
    return [p.strip() for k in sorted(topics) for p in topics[k].split("\n\n") if len(p.strip()) > 40]


def bpe_tokenizer(out_dir: str, vocab_size: int = 300) -> str:
    from fl_lightning.data.pretrain import train_tokenizer

    if not os.path.isdir(out_dir):
        train_tokenizer(pydoc_paragraphs()[:400], out_dir, vocab_size)
    return out_dir


def c4_shards(root: str, train_docs: int = 240, val_docs: int = 60, hosts: int = 6) -> str:
    """``c4-train.00000-of-00001.json.gz`` and ``c4-validation.00000-of-00001.json.gz`` under ``root``."""
    paras = pydoc_paragraphs()
    os.makedirs(root, exist_ok=True)
    for name, start, count in (("train", 0, train_docs), ("validation", train_docs, val_docs)):
        with gzip.open(os.path.join(root, f"c4-{name}.00000-of-00001.json.gz"), "wt", encoding="utf-8") as f:
            for i in range(start, start + count):
                doc = {"text": paras[i % len(paras)], "url": f"https://site{i % hosts}.example.org/page/{i}",
                       "timestamp": "2019-04-25T12:57:54Z"}
                f.write(json.dumps(doc) + "\n")
    return root


def leaf_shakespeare(root: str, roles: dict[str, tuple[int, int]]) -> str:
    """LEAF ``train/`` and ``test/`` json under ``root``: role -> (train samples, test samples), each sample an
    80-character window of a pydoc paragraph and its next character (with a character outside LEAF's alphabet)."""
    text = "\t".join(pydoc_paragraphs())
    for split, which in (("train", 0), ("test", 1)):
        os.makedirs(os.path.join(root, split), exist_ok=True)
        users = list(roles)
        data, offset = {}, 0
        for u in users:
            n = roles[u][which]
            data[u] = {"x": [text[offset + i:offset + i + 80] for i in range(n)],
                       "y": [text[offset + i + 80] for i in range(n)]}
            offset += n + 80
        with open(os.path.join(root, split, f"all_data_niid_0_keep_0_{split}_9.json"), "w") as f:
            json.dump({"users": users, "num_samples": [roles[u][which] for u in users], "user_data": data}, f)
    return root
