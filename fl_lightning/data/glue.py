"""GLUE (Wang et al., "GLUE: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding", ICLR
2019, arXiv 1804.07461), the seven tasks of seed 004's Table 4 (Liu et al., "FedMuon: Accelerating Federated Learning
with Matrix Orthogonalization"): CoLA, SST-2, MRPC, QQP, QNLI, RTE, MNLI (matched). Training on the train split,
evaluation on the validation split (MNLI ``validation_matched``, or ``validation_mismatched`` with ``task: mnli_mm``),
as the paper does. Three sources (``source``):

- ``hub`` (default): the Hugging Face hub's ``nyu-mll/glue`` (each task's config: ``rte/train-*.parquet``, ...)
  from the Hugging Face cache through ``datasets`` (:mod:`fl_lightning.data.hub`: offline unless the run says
  ``download=true``, which fetches only that task's files);
- ``tsv``: a local directory in the layout of the GLUE download script (``<root>/CoLA/train.tsv``,
  ``<root>/SST-2/dev.tsv``, ...), read by hand; what a run saved before ``source`` existed read (hashed as absent);
- ``disk``: a ``datasets`` ``save_to_disk`` folder of the task's DatasetDict (``<root>/<config>``, else ``root``).

Texts are tokenized once with the model's tokenizer (``tokenizer_path``, by default ``model.net.pretrained_path``: a
folder or a hub id) to ``max_length`` with ``padding="max_length"`` (the authors' code: 128 for the pair tasks, 64
for SST-2 and CoLA) and cached as safetensors under ``cache_dir``, keyed by the tokenizer's fingerprint, the data's
fingerprint (the TSV file's bytes; the ``datasets`` fingerprint of the split) and the length. Labels follow the
Hugging Face ``datasets`` GLUE order (RTE/QNLI: entailment 0; MNLI: entailment, neutral, contradiction), so the same
examples give the same tensors from every source; unlabelled rows (``-1``, MNLI's ``-`` gold labels) are skipped.
Each task declares its official metrics, primary first (``DataInfo.metrics``): MCC for CoLA (plus accuracy, what
seed 004's table calls CoLA's number, decision 004/AMBIG-17 in docs/decisions.md), F1 and accuracy for MRPC and
QQP, accuracy for the rest.
"""
from __future__ import annotations

import csv
import glob
import os
import sys
from typing import Annotated

import torch

from ..errors import ConfigError
from ..config import OneOf, Range
from .info import DataInfo
from .tensors import TensorSet
from . import hub
from .text import cached, default_cache_dir, file_fingerprint, load_tokenizer, tokenize, tokenizer_fingerprint

# task: (folder, test file, header?, first text column, second text column or None, label column, label names,
#        metrics (primary first)); columns are header names, or indices for CoLA (no header)
TASKS = {
    "cola": ("CoLA", "dev.tsv", False, 3, None, 1, ("0", "1"), ("mcc", "acc")),
    "sst2": ("SST-2", "dev.tsv", True, "sentence", None, "label", ("0", "1"), ("acc",)),
    "mrpc": ("MRPC", "dev.tsv", True, "#1 String", "#2 String", "Quality", ("0", "1"), ("f1", "acc")),
    "qqp": ("QQP", "dev.tsv", True, "question1", "question2", "is_duplicate", ("0", "1"), ("f1", "acc")),
    "qnli": ("QNLI", "dev.tsv", True, "question", "sentence", "label", ("entailment", "not_entailment"), ("acc",)),
    "rte": ("RTE", "dev.tsv", True, "sentence1", "sentence2", "label", ("entailment", "not_entailment"), ("acc",)),
    "mnli": ("MNLI", "dev_matched.tsv", True, "sentence1", "sentence2", "gold_label",
             ("entailment", "neutral", "contradiction"), ("acc",)),
    "mnli_mm": ("MNLI", "dev_mismatched.tsv", True, "sentence1", "sentence2", "gold_label",
                ("entailment", "neutral", "contradiction"), ("acc",)),
}
# task: (hub config, test split, first text column, second text column or None) of nyu-mll/glue (train split: train)
HUB_TASKS = {
    "cola": ("cola", "validation", "sentence", None), "sst2": ("sst2", "validation", "sentence", None),
    "mrpc": ("mrpc", "validation", "sentence1", "sentence2"), "qqp": ("qqp", "validation", "question1", "question2"),
    "qnli": ("qnli", "validation", "question", "sentence"), "rte": ("rte", "validation", "sentence1", "sentence2"),
    "mnli": ("mnli", "validation_matched", "premise", "hypothesis"),
    "mnli_mm": ("mnli", "validation_mismatched", "premise", "hypothesis"),
}
HUB_REPO = "nyu-mll/glue"
SOURCES = ("hub", "tsv", "disk")
ALIASES = {"sst-2": "sst2", "sst_2": "sst2", "mnli_m": "mnli", "mnli-m": "mnli", "mnli-mm": "mnli_mm"}
SINGLE_MAX, PAIR_MAX = 64, 128  # the authors' code (seed 004's new_llm.py); not given by the paper
TOKENIZER_HINT = ("set model.net.pretrained_path to FacebookAI/roberta-base (from the Hugging Face cache; download=true "
                  "fetches it) or to a save_pretrained directory of it, or data.tokenizer_path to the tokenizer alone")


def read_tsv(path: str, header: bool, cols: tuple, label_col, labels: tuple[str, ...]) -> tuple[list, list | None, list]:
    """(first texts, second texts or None, label ids) of a GLUE TSV file; rows with a missing field or an unknown
    label (QQP has a few malformed lines, MNLI a few '-' gold labels) are skipped, as GLUE's reference loaders do."""
    if not os.path.isfile(path):
        raise ConfigError("root", f"no file {path}", "give data.root the GLUE directory (CoLA/, SST-2/, MRPC/, ... with "
                          "train.tsv and dev.tsv, as the GLUE download script writes it)")
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    index = {lab: i for i, lab in enumerate(labels)}
    a, b, y = [], [] if cols[1] is not None else None, []
    with open(path, encoding="utf-8", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if header:
            head = next(rows, [])
            try:
                idx = [head.index(c) if c is not None else None for c in cols] + [head.index(label_col)]
            except ValueError:
                raise ConfigError("root", f"{path} has columns {head[:6]}, not {[c for c in cols if c]} + {label_col!r}",
                                  "use the GLUE TSV files as the GLUE download script writes them") from None
        else:
            idx = list(cols) + [label_col]
        need = max(i for i in idx if i is not None)
        for row in rows:
            if len(row) <= need or row[idx[2]].strip() not in index:
                continue
            a.append(row[idx[0]])
            if b is not None:
                b.append(row[idx[1]])
            y.append(index[row[idx[2]].strip()])
    if not y:
        raise ConfigError("root", f"{path} holds no labelled rows", "use the GLUE TSV files (train.tsv, dev.tsv)")
    return a, b, y


def glue(task: Annotated[str, OneOf(*TASKS, *ALIASES, *map(str.upper, TASKS))] = "rte", root: str = "data/glue",
         tokenizer_path: str | None = None,
         max_length: Annotated[int | str, Range(8, 1 << 16, words=("auto",))] = "auto", cache_dir: str | None = "auto",
         hub_offline: bool = True, max_train: Annotated[int, Range(1, 1 << 40)] | None = None,
         source: Annotated[str, OneOf(*SOURCES)] = "tsv") -> tuple[TensorSet, TensorSet, DataInfo]:
    """(train, validation, info) of one GLUE task (see the module docstring). ``max_train``: keep only the first
    that many training rows (quick checks). ``hub_offline``: deprecated (``download=true``)."""
    key = ALIASES.get(str(task).lower(), str(task).lower())
    if key not in TASKS:
        raise ConfigError("task", f"unknown GLUE task {task!r}", f"use one of {', '.join(TASKS)}")
    if source not in SOURCES:
        raise ConfigError("source", f"unknown source {source!r}", f"use one of {', '.join(SOURCES)}")
    folder, test_file, header, c1, c2, lab, labels, metrics = TASKS[key]
    max_length = (PAIR_MAX if c2 is not None else SINGLE_MAX) if max_length == "auto" else int(max_length)
    fetch = hub.allow_fetch("data.hub_offline", hub_offline, lambda v: v is False)
    if source == "tsv":
        base = os.path.join(os.path.expanduser(str(root)), folder)
        if not os.path.isdir(base):
            raise ConfigError("root", f"no {folder}/ directory under {os.path.abspath(os.path.expanduser(str(root)))}",
                              f"put the GLUE task folders there ({folder}/train.tsv, {folder}/{test_file}), set "
                              "data.root, or read the hub's copy: data.source=hub")
        splits = [(split, file_fingerprint(os.path.join(base, fname)),
                   lambda p=os.path.join(base, fname): read_tsv(p, header, (c1, c2), lab, labels))
                  for split, fname in (("train", "train.tsv"), ("test", test_file))]
    else:
        splits = [(split, ds._fingerprint, lambda d=ds: read_dataset(d, key, labels))
                  for split, ds in zip(("train", "test"), hub_splits(key, source, root, fetch))]
    tok = load_tokenizer(tokenizer_path, "tokenizer_path", not fetch, TOKENIZER_HINT)
    tok_hash = tokenizer_fingerprint(tok)
    cache = default_cache_dir(cache_dir)
    sets = []
    for split, fingerprint, read in splits:
        stem = f"{key}-{split}-{fingerprint}-{tok_hash}-{max_length}"
        out = cached(cache and os.path.join(cache, "glue", stem + ".safetensors"),
                     lambda r=read: _encode(tok, *r(), max_length))
        if split == "train" and max_train:
            out = {k: v[: int(max_train)] for k, v in out.items()}
        sets.append(TensorSet(out))
    info = DataInfo(input_shape=(max_length,), num_classes=len(labels), vocab_size=len(tok),
                    tokenizer_path=os.path.expanduser(str(tokenizer_path)), metrics=metrics,
                    provenance={"data_task": key, "tokenizer_sha256": tok_hash, "data_source": source,
                                "data_fingerprint": "/".join(f for _, f, _ in splits)})
    return sets[0], sets[1], info


def hub_splits(key: str, source: str, root: str, fetch: bool):
    """(train, test) ``datasets.Dataset`` of a task: from the hub cache's ``nyu-mll/glue`` (only the task's parquet
    files; fetched with ``download=true``), or from a ``save_to_disk`` folder."""
    import datasets

    config, test_split, _, _ = HUB_TASKS[key]
    datasets.disable_progress_bars()
    if source == "disk":
        path = os.path.expanduser(str(root))
        path = os.path.join(path, config) if os.path.isdir(os.path.join(path, config)) else path
        try:
            dd = datasets.load_from_disk(path)
        except Exception as err:  # noqa: BLE001 - not a save_to_disk folder
            raise ConfigError("root", f"no datasets save_to_disk folder at {path} ({type(err).__name__}: "
                              f"{' '.join(str(err).split())[:120]})", "give data.root the folder of "
                              f"`load_dataset('{HUB_REPO}', '{config}').save_to_disk(DIR)`, or use data.source=hub") from None
        missing = [s for s in ("train", test_split) if s not in dd]
        if missing:
            raise ConfigError("root", f"{path} holds splits {list(dd)}, not {missing[0]}",
                              f"save the whole DatasetDict of {HUB_REPO} {config}")
        return dd["train"], dd[test_split]

    def files(folder: str, split: str) -> list[str]:
        return sorted(glob.glob(os.path.join(folder, config, f"{split}-*.parquet")))

    wanted = {f"{config}/{split}-*.parquet": f"the {split} split of {config}" for split in ("train", test_split)}
    snap = hub.resolve_snapshot(HUB_REPO, "source", "dataset", list(wanted), fetch, f"the GLUE task {config} of",
                                lacking=lambda p: hub.gaps(p, wanted))
    hub.quiet_telemetry()  # datasets' load counter: no socket when every file is cached (download=true or not)
    data_files = {"train": files(snap, "train"), test_split: files(snap, test_split)}
    dd = datasets.load_dataset("parquet", data_files=data_files, cache_dir=hub.datasets_cache())
    return dd["train"], dd[test_split]


def read_dataset(ds, key: str, labels: tuple[str, ...]) -> tuple[list, list | None, list]:
    """(first texts, second texts or None, label ids) of a ``datasets`` split; unlabelled rows (-1) skipped."""
    _, _, c1, c2 = HUB_TASKS[key]
    cols = [c for c in (c1, c2, "label") if c is not None]
    absent = [c for c in cols if c not in ds.column_names]
    if absent:
        raise ConfigError("source", f"the {key} data has columns {ds.column_names}, not {absent[0]!r}",
                          f"use {HUB_REPO}'s {HUB_TASKS[key][0]} files")
    rows = ds.select_columns(cols).to_dict()
    y, a, b = rows["label"], rows[c1], rows[c2] if c2 is not None else None
    keep = [i for i, v in enumerate(y) if 0 <= int(v) < len(labels)]
    return [a[i] for i in keep], None if b is None else [b[i] for i in keep], [int(y[i]) for i in keep]


def _encode(tok, first, second, y, max_length) -> dict:
    return {**tokenize(tok, first, second, max_length), "y": torch.tensor(y, dtype=torch.long)}
