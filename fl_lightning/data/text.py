"""Text helpers shared by the text datasets and models: loading a Hugging Face tokenizer from a local path (hub
offline unless asked, never ``trust_remote_code``), its fingerprint, tokenizing once into ``input_ids`` /
``attention_mask`` tensors, and a safetensors cache of the result keyed by what determines it.
"""
from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from typing import Sequence

import torch
from torch import Tensor

from ..errors import ConfigError
from .cache import cache_root

# files a save_pretrained tokenizer directory may hold; their bytes are the tokenizer's fingerprint
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "vocab.txt", "sentencepiece.bpe.model",
                   "spiece.model", "tokenizer.model", "special_tokens_map.json", "added_tokens.json")


def default_cache_dir(cache_dir: str | None) -> str | None:
    """``cache_dir`` expanded; ``"auto"`` = ``$FL_CACHE_DIR`` or ``~/.cache/fl_lightning``; None = no cache."""
    if cache_dir is None or cache_dir is False:
        return None
    if str(cache_dir) == "auto":
        return cache_root()
    return os.path.abspath(os.path.expanduser(str(cache_dir)))


def hf_offline(offline: bool) -> None:
    """Keep the Hugging Face hub offline (``HF_HUB_OFFLINE=1``) unless the user opted in (``hub_offline=false``)."""
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"


@contextmanager
def no_hf_progress_bars():
    """transformers' own progress bars off for the block (``Loading weights``, ``Writing model shards``: a run draws
    only its own progress), as they were after it."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


# what a tokenizer (and the model's config) needs of a hub snapshot: fetched by download=true, looked for offline
TOKENIZER_PATTERNS = ["*.json", "*.txt", "*.model"]


def local_pretrained(path, arg: str, fetch: bool, patterns: list[str], what: str, also: tuple[str, ...] = (),
                     need=None) -> str:
    """A hub id (``org/name``) as a local folder: ``$FL_WEIGHTS_ROOT/<name>`` if there, else its snapshot in the
    Hugging Face cache (fetched first under ``download=true``; :mod:`fl_lightning.data.hub`); anything else (a
    folder, a file, a slash-free cached id) as it is."""
    from . import hub

    path = os.path.expanduser(str(path))
    if not hub.is_hub_id(path):
        return path
    return hub.local_first(path, also) or hub.resolve_snapshot(path, arg, "model", patterns, fetch, what, need=need)


def has_tokenizer(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES if f != "special_tokens_map.json")


def load_tokenizer(path: str, arg: str = "tokenizer_path", offline: bool = True, hint: str = ""):
    """``AutoTokenizer.from_pretrained(path)`` with ``local_files_only`` (unless ``offline`` is False) and without
    remote code; ``path``: a folder, or a hub id resolved by :func:`local_pretrained`; a missing or unreadable path
    is a one-line ConfigError naming ``arg``."""
    if not path:
        raise ConfigError(arg, "is not set", hint or "point it at a save_pretrained directory holding the tokenizer")
    hf_offline(offline)
    path = local_pretrained(path, arg, not offline, TOKENIZER_PATTERNS, "the tokenizer of", need=has_tokenizer)
    from transformers import AutoTokenizer

    if offline and not os.path.isdir(path) and (os.sep in path or path.startswith(".")):
        raise ConfigError(arg, f"no directory {path}", hint or "give a save_pretrained directory holding the tokenizer")
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=bool(offline), trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - any failure is a path to fix
        raise ConfigError(arg, f"no tokenizer loads from {path!r} ({type(err).__name__}: {' '.join(str(err).split())[:160]})",
                          hint or "give a save_pretrained directory (tokenizer.json or vocab.json + merges.txt)") from None


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 (16 hex) of the tokenizer's full serialisation (vocabulary, merges, normaliser, special tokens)."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode())
    else:  # a slow tokenizer: its vocabulary
        h.update(repr(sorted(tokenizer.get_vocab().items())).encode())
    h.update(repr(sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())).encode())
    return h.hexdigest()[:16]


def file_fingerprint(*paths: str) -> str:
    """sha256 (16 hex) of files' bytes (missing files hash as absent)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(os.path.basename(p).encode())
        if os.path.isfile(p):
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]


def tokenize(tokenizer, first: Sequence[str], second: Sequence[str] | None, max_length: int) -> dict[str, Tensor]:
    """``input_ids`` (int32) and ``attention_mask`` (int8), padded to ``max_length`` (the authors'
    ``padding="max_length"``) and truncated (longest first) for pairs."""
    enc = tokenizer(list(first), None if second is None else list(second), padding="max_length", truncation=True,
                    max_length=int(max_length), return_tensors="pt")
    return {"input_ids": enc["input_ids"].to(torch.int32), "attention_mask": enc["attention_mask"].to(torch.int8)}


def cached(path: str | None, build) -> dict[str, Tensor]:
    """``build()`` (a dict of tensors), stored as safetensors at ``path`` and read from there next time; built once
    however many processes ask at the same time (:func:`fl_lightning.data.cache.publish`)."""
    from safetensors.torch import load_file, save_file

    from .cache import publish

    if not path:
        return build()
    if os.path.isfile(path):
        try:
            return load_file(path)
        except Exception:  # noqa: BLE001 - a damaged entry (not one this version wrote: it renames whole files)
            os.remove(path)
    out: dict[str, Tensor] = {}

    def write(tmp: str) -> None:
        out.update(build())
        save_file({k: v.contiguous() for k, v in out.items()}, tmp)

    publish(path, write, "a tokenized dataset")
    return out or load_file(path)  # empty: another process built it while this one waited
