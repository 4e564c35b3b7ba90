"""Sentiment140 (Go, Bhayani & Huang, "Twitter Sentiment Classification using Distant Supervision", 2009) as seed 003
uses it (Zhang & Gao, "On Provable Benefits of Muon in Federated Learning", App. A.2): the 1.6 M-tweet training CSV
randomly subsampled to 1 % (≈ 16,000 tweets), the 498-tweet manual test set with its 139 neutral tweets dropped (the
paper's output is 2-way, Table 3; decision 003/#15 in docs/decisions.md), polarity 0 → 0, 4 → 1.

Files (nothing is downloaded), in ``root`` as unzipped from ``trainingandtestdata.zip``:
``training.1600000.processed.noemoticon.csv`` and ``testdata.manual.2009.06.14.csv`` (latin-1, columns polarity,
id, date, query, user, text). Tweets are lower-cased and split into words, @users, URLs, numbers and punctuation
(user mentions and URLs become ``<user>`` / ``<url>``, as GloVe's Twitter preprocessing does); the vocabulary is
the training subsample's words seen at least ``min_count`` times (id 0 = padding, 1 = unknown); sequences are
cut or zero-padded to ``max_length`` (64; not given by the paper, our choice, decision 003/#15). The subsample's
seed (``subsample_seed``) is fixed and independent of the run seed (the paper does not give it).
"""
from __future__ import annotations

import collections
import csv
import hashlib
import os
import re
import tempfile
from typing import Annotated

import numpy as np
import torch

from ..errors import ConfigError
from ..config import Range
from .info import DataInfo
from .tensors import TensorSet
from .cache import publish
from .text import default_cache_dir

TRAIN_FILE = "training.1600000.processed.noemoticon.csv"
TEST_FILE = "testdata.manual.2009.06.14.csv"
PAD, UNK = "<pad>", "<unk>"
_TOKEN = re.compile(r"<user>|<url>|[a-z0-9']+|[^\sa-z0-9']")


def words(text: str) -> list[str]:
    text = re.sub(r"https?://\S+|www\.\S+", " <url> ", text.lower())
    text = re.sub(r"@\w+", " <user> ", text)
    return _TOKEN.findall(text)


def read_csv(path: str) -> tuple[list[int], list[str], list[str]]:
    """(polarities, users, texts) of a Sentiment140 CSV."""
    if not os.path.isfile(path):
        raise ConfigError("root", f"no file {path}", f"put {TRAIN_FILE} and {TEST_FILE} (from Sentiment140's "
                          "trainingandtestdata.zip) in data.root")
    pol, users, texts = [], [], []
    with open(path, encoding="latin-1", newline="") as f:
        for row in csv.reader(f):
            if len(row) != 6 or row[0] not in ("0", "2", "4"):
                continue
            pol.append(int(row[0]))
            users.append(row[4])
            texts.append(row[5])
    if not pol:
        raise ConfigError("root", f"{path} holds no Sentiment140 rows", "use the CSV files of trainingandtestdata.zip")
    return pol, users, texts


def encode(texts: list[str], vocab: dict[str, int], max_length: int) -> torch.Tensor:
    out = np.zeros((len(texts), max_length), dtype=np.int32)
    for i, t in enumerate(texts):
        ids = [vocab.get(w, 1) for w in words(t)][:max_length] or [1]  # an empty tweet is one <unk>
        out[i, : len(ids)] = ids
    return torch.from_numpy(out)


def sentiment140(root: str = "data/sentiment140", fraction: Annotated[float, Range(0.0, 1.0, open_low=True)] = 0.01,
                 subsample_seed: Annotated[int, Range(0, 2**32 - 1)] = 0,
                 max_length: Annotated[int, Range(1, 1 << 16)] = 64,
                 min_count: Annotated[int, Range(1, 10**9)] = 2, cache_dir: str | None = "auto"
                 ) -> tuple[TensorSet, TensorSet, DataInfo]:
    """(train, test, info): ``{"input_ids", "y"}`` sets, the training set also with ``group`` (the tweet's user,
    for ``data/partition=natural``: client = user, ``fl.num_clients=auto``; see the module docstring); ``info.vocab_size`` includes the
    padding and unknown ids; ``info.tokenizer_path`` is the vocabulary as a text file (one word per line, line i =
    id i), written under ``cache_dir`` (a temporary folder when null), which the RNN reads to look up GloVe vectors."""
    root = os.path.expanduser(str(root))
    pol, users, texts = read_csv(os.path.join(root, TRAIN_FILE))
    keep = [i for i, p in enumerate(pol) if p != 2]
    rng = np.random.default_rng(int(subsample_seed))
    n = max(2, int(round(float(fraction) * len(keep))))
    keep = sorted(rng.choice(keep, size=min(n, len(keep)), replace=False).tolist())
    tr_texts, tr_y = [texts[i] for i in keep], [int(pol[i] == 4) for i in keep]
    te_pol, _, te_texts = read_csv(os.path.join(root, TEST_FILE))
    te = [i for i, p in enumerate(te_pol) if p != 2]  # neutral test tweets dropped: the model is 2-way
    counts = collections.Counter(w for t in tr_texts for w in words(t))
    vocab = {PAD: 0, UNK: 1}
    for w, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if c >= int(min_count):
            vocab[w] = len(vocab)
    user_ids = {u: i for i, u in enumerate(sorted({users[i] for i in keep}))}
    train = TensorSet({"input_ids": encode(tr_texts, vocab, int(max_length)), "y": torch.tensor(tr_y),
                       "group": torch.tensor([user_ids[users[i]] for i in keep])})  # the user: data/partition=natural
    test = TensorSet({"input_ids": encode([te_texts[i] for i in te], vocab, int(max_length)),
                      "y": torch.tensor([int(te_pol[i] == 4) for i in te])})
    text = "\n".join(vocab) + "\n"
    folder = default_cache_dir(cache_dir) or tempfile.mkdtemp(prefix="fl_sentiment140_")
    path = os.path.join(folder, "sentiment140", f"vocab-{hashlib.sha256(text.encode()).hexdigest()[:16]}.txt")
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    publish(path, write, "the vocabulary")  # once, whoever comes first (fl_lightning/data/cache.py)
    return train, test, DataInfo(input_shape=(int(max_length),), num_classes=2, vocab_size=len(vocab), tokenizer_path=path)
