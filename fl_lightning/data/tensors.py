"""In-memory datasets as dicts of equally long tensors.

Every dataset in fl_lightning is a :class:`TensorSet`: a dict of tensors sharing the first dimension, the label
under ``"y"``. Vision sets hold ``{"x": uint8|float images, "y"}``; text sets ``{"input_ids", "attention_mask",
"y"}``. Keeping data as tensors lets a client's minibatch be one index operation (on the GPU when
``data.on_device`` is set) and makes augmentation a batched tensor op, which is what makes many small virtual
clients fast on one device.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import Tensor


class TensorSet:
    def __init__(self, tensors: Mapping[str, Tensor], transform: Callable[[dict, torch.Generator | None], dict] | None = None):
        lengths = {k: len(v) for k, v in tensors.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"TensorSet fields differ in length: {lengths}")
        self.tensors = dict(tensors)
        self.transform = transform  # batch -> batch, applied after indexing (augmentation, normalization)

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    @property
    def labels(self) -> Tensor:
        return self.tensors["y"]

    @property
    def device(self) -> torch.device:
        """Where the tensors are (the device with ``data.on_device``, else the CPU)."""
        return next(iter(self.tensors.values())).device

    def subset(self, idx, transform=...) -> "TensorSet":
        """The rows ``idx`` as a new set (with ``transform``, default this set's)."""
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.device)
        return TensorSet({k: v.index_select(0, idx) for k, v in self.tensors.items()},
                         self.transform if transform is ... else transform)

    def to(self, device) -> "TensorSet":
        return TensorSet({k: v.to(device) for k, v in self.tensors.items()}, self.transform)

    def batch(self, idx: Tensor, device, generator: torch.Generator | None = None,
              noise: Tensor | None = None) -> dict[str, Tensor]:
        """Gather rows ``idx`` and move them to ``device``; then apply the transform (with its randomness drawn
        ahead, ``noise``, when the transform has a ``draw``)."""
        idx = idx.to(self.device, non_blocking=True)
        out = {k: v.index_select(0, idx).to(device, non_blocking=True) for k, v in self.tensors.items()}
        if self.transform is None:
            return out
        return self.transform(out, generator) if noise is None else self.transform(out, generator, noise=noise)
