"""Msg: one communicated tensor, what parts and codecs exchange (the bottom of the import graph: codecs and
strategies both import it, neither imports the other's layer).

What a message costs, one rule for every part and codec: the bits that travel. A codec's message is charged its exact
compressed size (``nbits``); any other message its dense size, each value at its dtype's width (32 bits for a float32
or int32, 64 for a float64). A number the receiver already knows is not sent: the server knows every client's
local steps K (``fl.local_steps``, or ``fl.local_epochs`` over the client's data size, which it knows: the loop counts
them into the round's aggregate) and the round's lr, so K, K·η and the like never travel. ``nbits=0`` marks a message that does not travel: a diagnostic the method does not need (the
logged MagnitudeUniformity and PreconditionerDrift sums) or a tensor the receiver keeps itself (x^{r-1} with
``prev_model: client``). A message's ``weight`` is not charged (the server knows the clients' sample counts)."""
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
