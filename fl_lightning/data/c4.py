"""C4 (Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer", JMLR 2020)
for LLaMA pre-training from scratch as seed 001 uses it (Liu et al., "Taming Preconditioner Drift" (FedPAC), ICML
submission, Sec. 6.3 and Table 3), from ``c4-*.json.gz`` shards (allenai/c4 ``en``: one JSON document per line
with ``text``, ``url``, ``timestamp``). ``source``:

- ``hub`` (default): the hub's ``allenai/c4`` in the Hugging Face cache, only its first ``max_train_shards``
  training files (``en/c4-train.00000-of-01024.json.gz`` ...) and ``max_val_shards`` validation files (the whole
  ``en`` set is about 300 GB); ``download=true`` fetches exactly those (:mod:`fl_lightning.data.hub`). The shard
  files are read as they are (streamed into the token files below), not through an Arrow copy of ``datasets``;
- ``files``: local shards, ``train_files`` / ``val_files`` patterns under ``root`` (sorted; what a run saved
  before ``source`` existed read, hashed as absent).

The training shards (``max_train_shards`` of them) and the validation shards (``max_val_shards``) are tokenized once
(the tokenizer from ``tokenizer_path``: a hub id, by default ``google-t5/t5-base``, or a ``save_pretrained`` T5
tokenizer folder, the literature's: GaLore's setup, Zhao et al., ICML 2024, arXiv 2403.03507; the
paper names none, decision 001/#29 in docs/decisions.md) into memory-mapped token files
(:mod:`fl_lightning.data.tokens`), cached under ``cache_dir`` by the tokenizer's fingerprint and the shard list
(names and sizes). Documents are concatenated, each followed by the end-of-sequence id, and packed into sequences of
``seq_len`` tokens (256); the held-out set is the first ``eval_sequences`` packed validation sequences. Each
sequence's group is the URL host of the document it starts in (``data/partition=by_group``: whole hosts per client,
a non-IID split by source domain); the default partition is IID over the packed sequences.
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import json
import logging
import os
from typing import Annotated
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..config import OneOf, Range
from .info import DataInfo
from . import hub
from .text import default_cache_dir, load_tokenizer, tokenizer_fingerprint
from .tokens import TokenSet, build_token_files, read_meta

log = logging.getLogger("fl_lightning")

FORMAT = 1  # bump when the token files' layout changes
HUB_REPO = "allenai/c4"
HUB_SHARDS = {"train": 1024, "validation": 8}  # files per split of allenai/c4 en
SOURCES = ("hub", "files")


def hub_shards(split: str, limit: int | None, arg: str, fetch: bool) -> list[str]:
    """The first ``limit`` (null: all) ``en/c4-<split>.NNNNN-of-MMMMM.json.gz`` files of allenai/c4 from the hub
    cache (fetched with ``download=true``); the missing ones are named in one line, with one command for them all."""
    total = HUB_SHARDS[split]
    names = [f"en/c4-{split}.{i:05d}-of-{total:05d}.json.gz" for i in range(min(int(limit or total), total))]
    every = f"en/c4-{split}.*-of-{total:05d}.json.gz" if len(names) == total else None  # null: the whole split
    what = f"the {split} split ({len(names)} shard{'s' * (len(names) > 1)}) of"
    return hub.resolve_files(HUB_REPO, names, arg, "dataset", fetch, what, every)


def shards(root: str, pattern: str, limit: int | None, arg: str) -> list[str]:
    """The sorted files matching ``pattern`` under ``root`` (the first ``limit``), or a ConfigError naming them."""
    found = sorted(glob.glob(os.path.join(root, pattern)))
    if not found:
        raise ConfigError(arg, f"no file matches {os.path.join(root, pattern)}", "put the C4 en shards there (allenai/c4: "
                          "en/c4-train.00000-of-01024.json.gz ..., en/c4-validation.00000-of-00008.json.gz ...) or set "
                          "data.root")
    return found[: int(limit)] if limit else found


def documents(files: list[str]):
    """``(text, url host)`` of every document of the shards, in order."""
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    doc = json.loads(line)
                    yield doc["text"], urlsplit(doc.get("url") or "").hostname or ""


def token_folder(cache: str, tok_hash: str, files: list[str]) -> str:
    key = json.dumps([FORMAT, tok_hash, [(os.path.basename(p), os.path.getsize(p)) for p in files]])
    return os.path.join(cache, "c4", hashlib.sha256(key.encode()).hexdigest()[:16])


def tokenized(files: list[str], tok, tok_hash: str, cache: str, batch_docs: int) -> tuple[str, dict]:
    folder = token_folder(cache, tok_hash, files)
    meta = read_meta(folder)
    if meta is None:
        log.info("c4: tokenizing %d shard(s) once into %s", len(files), folder)
        meta = build_token_files(documents(files), tok, folder, batch_docs)
    return folder, meta


def c4(root: str = "data/c4", tokenizer_path: str | None = None, train_files: str = "c4-train.*.json.gz",
       val_files: str = "c4-validation.*.json.gz", max_train_shards: Annotated[int, Range(1, 1 << 20)] | None = None,
       max_val_shards: Annotated[int, Range(1, 1 << 20)] | None = 1, seq_len: Annotated[int, Range(2, 1 << 20)] = 256,
       eval_sequences: Annotated[int, Range(1, 1 << 30)] = 2048, cache_dir: str | None = "auto",
       hub_offline: bool = True, batch_docs: Annotated[int, Range(1, 1 << 24)] = 1000,
       source: Annotated[str, OneOf(*SOURCES)] = "files") -> tuple[TokenSet, TokenSet, DataInfo]:
    """(train, test, info) as packed token sequences (see the module docstring). ``hub_offline``: deprecated
    (``download=true``)."""
    root = os.path.expanduser(str(root))
    fetch = hub.allow_fetch("data.hub_offline", hub_offline, lambda v: v is False)
    if source not in SOURCES:
        raise ConfigError("source", f"unknown source {source!r}", f"use one of {', '.join(SOURCES)}")
    if source == "hub":
        train_shards = hub_shards("train", max_train_shards, "max_train_shards", fetch)
        val_shards = hub_shards("validation", max_val_shards, "max_val_shards", fetch)
    else:
        train_shards = shards(root, train_files, max_train_shards, "train_files")
        val_shards = shards(root, val_files, max_val_shards, "val_files")
    tok = load_tokenizer(tokenizer_path, offline=not fetch, hint="set data.tokenizer_path=google-t5/t5-base (the "
                         "Hugging Face cache; download=true fetches it) or a save_pretrained T5 tokenizer folder")
    tok_hash = tokenizer_fingerprint(tok)
    cache = default_cache_dir(cache_dir) or os.path.join(root, ".fl_cache")
    (tr_dir, tr_meta), (te_dir, te_meta) = (tokenized(f, tok, tok_hash, cache, batch_docs) for f in (train_shards, val_shards))
    train, test = TokenSet(tr_dir, seq_len), TokenSet(te_dir, seq_len, limit=eval_sequences)
    for name, s, files in (("train_files", train, train_shards), ("val_files", test, val_shards)):
        if len(s) == 0:
            raise ConfigError(name, f"{', '.join(map(os.path.basename, files))} hold fewer than seq_len={seq_len} tokens",
                              "add shards (max_train_shards / max_val_shards) or lower data.seq_len")
    info = DataInfo(input_shape=(int(seq_len),), vocab_size=len(tok), tokenizer_path=str(tokenizer_path),
                    provenance={"tokenizer_sha256": tok_hash, "max_token_id": max(tr_meta["max_token_id"], te_meta["max_token_id"]),
                                "data_train_tokens": tr_meta["tokens"], "data_train_sequences": len(train),
                                "data_test_sequences": len(test), "data_token_cache": os.path.basename(tr_dir)})
    return train, test, info
