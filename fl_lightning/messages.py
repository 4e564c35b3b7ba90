"""Msg: one communicated tensor, what parts and codecs exchange (the bottom of the import graph: codecs and
strategies both import it, neither imports the other's layer)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


MODEL_KEY = "model"  # a broadcast under this key replaces the dense global model in the downlink count


@dataclass
class Msg:
    """One communicated tensor. ``tensor`` is what the receiver reconstructs (dense); ``nbits`` the exact number of
    bits that travelled (None: dense, numel × bits per element; codecs set it, see fl_lightning/codecs/);
    ``weight`` its weight in the server's streaming mean. For a broadcast, ``to`` names the recipients:
    ``"sampled"`` (this round's clients) or ``"all"`` (every client, e.g. FedSMUM's momentum update); each
    recipient is charged."""

    tensor: Tensor
    weight: float = 1.0
    nbits: int | None = None
    to: str = "sampled"

    def bits(self) -> int:
        return self.nbits if self.nbits is not None else self.tensor.numel() * self.tensor.element_size() * 8
