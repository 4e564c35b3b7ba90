"""The checkpoint format: folder names, dtypes in client files, the version, and listing checkpoints."""
from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ..errors import ResumeError

log = logging.getLogger("fl_lightning")

FORMAT = 3
_NAME = re.compile(r"^round_(\d{6})$")
RETAINED = ".clients"  # suffix of a pruned checkpoint folder kept for the client files later checkpoints refer to
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_DTYPE_NAME = {v: k for k, v in DTYPES.items()}


_SKIPPED: set[str] = set()  # entries already reported (one line each, not one per save)


def list_checkpoints(ckpt_root: str) -> list[str]:
    """The checkpoint folders under ``ckpt_root``, oldest first. An entry with a checkpoint's name that is not a
    folder (a plain file, a dangling link) is skipped with one warning line, as a damaged checkpoint is."""
    try:
        names = sorted(n for n in os.listdir(ckpt_root) if _NAME.match(n))
    except OSError:  # no checkpoints folder yet (or not one)
        return []
    found = []
    for n in names:
        path = os.path.join(ckpt_root, n)
        if os.path.isdir(path):
            found.append(path)
        elif path not in _SKIPPED:
            _SKIPPED.add(path)
            log.warning("checkpoint %s is not a folder (a plain file or a broken link): skipped", path)
    return found


def move_aside(path: str) -> None:
    """A non-folder entry where a checkpoint folder goes is renamed ``<name>.stray`` (kept, never deleted)."""
    stray = path + ".stray"
    os.replace(path, stray)
    log.warning("%s was not a checkpoint folder: moved to %s", path, stray)


def _split(state: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors of ``state`` on the CPU and the rest."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items() if isinstance(v, Tensor)}
    return tensors, {k: v for k, v in state.items() if not isinstance(v, Tensor)}


def _nbytes(layout: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]) -> int:
    return sum(math.prod(shape) * dtype.itemsize for dtype, shape in layout.values())


def _segment(root: str, round_name: str, file: str) -> str:
    """Where a client file of checkpoint ``round_name`` is: in its folder, or in the folder pruning retained."""
    path = os.path.join(root, round_name, file)
    return path if os.path.exists(path) else os.path.join(root, round_name + RETAINED, file)


class DamagedCheckpoint(ResumeError):
    """A checkpoint whose files do not match their recorded checksums, cannot be read, or hold non-finite weights."""
