"""RoBERTa + LoRA for sequence classification as seed 004 fine-tunes it on GLUE (Liu et al., "FedMuon: Accelerating
Federated Learning with Matrix Orthogonalization", Sec. 7.1, Table 4; LoRA rank 16): a pretrained
``RobertaForSequenceClassification`` (Liu et al., "RoBERTa", arXiv 1907.11692; 2 labels, 3 for MNLI) with a fresh
classification head, wrapped by peft's LoRA (Hu et al., "LoRA", ICLR 2022, arXiv 2106.09685) exactly as the
authors' ``new_llm.py``: ``LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, bias="none",
task_type=SEQ_CLS, target_modules=["query", "value", "key", "dense"])``. peft freezes the backbone and keeps the
head trainable (``modules_to_save``), so only the LoRA factors and the head are trained, communicated and counted:
roberta-base gives 3,246,338 trainable of 127,893,508 parameters with 2 labels (``tests/unit/data/test_text.py`` asserts it
on a meta-device build).

The weights come from ``pretrained_path``: a ``save_pretrained`` directory, or a hub id (``FacebookAI/roberta-base``,
``experiment=glue_lora``'s default on GLUE) read from ``$FL_WEIGHTS_ROOT/<name>`` if there, else from the Hugging
Face cache (:mod:`fl_lightning.data.hub`); the hub stays offline (``HF_HUB_OFFLINE=1``, ``local_files_only``) unless
the run says ``download=true`` (or the deprecated ``hub_offline: false``), and ``trust_remote_code`` is never set. Without a path the backbone the dataset prepared is
used (``DataInfo.pretrained_path``: ``data=pydoc_topics``'s MLM-pretrained small RoBERTa). The frozen backbone's
fingerprint (sha256 of its tensors, before the head and adapters) is kept on the network as
``backbone_fingerprint``; :class:`~fl_lightning.models.sequence_classifier.SequenceClassifierModule` stores it in
checkpoints.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from typing import Annotated

import torch
from torch import nn

from ..data.info import DataInfo
from ..data import hub
from ..data.text import TOKENIZER_PATTERNS, hf_offline, local_pretrained, no_hf_progress_bars
from ..errors import ConfigError
from ..config import Positive, Range
from ._args import Dropout, lora_args

LORA_TARGETS = ("query", "key", "value", "dense")
WEIGHTS_HINT = ("set model.net.pretrained_path=FacebookAI/roberta-base (read from the Hugging Face cache; download=true "
                "fetches it) or a save_pretrained directory of roberta-base (config.json, model.safetensors, tokenizer files); "
                "or run the zero-setup task: data=pydoc_topics")
# what the backbone needs of a hub snapshot (safetensors only: no pickled .bin, no TF/Flax/ONNX copies)
MODEL_PATTERNS = [*TOKENIZER_PATTERNS, "*.safetensors"]


def tensors_fingerprint(module: nn.Module) -> str:
    """sha256 (16 hex) of a module's state (names, dtypes, shapes, bytes), in name order."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        if t.is_meta:
            return "meta"
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def add_lora(model: nn.Module, r: int = 16, alpha: float = 32, dropout: float = 0.05, targets=LORA_TARGETS) -> nn.Module:
    """peft's ``get_peft_model`` with the authors' sequence-classification LoRA config (see the module docstring)."""
    from peft import LoraConfig, TaskType, get_peft_model

    cfg = LoraConfig(r=int(r), lora_alpha=float(alpha), lora_dropout=float(dropout), bias="none",
                     task_type=TaskType.SEQ_CLS, target_modules=list(targets))
    try:
        with warnings.catch_warnings():  # peft asks transformers a deprecated question (is_gradient_checkpointing)
            warnings.simplefilter("ignore", FutureWarning)
            return get_peft_model(model, cfg)
    except ValueError as err:
        raise ConfigError("lora_targets", " ".join(str(err).split())[:200], f"use {list(LORA_TARGETS)}") from None


def load_backbone(path: str, num_labels: int, offline: bool = True) -> nn.Module:
    """``AutoModelForSequenceClassification.from_pretrained(path)`` (local files only unless ``offline`` is False,
    no remote code) with a fresh ``num_labels`` head; a path that does not load is a one-line ConfigError."""
    hf_offline(offline)
    path = local_pretrained(path, "pretrained_path", not offline, MODEL_PATTERNS, "the model",
                            need=lambda p: os.path.isfile(os.path.join(p, "config.json")))
    import transformers
    from transformers import AutoModelForSequenceClassification

    if offline and not os.path.isdir(path) and (os.sep in path or path.startswith(".")):
        raise ConfigError("pretrained_path", f"no directory {path}", WEIGHTS_HINT)
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # "classifier weights newly initialized" is the point here
    try:
        with no_hf_progress_bars():  # transformers 5's "Loading weights" bar
            model, report = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=int(num_labels), local_files_only=bool(offline), trust_remote_code=False,
                ignore_mismatched_sizes=True, output_loading_info=True)
    except Exception as err:  # noqa: BLE001 - any failure is a path to fix
        raise ConfigError("pretrained_path", f"no model loads from {path!r} ({type(err).__name__}: "
                          f"{' '.join(str(err).split())[:160]})", WEIGHTS_HINT) from None
    finally:
        transformers.logging.set_verbosity(level)
    # only the head may be absent or of another size (a fine-tuned checkpoint's head); a backbone tensor may not
    bad = [k if isinstance(k, str) else k[0] for k in [*report.get("missing_keys", ()), *report.get("mismatched_keys", ())]]
    bad = [k for k in bad if not k.startswith("classifier.")]
    if bad:
        raise ConfigError("pretrained_path", f"{path} does not hold this model's backbone ({len(bad)} tensors missing "
                          f"or of another shape, e.g. {bad[0]})", WEIGHTS_HINT)
    with torch.no_grad():  # a fresh head, whatever the directory held
        for m in model.classifier.modules():
            model._init_weights(m)
    return model


def roberta_lora(info: DataInfo, pretrained_path: str | None = None, hub_offline: bool = True, lora: bool = True,
                 lora_r: Annotated[int, Range(1, 1 << 12)] = 16, lora_alpha: Positive = 32,
                 lora_dropout: Dropout = 0.05,
                 lora_targets: list[str] = LORA_TARGETS, dropout: Dropout | None = None) -> nn.Module:
    """The pretrained classifier for ``info`` with LoRA (see the module docstring). ``lora: false`` fine-tunes all
    weights instead. ``dropout``: override the backbone's hidden/attention dropout (None keeps its config's)."""
    if not info.num_classes:
        raise ConfigError("", "needs a dataset with class labels", "use data=glue or data=pydoc_topics")
    path = pretrained_path or info.pretrained_path
    if not path:
        raise ConfigError("pretrained_path", "is not set (RoBERTa + LoRA fine-tunes a pretrained model)", WEIGHTS_HINT)
    if not isinstance(lora, bool):
        raise ConfigError("lora", f"must be true or false, got {lora!r}", "use true (LoRA) or false (full fine-tuning)")
    model = load_backbone(path, info.num_classes, not hub.allow_fetch("model.net.hub_offline", hub_offline, lambda v: v is False))
    if info.vocab_size and info.vocab_size > model.config.vocab_size:
        raise ConfigError("pretrained_path", f"the dataset's tokenizer has {info.vocab_size} tokens, the model at "
                          f"{path} only {model.config.vocab_size} embeddings",
                          "tokenize with the model's own tokenizer (data.tokenizer_path = the model's directory)")
    if dropout is not None:
        p = float(dropout)
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = p
    fingerprint = tensors_fingerprint(model.base_model)  # the pretrained backbone, without the fresh head
    if lora:
        model = add_lora(model, *lora_args(lora_r, lora_alpha, lora_dropout, lora_targets, LORA_TARGETS))
    model.backbone_fingerprint = fingerprint
    return model
