"""``pydoc_chars``: an embedded, zero-setup next-character prediction task (no file, no download), shaped like
LEAF's Shakespeare (Caldas et al. 2018, arXiv 1812.01097; seed 002's text task, FedSMU Sec. 5.1): an
``window``-character window (80) and the character that follows it, an 80-symbol vocabulary, one client per text
source.

The text is CPython's own documentation topics (``pydoc_data.topics``, the corpus of ``pydoc_topics``), pinned by
the sha256 recorded in ``summary.json`` (``data_text_sha256``). The ``num_topics`` longest topics are the clients
(16 by default, the default ``fl.num_clients``; the ``group`` tensor feeds ``data/partition=natural``). Each topic's
text is split once, not by the run seed: its first ``1 - test_fraction`` characters give the training windows
(every position, as LEAF does), the rest the test windows, of which ``test_windows`` evenly spaced ones are kept
(evaluation stays cheap on a CPU). The vocabulary is the corpus's 79 most frequent characters (ties by code point;
99.8 % of the text) plus one id (79) for every other character. The docs repeat some text between topics
(``attribute-access`` is a section of ``specialnames``), so a few test windows have training twins in another topic.
"""
from __future__ import annotations

import collections
from typing import Annotated

import numpy as np
import torch

from ..errors import ConfigError
from ..config import Range
from .info import DataInfo
from .pydoc_topics import corpus
from .tensors import TensorSet

VOCAB = 80


def alphabet(text: str, size: int = VOCAB) -> str:
    """The ``size - 1`` most frequent characters of ``text`` (count, then code point); id ``size - 1`` = any other."""
    counts = collections.Counter(text)
    return "".join(sorted(counts, key=lambda ch: (-counts[ch], ord(ch)))[: size - 1])


def encode(text: str, chars: str) -> np.ndarray:
    """``text`` as uint8 ids: the position of each character in ``chars``, ``len(chars)`` for any other."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    table = np.full(int(codes.max()) + 1, len(chars), dtype=np.uint8)
    for i, c in enumerate(chars):
        if ord(c) < len(table):
            table[ord(c)] = i
    return table[codes]


def windows(ids: np.ndarray, length: int, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): ``ids[s : s + length]`` and ``ids[s + length]`` for each start ``s``."""
    view = np.lib.stride_tricks.sliding_window_view(ids, length + 1)[starts]
    return np.ascontiguousarray(view[:, :length]), view[:, length].astype(np.int64)


def pydoc_chars(num_topics: Annotated[int, Range(1, 1 << 10)] = 16, window: Annotated[int, Range(2, 1 << 20)] = 80,
                test_fraction: Annotated[float, Range(0.02, 0.5)] = 0.1,
                test_windows: Annotated[int, Range(1, 1 << 24)] = 2000) -> tuple[TensorSet, TensorSet, DataInfo]:
    """(train, test, info): ``{"input_ids": uint8 (N, window), "y", "group"}`` (see the module docstring)."""
    topics, text_hash = corpus()
    if int(num_topics) > len(topics):  # the corpus found has fewer (the Range bounds the rest)
        raise ConfigError("num_topics", f"must be in [1, {len(topics)}], got {num_topics}", "use 16")
    names = sorted(topics, key=lambda k: (-len(topics[k]), k))[: int(num_topics)]
    chars, length = alphabet("".join(topics.values())), int(window)
    tr, te = {"x": [], "y": [], "g": []}, {"x": [], "y": []}
    for g, name in enumerate(names):
        ids = encode(topics[name], chars)
        cut = int(len(ids) * (1 - float(test_fraction)))
        if cut <= length or len(ids) - cut <= length:
            raise ConfigError("window", f"topic {name!r} ({len(ids)} characters) is too short for {length}-character "
                              "windows on both sides of its split", "use fewer topics or a shorter window")
        x, y = windows(ids[:cut], length, np.arange(cut - length))
        tr["x"].append(x), tr["y"].append(y), tr["g"].append(np.full(len(y), g))
        x, y = windows(ids[cut:], length, np.arange(len(ids) - cut - length))
        te["x"].append(x), te["y"].append(y)
    tx, ty = np.concatenate(te["x"]), np.concatenate(te["y"])
    keep = np.linspace(0, len(ty) - 1, min(int(test_windows), len(ty))).round().astype(np.int64)
    train = TensorSet({"input_ids": torch.from_numpy(np.concatenate(tr["x"])), "y": torch.from_numpy(np.concatenate(tr["y"])),
                       "group": torch.from_numpy(np.concatenate(tr["g"]))})
    test = TensorSet({"input_ids": torch.from_numpy(tx[keep]), "y": torch.from_numpy(ty[keep])})
    info = DataInfo(input_shape=(length,), num_classes=VOCAB, vocab_size=VOCAB, metrics=("acc",),
                    provenance={"data_text_sha256": text_hash, "data_topics": ",".join(names)})
    return train, test, info
