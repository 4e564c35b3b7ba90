"""Token corpora on disk: a stream of documents tokenized once into a flat memory-mapped token file, read back as
packed fixed-length sequences (:class:`TokenSet`) behind the :class:`~fl_lightning.data.tensors.TensorSet` batch
interface, so :class:`~fl_lightning.data.federated.FederatedData` and the loop use it unchanged.

On disk, in one cache folder (built once under a lock and renamed into place, :mod:`fl_lightning.data.cache`):
``tokens.bin`` (uint16 when the tokenizer has at most 65,536 ids, else uint32; every document's ids followed by the
end-of-sequence id), ``doc_starts.bin`` (uint64, the first token of each document), ``doc_groups.bin`` (uint32, each
document's group id, e.g. its URL host), ``groups.txt`` (the group names, one per line) and ``meta.json``.
Building streams ``batch_docs`` documents at a time; reading maps the files, so memory stays flat in the corpus
size: a batch reads its rows from the page cache, and only the per-sequence partition indices (8 bytes per
sequence) and, for a partition by group, the sequences' group ids (4 bytes) are held in memory.
"""
from __future__ import annotations

import json
import os
from typing import Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

from .cache import publish
from .tensors import TensorSet

FILES = ("tokens.bin", "doc_starts.bin", "doc_groups.bin", "groups.txt", "meta.json")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _batches(docs: Iterable[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    batch = []
    for d in docs:
        batch.append(d)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def build_token_files(docs: Iterable[tuple[str, str]], tokenizer, folder: str, batch_docs: int = 1000) -> dict:
    """Tokenize ``(text, group)`` documents into the files of ``folder`` (see the module docstring); returns meta.
    Built once however many processes ask at the same time (:func:`fl_lightning.data.cache.publish`)."""
    publish(folder, lambda tmp: _write_token_files(docs, tokenizer, tmp, batch_docs), "the token files",
            ready=lambda f: read_meta(f) is not None)
    return read_meta(folder)


def _write_token_files(docs: Iterable[tuple[str, str]], tokenizer, tmp: str, batch_docs: int) -> None:
    dtype = token_dtype(len(tokenizer))
    eos = tokenizer.eos_token_id
    os.makedirs(tmp)
    groups: dict[str, int] = {}
    total, top, ndocs = 0, 0, 0
    with open(os.path.join(tmp, "tokens.bin"), "wb") as ft, open(os.path.join(tmp, "doc_starts.bin"), "wb") as fs, \
            open(os.path.join(tmp, "doc_groups.bin"), "wb") as fg:
        for batch in _batches(docs, int(batch_docs)):
            ids = tokenizer([t for t, _ in batch], add_special_tokens=False)["input_ids"]
            ids = [d + [eos] if eos is not None else d for d in ids]
            lengths = np.fromiter((len(d) for d in ids), dtype=np.uint64, count=len(ids))
            flat = np.fromiter((t for d in ids for t in d), dtype=np.int64, count=int(lengths.sum()))
            top = max(top, int(flat.max(initial=0)))
            flat.astype(dtype).tofile(ft)
            (total + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint64)).tofile(fs)
            np.array([groups.setdefault(g, len(groups)) for _, g in batch], dtype=np.uint32).tofile(fg)
            total, ndocs = total + int(lengths.sum()), ndocs + len(batch)
    with open(os.path.join(tmp, "groups.txt"), "w", encoding="utf-8") as f:
        f.write("".join(f"{g}\n" for g in groups))
    meta = {"tokens": total, "documents": ndocs, "dtype": dtype.name, "max_token_id": top, "groups": len(groups)}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f)


def read_meta(folder: str) -> dict | None:
    """The folder's meta, or None when it is incomplete (then it is rebuilt)."""
    if not all(os.path.isfile(os.path.join(folder, f)) for f in FILES):
        return None
    with open(os.path.join(folder, "meta.json")) as f:
        return json.load(f)


class TokenSet(TensorSet):
    """Packed sequences of ``seq_len`` tokens over a token file (the first ``limit`` when given), read per batch as
    ``{"input_ids": int32 (B, seq_len)}``. ``tensors["group"]``: the group of the document each sequence starts in
    (loaded only when a partitioner asks for groups); ``labels``: zeros (unlabelled text), a stride-0 view."""

    def __init__(self, folder: str, seq_len: int, limit: int | None = None):
        meta = read_meta(folder)
        self.folder, self.seq_len, self.transform = folder, int(seq_len), None
        tokens = np.memmap(os.path.join(folder, "tokens.bin"), dtype=meta["dtype"], mode="r") if meta["tokens"] else \
            np.zeros(0, dtype=meta["dtype"])
        n = len(tokens) // self.seq_len
        n = n if limit is None else min(n, int(limit))
        self.rows = tokens[: n * self.seq_len].reshape(n, self.seq_len)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def labels(self) -> Tensor:
        return torch.zeros(1, dtype=torch.long).expand(len(self))

    @property
    def tensors(self) -> dict[str, Tensor]:
        starts = np.memmap(os.path.join(self.folder, "doc_starts.bin"), dtype=np.uint64, mode="r")
        doc_groups = np.fromfile(os.path.join(self.folder, "doc_groups.bin"), dtype=np.uint32)
        first = np.arange(len(self), dtype=np.uint64) * np.uint64(self.seq_len)
        doc = np.searchsorted(starts, first, side="right") - 1
        return {"group": torch.from_numpy(doc_groups[doc].astype(np.int64))}

    def to(self, device) -> "TokenSet":
        return self  # rows stay on disk; each batch moves to the device

    def batch(self, idx: Tensor, device, generator: torch.Generator | None = None,
              noise: Tensor | None = None) -> dict[str, Tensor]:  # no transform: no drawn-ahead noise
        rows = self.rows[idx.cpu().numpy()].astype(np.int32)
        return {"input_ids": torch.from_numpy(rows).to(device, non_blocking=True)}
