"""The checkpoint format: folder names, dtypes in client files, the version, and listing checkpoints."""
from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ..errors import ResumeError

FORMAT = 3
_NAME = re.compile(r"^round_(\d{6})$")
RETAINED = ".clients"  # suffix of a pruned checkpoint folder kept for the client files later checkpoints refer to
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_DTYPE_NAME = {v: k for k, v in DTYPES.items()}


def list_checkpoints(ckpt_root: str) -> list[str]:
    if not os.path.isdir(ckpt_root):
        return []
    return [os.path.join(ckpt_root, n) for n in sorted(n for n in os.listdir(ckpt_root) if _NAME.match(n))]


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
