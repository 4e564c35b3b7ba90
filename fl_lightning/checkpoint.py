"""Atomic, pickle-free checkpoints.

A checkpoint is a directory ``checkpoints/round_000006/`` holding safetensors files (global model, strategy state,
client states per process) and one JSON file (round, metric rows, totals, config, config hash). It is written to
``round_000006.tmp`` and renamed into place, so a crash never leaves a half-written checkpoint under a real name;
loading reads safetensors and JSON only, so it cannot execute code.
"""
from __future__ import annotations

import json
import os
import re
import shutil

from safetensors.torch import load_file, save_file
from torch import Tensor

_NAME = re.compile(r"^round_(\d{6})$")


def _contig(d: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in d.items()}


def save_checkpoint(ckpt_root: str, round_done: int, tensors: dict[str, dict[str, Tensor]], meta: dict, keep_last: int = 2) -> str:
    """Write ``tensors`` (file stem -> flat tensor dict) and ``meta`` atomically; prune old checkpoints."""
    os.makedirs(ckpt_root, exist_ok=True)
    final = os.path.join(ckpt_root, f"round_{round_done:06d}")
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for stem, d in tensors.items():
        save_file(_contig(d), os.path.join(tmp, f"{stem}.safetensors"))
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep_last and keep_last > 0:
        for old in list_checkpoints(ckpt_root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_root: str) -> list[str]:
    if not os.path.isdir(ckpt_root):
        return []
    names = sorted(n for n in os.listdir(ckpt_root) if _NAME.match(n))
    return [os.path.join(ckpt_root, n) for n in names]


def latest_checkpoint(ckpt_root: str) -> str | None:
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def load_checkpoint(path: str) -> tuple[dict[str, dict[str, Tensor]], dict]:
    tensors = {f[: -len(".safetensors")]: load_file(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors")}
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    return tensors, meta
