"""``pydoc_topics``: an embedded, zero-setup text classification task (no file, no download).

CPython ships its own documentation topics (``pydoc_data.topics``: 79 topics, ~465 k characters). A sentence of a
topic's text is labelled by its topic; the ``num_topics`` topics with the most sentences are the classes (10 by
default: specialnames, compound, types, debugger, ...). The text differs between Python versions, so its sha256 is
recorded in ``summary.json`` (``data_text_sha256``) beside the tokenizer's (``tokenizer_sha256``). A fixed stratified
split (``test_fraction`` 0.2, seed 0, independent of the run seed) keeps the test sentences.

Everything a text model needs is prepared once and cached under ``cache_dir`` (keyed by the text's hash and the
settings): a byte-level BPE tokenizer trained in-process with ``tokenizers`` (Sennrich et al. 2016; RoBERTa's
tokenizer family, a few seconds), saved as a ``save_pretrained`` directory; and, with ``pretrain`` set (the default), a
small RoBERTa (``hidden_size`` 128, 2 layers) pre-trained by masked-language modelling (Devlin et al. 2019, 15 %
masking, 80/10/10; RoBERTa's dynamic masking) on the corpus **without the test sentences**, so the LoRA run is a
real fine-tune of a pretrained backbone (``DataInfo.pretrained_path``; ``model=roberta_lora`` uses it when
``model.net.pretrained_path`` is null). ``pretrain: null`` saves a randomly initialised backbone instead and says
so in the log: LoRA on a random backbone is not fine-tuning.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from typing import Annotated, TypedDict

import numpy as np
import torch

from ..errors import ConfigError
from ..config import Range
from .info import DataInfo
from .tensors import TensorSet
from .cache import publish
from .pretrain import RECIPE, SPECIALS, mlm_pretrain, train_tokenizer
from .text import cached, default_cache_dir, load_tokenizer, tokenize, tokenizer_fingerprint

log = logging.getLogger("fl_lightning")

_RULE = re.compile(r"^\s*([=*\-~^\"'`#+]{3,})\s*$")
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")


def corpus() -> tuple[dict[str, str], str]:
    """(topics, sha256 of their text) of this Python's ``pydoc_data.topics``."""
    from pydoc_data.topics import topics

    text = json.dumps(topics, sort_keys=True, ensure_ascii=False)
    return dict(topics), hashlib.sha256(text.encode()).hexdigest()


def sentences(text: str, min_words: int = 5, max_words: int = 80) -> list[str]:
    """Prose sentences of one topic: paragraphs without reST underlines and ``>>>`` code, split after . ! ?"""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln for ln in para.splitlines() if not _RULE.match(ln) and not ln.lstrip().startswith((">>>", "..."))]
        flat = " ".join(" ".join(lines).split())
        out += [s for s in _SPLIT.split(flat) if min_words <= len(s.split()) <= max_words]
    return out


def labelled(topics: dict[str, str], num_topics: int) -> tuple[list[str], list[int], list[str]]:
    """(sentences, labels, topic names) for the ``num_topics`` topics with the most sentences (then by name). The
    docs repeat text between topics (``attribute-access`` is a section of ``specialnames``): a sentence found under
    two topics is dropped and each sentence appears once, before the topics are ranked, so no text carries two
    labels or lands on both sides of the split."""
    owners: dict[str, set[str]] = {}
    for k in sorted(topics):
        for s in sentences(topics[k]):
            owners.setdefault(s, set()).add(k)
    per: dict[str, list[str]] = {k: [] for k in topics}
    for s, who in owners.items():  # first-seen order
        if len(who) == 1:
            per[next(iter(who))].append(s)
    names = sorted(per, key=lambda k: (-len(per[k]), k))[:num_topics]
    texts, labels = [], []
    for i, k in enumerate(names):
        texts += per[k]
        labels += [i] * len(per[k])
    return texts, labels, names


def split(topics: dict[str, str], num_topics: int, test_fraction: float):
    """(texts, labels, topic names, train indices, test indices, unlabelled corpus): a stratified split fixed by
    seed 0; the unlabelled corpus (for the tokenizer and the MLM) is every topic's sentences but the test ones."""
    from sklearn.model_selection import train_test_split

    texts, labels, names = labelled(topics, num_topics)
    tr, te = train_test_split(np.arange(len(texts)), test_size=test_fraction, random_state=0, stratify=labels)
    held_out = {texts[i] for i in te.tolist()}
    unlabelled = [s for k in sorted(topics) for s in sentences(topics[k]) if s not in held_out]
    return texts, labels, names, tr, te, unlabelled


class Backbone(TypedDict, total=False):
    """``data.backbone``: the small RoBERTa (checked before anything is built)."""

    hidden_size: Annotated[int, Range(8, 4096, example=128)]
    layers: Annotated[int, Range(1, 48, example=2)]
    heads: Annotated[int, Range(1, 64, example=4)]
    intermediate_size: Annotated[int, Range(8, 16384, example=512)]


class Pretrain(TypedDict, total=False):
    """``data.pretrain``: its masked-LM pre-training (null: none)."""

    steps: Annotated[int, Range(1, 10**6, example=1500)]
    batch_size: Annotated[int, Range(1, 4096, example=32)]
    lr: Annotated[float, Range(0.0, 1.0, open_low=True, example=1e-3)]
    mask_prob: Annotated[float, Range(0.0, 1.0, open_low=True, open_high=True, example=0.15)]
    seed: Annotated[int, Range(0, 2**32 - 1, example=0)]


def pydoc_topics(num_topics: Annotated[int, Range(2, 64)] = 10,
                 test_fraction: Annotated[float, Range(0.05, 0.5)] = 0.2,
                 max_length: Annotated[int, Range(8, 512)] = 48,
                 vocab_size: Annotated[int, Range(260, 1 << 17)] = 4096,
                 cache_dir: str | None = "auto", pretrain: Pretrain | None = None, backbone: Backbone | None = None
                 ) -> tuple[TensorSet, TensorSet, DataInfo]:
    """(train, test, info) of the embedded task (see the module docstring). ``backbone``: the small RoBERTa's
    ``hidden_size``, ``layers``, ``heads``, ``intermediate_size``; ``pretrain``: MLM ``steps``, ``batch_size``,
    ``lr``, ``mask_prob``, ``seed`` (null: no pre-training)."""
    topics, text_hash = corpus()
    if int(num_topics) > len(topics):  # the corpus found has fewer (the Range bounds the rest)
        raise ConfigError("num_topics", f"must be in [2, {len(topics)}], got {num_topics}", "use 10")
    texts, labels, names, tr, te, unlabelled = split(topics, int(num_topics), float(test_fraction))

    cache = default_cache_dir(cache_dir)
    if cache is None:
        import tempfile

        cache = tempfile.mkdtemp(prefix="fl_pydoc_topics_")
    root = os.path.join(cache, "pydoc_topics", f"v3-{text_hash[:16]}-{num_topics}-{test_fraction}")
    tok_dir = os.path.join(root, f"tokenizer-bpe{int(vocab_size)}")
    publish(tok_dir, lambda tmp: train_tokenizer(unlabelled, tmp, int(vocab_size)), "the tokenizer",
            ready=lambda d: os.path.isfile(os.path.join(d, "tokenizer_config.json")))
    tok = load_tokenizer(tok_dir)
    tok_hash = tokenizer_fingerprint(tok)

    arch = {"hidden_size": 128, "layers": 2, "heads": 4, "intermediate_size": 512, **(backbone or {})}
    pre = None if pretrain is None else {"steps": 1500, "batch_size": 32, "lr": 1e-3, "mask_prob": 0.15, "seed": 0,
                                         **pretrain}
    try:
        arch = {k: int(arch[k]) for k in ("hidden_size", "layers", "heads", "intermediate_size")}
    except (TypeError, ValueError, KeyError):
        raise ConfigError("backbone", f"needs integer hidden_size, layers, heads, intermediate_size, got {backbone}",
                          "use {hidden_size: 128, layers: 2, heads: 4, intermediate_size: 512}") from None
    if arch["hidden_size"] % arch["heads"]:
        raise ConfigError("backbone.heads", f"{arch['heads']} heads do not divide hidden_size {arch['hidden_size']}",
                          "use 4 heads with hidden_size 128")
    # the recipe's version is in the key: a backbone cached by other pre-training code is not reused
    key = hashlib.sha256(json.dumps([arch, pre, tok_hash, int(max_length)] + ([RECIPE] if pre else []),
                                    sort_keys=True).encode()).hexdigest()[:12]
    bb_dir = os.path.join(root, f"roberta-{'mlm' if pre else 'random'}-{key}")
    def pretrain_into(tmp: str) -> None:
        if pre:
            log.info("pydoc_topics: pre-training a small RoBERTa (hidden %d, %d layers) by masked-language modelling "
                     "on the embedded corpus, %d steps (once; cached at %s)", arch["hidden_size"], arch["layers"],
                     int(pre["steps"]), bb_dir)
        mlm_pretrain(tok_dir, unlabelled, tmp, max_length=int(max_length), train=pre is not None,
                     **arch, **{k: (int(v) if k in ("steps", "batch_size", "seed") else float(v))
                                for k, v in (pre or {}).items()})

    # once, whoever comes first; parallel jobs wait for it (fl_lightning/data/cache.py)
    publish(bb_dir, pretrain_into, "the pre-trained backbone",
            ready=lambda d: os.path.isfile(os.path.join(d, "fl_lightning_pretraining.json")))
    if not pre:
        log.warning("pydoc_topics: NO PRETRAINED BACKBONE (data.pretrain=null): the RoBERTa under the LoRA adapters "
                    "is randomly initialised, so this run is not a fine-tune of a pretrained model")

    def encode(rows):
        return lambda: {**tokenize(tok, [texts[i] for i in rows], None, int(max_length)),
                        "y": torch.tensor([labels[i] for i in rows], dtype=torch.long)}

    sets = [TensorSet(cached(os.path.join(root, f"{split}-{tok_hash}-{int(max_length)}.safetensors"), encode(rows)))
            for split, rows in (("train", tr), ("test", te))]
    info = DataInfo(input_shape=(int(max_length),), num_classes=len(names), vocab_size=len(tok),
                    tokenizer_path=bb_dir, metrics=("acc",), pretrained_path=bb_dir,
                    provenance={"data_text_sha256": text_hash, "data_topics": ",".join(names),
                                "tokenizer_sha256": tok_hash, "backbone_pretrained": str(pre is not None).lower()})
    return sets[0], sets[1], info
