"""Seed 003's RNN for Sentiment140 (Zhang & Gao, "On Provable Benefits of Muon in Federated Learning", Table 3,
App. A.2): an Elman RNN (Elman, "Finding Structure in Time", Cognitive Science 1990), input 300 → hidden 4096 →
output 2. The paper gives only those three sizes; the rest is our choice (decision 003/#15 in docs/decisions.md): one
``nn.RNN(300, 4096, nonlinearity="tanh", batch_first=True)`` layer over 300-d word embeddings, the hidden state at
each tweet's last token (padding id 0 after it never reaches it), then ``Linear(4096, 2)``.

Trainable embeddings (the default, PyTorch's N(0, 1) init); ``glove_path`` initialises the
embedding rows from a local GloVe text file (``word v1 ... v300`` per line, e.g. ``glove.twitter.27B.200d.txt``
needs ``embed_dim: 200``; words missing from it keep their random rows) using the dataset's vocabulary file
(``DataInfo.tokenizer_path``); ``freeze_embeddings: true`` then keeps them fixed (the recommended default of
decision 003/#15: frozen, so neither trained nor communicated).
"""
from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from ..data.info import DataInfo
from ..errors import ConfigError
from ._args import Width, positive_ints


class ElmanClassifier(nn.Module):
    def __init__(self, vocab_size: int, num_classes: int, embed_dim: int, hidden: int, pad_id: int = 0):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.rnn = nn.RNN(embed_dim, hidden, nonlinearity="tanh", batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)
        self.pad_id = pad_id

    def forward(self, ids: Tensor) -> Tensor:
        ids = ids.long()
        out, _ = self.rnn(self.embedding(ids))
        last = (ids != self.pad_id).sum(1).clamp_min(1) - 1  # index of each sequence's last real token (no host sync)
        h = out.gather(1, last.view(-1, 1, 1).expand(-1, 1, out.shape[-1])).squeeze(1)
        return self.fc(h)


def load_glove(embedding: nn.Embedding, vocab_file: str, glove_path: str) -> int:
    """Copy the GloVe vectors of the vocabulary's words into ``embedding``; returns how many were found."""
    path = os.path.expanduser(str(glove_path))
    if not os.path.isfile(path):
        raise ConfigError("glove_path", f"no file {path}", "put a GloVe text file there (e.g. glove.840B.300d.txt from "
                          "nlp.stanford.edu/projects/glove) or set model.net.glove_path=null")
    if not vocab_file or not os.path.isfile(vocab_file):
        raise ConfigError("glove_path", "the dataset gives no vocabulary file (DataInfo.tokenizer_path)",
                          "use data=sentiment140, or glove_path=null")
    with open(vocab_file, encoding="utf-8") as f:
        index = {w: i for i, w in enumerate(f.read().split("\n")[: embedding.num_embeddings])}
    found, dim = 0, embedding.embedding_dim
    with open(path, encoding="utf-8", errors="replace") as f, torch.no_grad():
        for line in f:
            word, _, rest = line.rstrip("\n").partition(" ")
            i = index.get(word)
            if i is None or i == 0:
                continue
            vec = rest.split(" ")
            if len(vec) != dim:
                raise ConfigError("glove_path", f"{path} has {len(vec)}-d vectors, the model {dim}-d",
                                  f"set model.net.embed_dim={len(vec)}")
            embedding.weight[i] = torch.tensor([float(v) for v in vec])
            found += 1
    return found


def elman_rnn(info: DataInfo, embed_dim: Width = 300, hidden: Width = 4096, glove_path: str | None = None,
              freeze_embeddings: bool = False) -> ElmanClassifier:
    """The RNN for ``info``'s token ids (see the module docstring)."""
    if not info.vocab_size or not info.num_classes:
        raise ConfigError("", "the RNN needs a text dataset with a vocabulary and classes (DataInfo.vocab_size)",
                          "use data=sentiment140")
    (embed_dim,) = positive_ints(embed_dim, "embed_dim", 1, "300")
    (hidden,) = positive_ints(hidden, "hidden", 1, "4096")
    net = ElmanClassifier(info.vocab_size, info.num_classes, embed_dim, hidden)
    if glove_path:
        load_glove(net.embedding, info.tokenizer_path, glove_path)
    if freeze_embeddings:
        net.embedding.weight.requires_grad_(False)
    return net
